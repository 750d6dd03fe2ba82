"""Both client families work against the gateway, on both data planes: KServe's Python
SDK (it reads a JSON body from the health calls) and tritonclient's defensive
shared-memory clean-up; and a request Triton cannot parse is the client's mistake
(400 / INVALID_ARGUMENT with Triton's message), not Triton's 500 / INTERNAL."""

from __future__ import annotations

import base64
import json
import subprocess
from typing import Any

import grpc
import httpx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from converters.tiny import TINY_MODEL_NAME, TINY_WIDTH
from tests.procs import ROOT, GatewayProcess

pytestmark = pytest.mark.integration
KSERVE_PYTHON = ROOT / ".venv-kserve" / "bin" / "python"
KSERVE_PROBE = """
import asyncio, json, sys
from kserve import InferenceRESTClient, RESTConfig

async def main(url):
    client = InferenceRESTClient(RESTConfig(protocol="v2", timeout=10))
    try:
        print(json.dumps({"live": await client.is_server_live(url),
                          "ready": await client.is_server_ready(url)}))
    finally:
        await client.close()

asyncio.run(main(sys.argv[1]))
"""


def test_kserve_sdk_sees_gateway_live_and_ready(gateway: GatewayProcess) -> None:
    assert KSERVE_PYTHON.exists(), "no KServe SDK environment: make .venv-kserve/.installed"
    out = subprocess.run([str(KSERVE_PYTHON), "-c", KSERVE_PROBE, f"http://{gateway.http_url}"],
                         capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"live": True, "ready": True}


def test_health_answers_json_bodies_with_unchanged_status(gateway: GatewayProcess) -> None:
    live = httpx.get(f"http://{gateway.http_url}/v2/health/live")
    ready = httpx.get(f"http://{gateway.http_url}/v2/health/ready")
    assert (live.status_code, live.json()) == (200, {"live": True})
    assert (ready.status_code, ready.json()) == (200, {"ready": True})
    assert httpclient.InferenceServerClient(gateway.http_url).is_server_live()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_shared_memory_cleanup_succeeds_when_nothing_registered(
    gateway: GatewayProcess, protocol: str,
) -> None:
    client: Any = (httpclient.InferenceServerClient(gateway.http_url) if protocol == "http"
                   else grpcclient.InferenceServerClient(gateway.grpc_url))
    try:
        client.unregister_system_shared_memory()
        client.unregister_system_shared_memory("region")
        client.unregister_cuda_shared_memory()
        client.unregister_cuda_shared_memory("region")
        system, cuda = (client.get_system_shared_memory_status(),
                        client.get_cuda_shared_memory_status())
        if protocol == "http":
            assert (system, cuda) == ([], [])
        else:
            assert (len(system.regions), len(cuda.regions)) == (0, 0)
        with pytest.raises(InferenceServerException) as info:
            client.register_cuda_shared_memory("region", base64.b64encode(b"handle"), 0, 64)
        assert info.value.status() in ("501", "StatusCode.UNIMPLEMENTED")
    finally:
        client.close()


ONE_ROW = [1.0] * TINY_WIDTH
UNPARSEABLE_JSON = {
    "not json": b"{not json",
    "output name an object": json.dumps({
        "inputs": [{"name": "x", "shape": [1, TINY_WIDTH], "datatype": "FP32",
                    "data": ONE_ROW}],
        "outputs": [{"name": {"a": 1}}]}).encode(),
    "truncated": b'{"inputs": [{"name": "x", "shape": [1, 16], "datat',
    # Triton looks the key up cut at its NUL: 500 "parameter key 'a' was not found"
    "parameter key with a NUL": json.dumps({
        "parameters": {"a\u0000b": 1},
        "inputs": [{"name": "x", "shape": [1, TINY_WIDTH], "datatype": "FP32",
                    "data": ONE_ROW}]}).encode(),
}


@pytest.mark.parametrize("case", sorted(UNPARSEABLE_JSON))
def test_http_infer_answers_400_when_triton_cannot_parse_the_body(
    gateway: GatewayProcess, case: str,
) -> None:
    resp = httpx.post(f"http://{gateway.http_url}/v2/models/{TINY_MODEL_NAME}/infer",
                      content=UNPARSEABLE_JSON[case])
    assert resp.status_code == 400, resp.text
    assert "parse" in resp.json()["error"] or "parameter key" in resp.json()["error"]


UNPARSEABLE_GRPC = {
    "garbage after the name": b"\x0a\x04tiny\xff\xff\xff",
    "model name not UTF-8": b"\x0a\x02\xff\xfe",
    "truncated input": b"\x0a\x04tiny\x1a\x10\x0a",
    "end-group wire type": b"\x0a\x04tiny\x0f",
}


@pytest.mark.parametrize("case", sorted(UNPARSEABLE_GRPC))
def test_grpc_infer_answers_invalid_argument_when_the_message_does_not_parse(
    gateway: GatewayProcess, case: str,
) -> None:
    with grpc.insecure_channel(gateway.grpc_url) as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as info:
            infer(UNPARSEABLE_GRPC[case], timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
