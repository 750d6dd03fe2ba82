"""Control-plane behaviour against real Triton: the batching policy applied through the
load API, pools discovered by DNS, graceful shutdown."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
import yaml
from prometheus_client.parser import text_string_to_metric_families

from converters.samples import SAMPLE_MODEL_NAME
from converters.tiny import TINY_MODEL_NAME, TINY_WIDTH
from infergate.triton.local import LocalTriton
from tests.conftest import triton_settings
from tests.procs import pools_yaml, run_gateway, started_triton, wait_until

pytestmark = pytest.mark.integration


def test_gateway_applies_batching_policy_when_slo_given(tiny_repo: Path, tmp_path: Path) -> None:
    with started_triton(triton_settings(tiny_repo, tmp_path, TINY_MODEL_NAME)) as triton:
        assert triton.endpoints is not None
        pools = pools_yaml(tmp_path / "p.yaml", {"local": [triton.endpoints]})
        with run_gateway(pools, tmp_path) as gw:
            resp = httpx.post(f"http://{gw.http_url}/v1/models/{TINY_MODEL_NAME}/batching",
                              json={"latency_slo_ms": 40}, timeout=60)
            assert resp.status_code == 200, resp.text
            decision = resp.json()
            assert 1 <= decision["batch_size"] <= 64
            assert decision["expected_latency_ms"] <= 40
            config = httpx.get(
                f"http://{triton.endpoints.http_url}/v2/models/{TINY_MODEL_NAME}/config"
            ).json()
            batching = config["dynamic_batching"]
            assert batching["max_queue_delay_microseconds"] == str(
                decision["max_queue_delay_us"]) or batching["max_queue_delay_microseconds"] == \
                decision["max_queue_delay_us"]
            assert batching["priority_levels"] in (2, "2")
            # the gateway knows the levels it gave at once (its data planes' snapshot)
            wire = httpx.get(f"http://{gw.http_url}/v1/dataplane/snapshot", timeout=10).json()
            assert [TINY_MODEL_NAME, 2] in wire["snapshot"]["levels"]
            policy = batching["default_queue_policy"]
            assert int(policy["default_timeout_microseconds"]) == 40_000
            # priority and timeout pass through to Triton as request parameters
            client = httpclient.InferenceServerClient(gw.http_url)
            inp = httpclient.InferInput("x", [1, TINY_WIDTH], "FP32")
            inp.set_data_from_numpy(np.ones((1, TINY_WIDTH), np.float32))
            result = client.infer(TINY_MODEL_NAME, [inp], priority=1, timeout=30_000)
            np.testing.assert_array_equal(result.as_numpy("y"), 3 * np.ones((1, TINY_WIDTH)))
            client.close()
            bad = httpx.post(f"http://{gw.http_url}/v1/models/{TINY_MODEL_NAME}/batching",
                             json={"latency_slo_ms": -1})
            assert bad.status_code == 422


def test_gateway_finds_members_by_dns_when_pool_declares_service_name(
    tiny_repo: Path, tmp_path: Path, data_plane: str
) -> None:
    with started_triton(triton_settings(tiny_repo, tmp_path, TINY_MODEL_NAME)) as triton:
        e = triton.endpoints
        assert e is not None
        config = {"pools": [{"name": "headless", "dns": "localhost", "dns_ports": {
            "http_port": e.http_port, "grpc_port": e.grpc_port, "metrics_port": e.metrics_port}}]}
        (tmp_path / "dns.yaml").write_text(yaml.safe_dump(config))
        with run_gateway(tmp_path / "dns.yaml", tmp_path, data_plane=data_plane) as gw:
            client = httpclient.InferenceServerClient(gw.http_url)
            assert client.is_model_ready(TINY_MODEL_NAME)
            inp = httpclient.InferInput("x", [1, TINY_WIDTH], "FP32")
            inp.set_data_from_numpy(np.ones((1, TINY_WIDTH), np.float32))
            # inference too: on HAProxy the member found by DNS joined by a reload
            assert wait_until(lambda: _infers(client, inp), 10)
            client.close()


def _infers(client: httpclient.InferenceServerClient, inp: httpclient.InferInput) -> bool:
    try:
        return client.infer(TINY_MODEL_NAME, [inp]).as_numpy("y") is not None
    except Exception:  # noqa: BLE001 - not routable yet
        return False


def _in_flight(metrics_text: str) -> float:
    return sum(s.value for f in text_string_to_metric_families(metrics_text)
               if f.name == "infergate_in_flight_requests" for s in f.samples)


def test_gateway_drains_in_flight_requests_when_sigterm(triton: LocalTriton,
                                                         tmp_path: Path, data_plane: str) -> None:
    assert triton.endpoints is not None
    pools = pools_yaml(tmp_path / "p.yaml", {"local": [triton.endpoints]})
    x = np.random.default_rng(0).normal(size=(32, 3, 224, 224)).astype(np.float32)

    async def scenario(gw_http: str, terminate: object) -> tuple[list[int], bool]:
        client = httpaio.InferenceServerClient(gw_http)
        inp = httpaio.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        calls = [asyncio.create_task(client.infer(SAMPLE_MODEL_NAME, [inp])) for _ in range(3)]
        async with httpx.AsyncClient() as h:
            for _ in range(200):  # until the gateway reports them in flight (bounded)
                text = (await h.get(f"http://{gw_http}/metrics")).text
                if _in_flight(text) >= 1:
                    break
                await asyncio.sleep(0.05)
        terminate()  # type: ignore[operator]
        async with httpx.AsyncClient() as h:
            ready = 200
            for _ in range(50):  # readiness turns false within a second of SIGTERM
                ready = (await h.get(f"http://{gw_http}/v2/health/ready")).status_code
                if ready == 503:
                    break
                await asyncio.sleep(0.02)
        results = await asyncio.gather(*calls, return_exceptions=True)
        await client.close()
        shapes = [r.as_numpy("logits").shape[0] for r in results if not isinstance(r, Exception)]
        return shapes, ready == 503

    with run_gateway(pools, tmp_path, data_plane=data_plane) as gw:
        started = time.monotonic()
        shapes, not_ready = asyncio.run(
            scenario(gw.http_url, lambda: gw.proc.send_signal(signal.SIGTERM))
        )
        assert not_ready, "readiness must turn false as soon as draining starts"
        assert shapes == [32, 32, 32], "in-flight requests finish during the drain"
        assert wait_until(lambda: gw.proc.poll() is not None, 15)
        assert gw.proc.returncode == 0
        assert time.monotonic() - started < 15
