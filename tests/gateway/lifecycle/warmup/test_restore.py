"""A member that comes back empty (a restarted Triton) gets the serving version loaded
and warmed before it takes traffic again."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from converters.tiny import TINY_MODEL_NAME as TINY
from infergate.triton.local import LocalTriton
from tests.conftest import triton_settings
from tests.gateway.lifecycle.conftest import bearer, lifecycle_config, stop
from tests.gateway.test_failover import member_health
from tests.procs import end_in_background, run_gateway, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_restarted_member_serves_the_serving_version_before_taking_traffic(
    two_version_repo: Path, tmp_path: Path, steady_load: Any
) -> None:
    repo = two_version_repo
    # stopped below: Triton's exit waits for the HTTP connections still open to it (the
    # gateway's idle keep-alive ones too) up to its exit timeout, 10 s; 1 s is plenty here
    a = LocalTriton(replace(triton_settings(repo, tmp_path / "a", TINY),
                            extra_args=("--exit-timeout-secs=1",)))
    b = LocalTriton(triton_settings(repo, tmp_path / "b", TINY))
    restarted: LocalTriton | None = None
    try:
        ea, eb = a.start(), b.start()
        config = lifecycle_config(tmp_path / "gateway.yaml", {"pair": [ea, eb]}, repo)
        with run_gateway(config, tmp_path) as gw:
            url = f"http://{gw.http_url}"
            resp = httpx.post(f"{url}/v1/models/{TINY}/rollback", json={"version": 1},
                              headers=bearer("admin"), timeout=60)
            assert resp.status_code == 200, resp.text
            load = steady_load(url)
            assert wait_until(lambda: load.slopes()[-1:] == [2.0], 10)  # v1 computes 2x+1

            a.stop()
            key = f"{ea.host}:{ea.grpc_port}"
            assert wait_until(lambda: member_health(gw.http_url)[key] == 0.0, 10)
            # back on the same ports with nothing loaded, as a restarted pod would be
            restarted = LocalTriton(replace(
                triton_settings(repo, tmp_path / "a2"),
                http_port=ea.http_port, grpc_port=ea.grpc_port, metrics_port=ea.metrics_port,
            ))
            restarted.start()
            assert wait_until(lambda: member_health(gw.http_url)[key] == 1.0, 30)
            ready = httpx.get(f"http://{ea.http_url}/v2/models/{TINY}/versions/1/ready")
            assert ready.status_code == 200  # the gateway reloaded the serving version
            before = len(load.answers)
            assert wait_until(lambda: len(load.answers) > before + 100, 20)
            stop(load)
            assert load.failures == []
            assert set(load.slopes()) == {2.0}
            stats = httpx.get(f"http://{ea.http_url}/v2/models/{TINY}/stats").json()
            counts = {s["version"]: s["inference_count"] for s in stats["model_stats"]}
            assert counts.get("1", 0) > 0  # the restarted member took traffic again
    finally:
        end_in_background(a, b, restarted)
