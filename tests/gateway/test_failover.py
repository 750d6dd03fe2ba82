"""A pool of two real Triton members: kill -9 one under steady load, lose nothing; the
member is ejected and rejoins when restarted."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc.aio as grpcaio
import tritonclient.http.aio as httpaio
from prometheus_client.parser import text_string_to_metric_families

from converters.tiny import TINY_MODEL_NAME, TINY_WIDTH
from infergate.triton.local import LocalTriton
from tests.conftest import triton_settings
from tests.procs import end_in_background, pools_yaml, run_gateway, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def member_health(http_url: str) -> dict[str, float]:
    text = httpx.get(f"http://{http_url}/metrics").text
    return {
        s.labels["member"]: s.value
        for f in text_string_to_metric_families(text) if f.name == "infergate_member_healthy"
        for s in f.samples
    }


async def steady_load(http_url: str, grpc_url: str, seconds: float,
                      on_tick: list) -> tuple[int, list[str]]:
    x = np.ones((1, TINY_WIDTH), np.float32)
    ok, failures = 0, []
    deadline = time.monotonic() + seconds

    async def worker(protocol: str) -> None:
        nonlocal ok
        module = httpaio if protocol == "http" else grpcaio
        client = module.InferenceServerClient(http_url if protocol == "http" else grpc_url)
        inp = module.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        try:
            while time.monotonic() < deadline:
                try:
                    result = await client.infer(TINY_MODEL_NAME, [inp])
                    assert np.array_equal(result.as_numpy("y"), 2 * x + 1)
                    ok += 1
                except Exception as exc:  # noqa: BLE001 - every failure is counted
                    failures.append(f"{protocol}: {exc}")
                await asyncio.sleep(0.005)
        finally:
            await client.close()

    async def ticker() -> None:
        while on_tick and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            if on_tick and time.monotonic() > on_tick[0][0]:
                _, action = on_tick.pop(0)
                await asyncio.to_thread(action)

    await asyncio.gather(*(worker(p) for p in ("http", "grpc", "http", "grpc")), ticker())
    return ok, failures


def test_gateway_loses_no_request_when_member_killed_and_rejoins_when_restarted(
    tiny_repo: Path, tmp_path: Path, data_plane: str
) -> None:
    a = LocalTriton(triton_settings(tiny_repo, tmp_path / "a", TINY_MODEL_NAME))
    b = LocalTriton(triton_settings(tiny_repo, tmp_path / "b", TINY_MODEL_NAME))
    restarted: LocalTriton | None = None
    try:
        ea, eb = a.start(), b.start()
        pools = pools_yaml(tmp_path / "pools.yaml", {"pair": [ea, eb]})
        with run_gateway(pools, tmp_path, data_plane=data_plane) as gw:
            assert set(member_health(gw.http_url).values()) == {1.0}
            kill_at = time.monotonic() + 1.5
            schedule = [(kill_at, lambda: os.kill(a.pid or 0, signal.SIGKILL))]
            ok, failures = asyncio.run(steady_load(gw.http_url, gw.grpc_url, 4.0, schedule))
            assert failures == [] and ok > 100
            killed_key = f"{ea.host}:{ea.grpc_port}"
            assert wait_until(lambda: member_health(gw.http_url)[killed_key] == 0.0, 5)

            a.stop()  # reap the killed server's leftovers
            restarted = LocalTriton(replace(
                triton_settings(tiny_repo, tmp_path / "a2", TINY_MODEL_NAME),
                http_port=ea.http_port, grpc_port=ea.grpc_port, metrics_port=ea.metrics_port,
            ))
            restarted.start()
            assert wait_until(lambda: member_health(gw.http_url)[killed_key] == 1.0, 10)
            ok, failures = asyncio.run(steady_load(gw.http_url, gw.grpc_url, 2.0, []))
            assert failures == []
            stats = httpx.get(f"http://{ea.http_url}/v2/models/{TINY_MODEL_NAME}/stats").json()
            assert stats["model_stats"][0]["inference_count"] > 0  # traffic reached it again
    finally:
        end_in_background(a, b, restarted)
