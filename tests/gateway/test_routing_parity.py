"""One routing rule on both planes (``gateway/policy/routing.py``): the same skewed load
through HAProxy and through the Python forwarder spreads alike across members.

The skew: a pool of two members serving the same model, one of them slow (a matrix
product of its own per batch, about 20 ms) and one fast (about 1 ms). Six clients send
back to back. Least-loaded routing (in flight + 1 over a weight that halves per request
queued in Triton) keeps most requests on the fast member; random or round-robin
routing would give each half. The share each member served is read from Triton's own
statistics, not from the gateway.

Tolerance: the fast member's share on one plane is within 0.15 of the other's, and
above 0.6 on both (half would be no routing rule at all). The planes differ in what
the rule's docstring says HAProxy approximates (its weights move once per probe round;
its ties are broken in its own order).
"""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import pytest
import yaml

from converters.tiny import TINY_MODEL_NAME as TINY
from converters.tiny import TINY_WIDTH, build_tiny_model
from infergate.triton.local import LocalTriton, TritonEndpoints
from tests.conftest import triton_settings
from tests.procs import end_in_background, run_gateway

pytestmark = pytest.mark.integration

CLIENTS = 6
REQUESTS_PER_CLIENT = 50
SLOW_WORK = 1200  # converters.tiny: about 16-20 ms per batch on these cores
TOLERANCE = 0.15
BODY = {"inputs": [{"name": "x", "shape": [1, TINY_WIDTH], "datatype": "FP32",
                    "data": [1.0] * TINY_WIDTH}]}


def served(member: TritonEndpoints) -> int:
    stats = httpx.get(f"http://{member.http_url}/v2/models/{TINY}/stats").json()
    return sum(s["inference_count"] for s in stats["model_stats"])


def send_load(url: str) -> list[int]:
    statuses: list[int] = []

    def client() -> None:
        with httpx.Client(timeout=30, trust_env=False) as http:
            for _ in range(REQUESTS_PER_CLIENT):
                statuses.append(http.post(f"{url}/v2/models/{TINY}/infer", json=BODY).status_code)

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return statuses


def fast_share(plane: str, slow: TritonEndpoints, fast: TritonEndpoints, tmp_path: Path) -> float:
    config = tmp_path / f"gateway-{plane}.yaml"
    config.write_text(yaml.safe_dump({"pools": [{
        "name": "p", "capacity_per_member": 64,
        "members": [{"host": m.host, "http_port": m.http_port, "grpc_port": m.grpc_port,
                     "metrics_port": m.metrics_port} for m in (slow, fast)],
    }]}))
    before = served(slow), served(fast)
    with run_gateway(config, tmp_path, data_plane=plane) as gw:
        statuses = send_load(f"http://{gw.http_url}")
    assert statuses == [200] * CLIENTS * REQUESTS_PER_CLIENT
    on_slow, on_fast = served(slow) - before[0], served(fast) - before[1]
    assert on_slow + on_fast == CLIENTS * REQUESTS_PER_CLIENT
    return on_fast / (on_slow + on_fast)


def test_both_planes_spread_a_skewed_load_alike_across_members(tmp_path: Path) -> None:
    slow_repo, fast_repo = tmp_path / "slow" / "repo", tmp_path / "fast" / "repo"
    build_tiny_model(slow_repo, work=SLOW_WORK)
    build_tiny_model(fast_repo)
    slow_server = LocalTriton(triton_settings(slow_repo, tmp_path / "slow", TINY))
    fast_server = LocalTriton(triton_settings(fast_repo, tmp_path / "fast", TINY))
    try:
        slow, fast = slow_server.start(), fast_server.start()
        shares = {plane: fast_share(plane, slow, fast, tmp_path)
                  for plane in ("haproxy", "python")}
    finally:
        end_in_background(slow_server, fast_server)
    assert min(shares.values()) > 0.6, shares
    assert abs(shares["haproxy"] - shares["python"]) <= TOLERANCE, shares
