"""Overload: the gateway sheds excess at once (429 + Retry-After / RESOURCE_EXHAUSTED),
admitted requests keep bounded latency, memory stays bounded; metrics show it all."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import grpc
import httpx
import numpy as np
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from converters.tiny import TINY_MODEL_NAME, TINY_WIDTH
from infergate.processes import GatewayProcess
from tests.conftest import DATA_PLANES, triton_settings
from tests.procs import run_gateway, started_triton, wait_until

pytestmark = [pytest.mark.integration]
MAX_CONCURRENCY, MAX_QUEUE = 2, 2


@pytest.fixture(scope="module", params=DATA_PLANES)
def limited_gateway(request: pytest.FixtureRequest, tiny_repo: Path,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    tmp = tmp_path_factory.mktemp(f"overload-{request.param}")
    with started_triton(triton_settings(tiny_repo, tmp, TINY_MODEL_NAME)) as triton:
        e = triton.endpoints
        assert e is not None
        config = {
            "pools": [{"name": "small", "capacity_per_member": MAX_CONCURRENCY,
                       "members": [{"host": e.host, "http_port": e.http_port,
                                    "grpc_port": e.grpc_port, "metrics_port": e.metrics_port}]}],
            "models": {TINY_MODEL_NAME: {"max_concurrency": MAX_CONCURRENCY,
                                         "max_queue": MAX_QUEUE}},
            "rate_limits": {"keys": {"limited-key": {"rate_per_s": 1, "burst": 2}}},
        }
        (tmp / "gw.yaml").write_text(yaml.safe_dump(config))
        with run_gateway(tmp / "gw.yaml", tmp, data_plane=request.param) as gw:
            yield gw


def _body() -> tuple[bytes, dict[str, str]]:
    x = np.ones((1, TINY_WIDTH), np.float32)
    header = json.dumps({"inputs": [{"name": "x", "shape": [1, TINY_WIDTH], "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}]}).encode()
    return header + x.tobytes(), {"Inference-Header-Content-Length": str(len(header))}


async def _offer(url: str, concurrency: int, seconds: float,
                 headers: dict[str, str] | None = None) -> tuple[Counter, list[float], set]:
    body, base = _body()
    statuses: Counter = Counter()
    admitted: list[float] = []
    retry_after: set = set()
    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession() as session:
        async def worker() -> None:
            while time.monotonic() < deadline:
                t0 = time.perf_counter()
                async with session.post(url, data=body, headers={**base, **(headers or {})}) as r:
                    await r.read()
                    statuses[r.status] += 1
                    if r.status == 200:
                        admitted.append(time.perf_counter() - t0)
                    elif r.status == 429:
                        retry_after.add(r.headers.get("Retry-After"))
                        await asyncio.sleep(0.002)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return statuses, admitted, retry_after


def _rss_kb(pid: int) -> int:
    """Resident memory of the gateway and every process under it (HAProxy included)."""
    total = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            total += int(line.split()[1])
    for child in _children(pid):
        total += _rss_kb(child)
    return total


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text() if (task / "children").exists() else ""
        found += [int(c) for c in text.split()]
    return found


def _metrics(gw: GatewayProcess) -> dict[str, list]:
    text = httpx.get(f"http://{gw.http_url}/metrics").text
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_gateway_sheds_excess_and_bounds_latency_when_offered_load_far_above_capacity(
    limited_gateway: GatewayProcess,
) -> None:
    url = f"http://{limited_gateway.http_url}/v2/models/{TINY_MODEL_NAME}/infer"
    calm, calm_latency, _ = asyncio.run(_offer(url, 1, 1.0))
    assert set(calm) == {200}
    rss_before = _rss_kb(limited_gateway.proc.pid)
    # 24 concurrent clients against 2 admitted + 2 queued: 6x what the gateway admits
    statuses, admitted, retry_after = asyncio.run(_offer(url, 24, 3.0))
    assert statuses[429] > 0 and statuses[200] > 0, statuses
    assert set(statuses) <= {200, 429}, statuses
    assert retry_after == {"1"}
    # an admitted request waits behind at most MAX_CONCURRENCY + MAX_QUEUE others. The
    # 95th percentile: the client's own clock counts its waits for a core, and beside
    # another test worker on two cores the Python plane's p99 (its few slowest requests)
    # once read 92 ms against this bound's 84, where it passes alone
    p95 = float(np.percentile(admitted, 95))
    assert p95 < 20 * statistics.median(calm_latency) + 0.05, (p95, statistics.median(calm_latency))
    assert _rss_kb(limited_gateway.proc.pid) - rss_before < 50_000  # < 50 MB growth

    def counted() -> tuple[float, Counter]:
        metrics = _metrics(limited_gateway)
        rejected = sum(s.value for s in metrics["infergate_rejected_requests"]
                       if s.labels["model"] == TINY_MODEL_NAME and s.name.endswith("_total"))
        by_outcome: Counter = Counter()
        for s in metrics["infergate_requests"]:
            if s.name.endswith("_total") and s.labels["model"] == TINY_MODEL_NAME:
                by_outcome[s.labels["outcome"]] += s.value
        return rejected, by_outcome

    # HAProxy's per-request lines are counted just after the answers: wait for them
    assert wait_until(lambda: counted()[0] >= statuses[429], 5), (counted(), statuses)
    rejected, by_outcome = counted()
    assert rejected == statuses[429]
    assert by_outcome["success"] >= statuses[200] and by_outcome["rejected"] == statuses[429]


def test_gateway_answers_resource_exhausted_when_grpc_overloaded(
    limited_gateway: GatewayProcess,
) -> None:
    from loadtests.bench_gateway import grpc_request_bytes

    body = grpc_request_bytes(TINY_MODEL_NAME, np.ones((1, TINY_WIDTH), np.float32), "x")

    async def run() -> Counter:
        codes: Counter = Counter()
        async with grpc.aio.insecure_channel(limited_gateway.grpc_url) as channel:
            call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")

            async def one() -> None:
                try:
                    await call(body)
                    codes["OK"] += 1
                except grpc.aio.AioRpcError as exc:
                    codes[exc.code().name] += 1
                    assert ("retry-after", "1") in tuple(exc.trailing_metadata() or ())

            await asyncio.gather(*(one() for _ in range(200)))
        return codes

    # a burst overloads the gateway only when its calls overlap there; on a host whose
    # cores are busy elsewhere they may reach it one by one (seen once in a full suite:
    # 200 answered OK): bursts until one overloads it, every answer checked each time
    for _ in range(5):
        codes = asyncio.run(run())
        assert set(codes) <= {"OK", "RESOURCE_EXHAUSTED"}
        assert codes["OK"] >= MAX_CONCURRENCY
        if codes["RESOURCE_EXHAUSTED"]:
            break
    assert codes["RESOURCE_EXHAUSTED"] > 0, codes


def test_gateway_rate_limits_per_api_key_when_bucket_empty(
    limited_gateway: GatewayProcess,
) -> None:
    url = f"http://{limited_gateway.http_url}/v2/models/{TINY_MODEL_NAME}/infer"
    body, headers = _body()
    limited = [httpx.post(url, content=body, headers={**headers, "X-API-Key": "limited-key"})
               for _ in range(4)]
    assert [r.status_code for r in limited[:2]] == [200, 200]
    assert limited[3].status_code == 429 and "rate limit" in limited[3].json()["error"]
    other = httpx.post(url, content=body, headers={**headers, "X-API-Key": "someone-else"})
    assert other.status_code == 200


def test_gateway_saturation_rises_under_load_and_falls_after(
    limited_gateway: GatewayProcess,
) -> None:
    url = f"http://{limited_gateway.http_url}/v2/models/{TINY_MODEL_NAME}/infer"

    def saturation() -> float:
        samples = _metrics(limited_gateway)["infergate_pool_saturation"]
        return next(s.value for s in samples if s.labels["pool"] == "small")

    async def sample_during_load() -> tuple[list[float], Counter]:
        # 15 instants: each may fall between two requests of a client (tiny answers in
        # about a millisecond), so a few readings can be 0 by chance. Twice the capacity
        # of clients, so that a request waits at the gateway while another is answered:
        # with two, in a full suite (the other worker taking the cores), all 15 were 0
        load = asyncio.create_task(_offer(url, 2 * MAX_CONCURRENCY, 3.2))
        readings = []
        for _ in range(15):
            await asyncio.sleep(0.2)
            readings.append(await asyncio.to_thread(saturation))
        statuses, _, _ = await load
        return readings, statuses

    during, statuses = asyncio.run(sample_during_load())
    assert max(during) >= 0.5, (during, statuses)  # at least 1 in flight of capacity 2
    # the next probe rounds see the queues drained
    assert wait_until(lambda: saturation() == 0.0, 5), saturation()
    buckets = {s.labels["le"] for s in _metrics(limited_gateway)
               ["infergate_request_duration_seconds"] if s.name.endswith("_bucket")}
    assert {"0.001", "10.0", "+Inf"} <= buckets
