"""A request's class reaches Triton as its priority level, on both data planes
(gateway/policy/triton_priority.py; HAProxy's Lua filters, the Python plane's own),
over HTTP with a JSON body, HTTP with binary tensors and gRPC.

The model has three levels (the last its default) and a dynamic batcher that holds a
batch for ``HOLD_S`` unless it fills (64 rows). Two sheddable requests of 32 and 31
rows wait in Triton; a critical one of 2 rows then makes 65: Triton's batcher takes the
highest levels first, so the batch it runs at once is the critical request and the first
sheddable one, and the second sheddable one still waits. Without levels it would be the
two sheddable ones (63 rows), and the critical request would wait. Every client asks a
priority of its own, the opposite of its class's: the gateway's level replaces it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import yaml

from converters.tiny import TINY_WIDTH, build_tiny_model
from infergate.processes import GatewayProcess
from infergate.triton.local import LocalTriton
from tests.conftest import DATA_PLANES, triton_settings
from tests.gateway.test_tenancy import _held, _release
from tests.procs import run_gateway, started_triton, wait_until

pytestmark = [pytest.mark.integration]
MODEL, HOLD_S = "leveled", 8.0
BATCH, PAY = "batch-key-0123456789", "pay-key-0123456789"
TENANCY = {
    "refuse_at": {"sheddable": 8, "standard": 9, "critical": 10},
    "tenants": [{"name": "batch", "priority": "sheddable", "keys": [BATCH]},
                {"name": "pay", "priority": "critical", "keys": [PAY]}],
}
# what each tenant's client asks for itself (the gateway's level replaces it)
OWN = {BATCH: 1, PAY: 3}


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTriton]:
    tmp = tmp_path_factory.mktemp("priority-triton")
    repo = tmp / "model_repo"
    build_tiny_model(repo, MODEL, max_queue_delay_us=int(HOLD_S * 1e6), priority_levels=3)
    with started_triton(triton_settings(repo, tmp, MODEL)) as server:
        yield server


@pytest.fixture(scope="module", params=DATA_PLANES)
def gateway(request: pytest.FixtureRequest, triton: LocalTriton,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    tmp = tmp_path_factory.mktemp(f"priority-{request.param}")
    e = triton.endpoints
    assert e is not None
    # a pool serving "*": the model has no route of its own, its levels reach HAProxy still
    config = {"pools": [{"name": "p", "models": ["*"], "capacity_per_member": 8,
                         "members": [{"host": "127.0.0.1", "http_port": e.http_port,
                                      "grpc_port": e.grpc_port,
                                      "metrics_port": e.metrics_port}]}]}
    (tmp / "gw.yaml").write_text(yaml.safe_dump(config))
    (tmp / "tenants.yaml").write_text(yaml.safe_dump(TENANCY))
    with run_gateway(tmp / "gw.yaml", tmp, "--tenants", str(tmp / "tenants.yaml"),
                     data_plane=request.param) as gw:
        def levels_known() -> bool:
            answer = httpx.get(f"http://{gw.http_url}/v1/tenants", timeout=5)
            return answer.json().get("model_levels", {}).get(MODEL) == {
                "critical": 1, "standard": 2, "sheddable": 3}
        # the probes read the model's config; every data plane has it once the gateway says
        assert wait_until(levels_known, 30), httpx.get(f"http://{gw.http_url}/v1/tenants").text
        yield gw


def _rows(rows: int) -> np.ndarray:
    return np.ones((rows, TINY_WIDTH), np.float32)


def _post(gw: GatewayProcess, key: str, body: dict[str, object]) -> dict[str, object]:
    answer = httpx.post(f"http://{gw.http_url}/v2/models/{MODEL}/infer",
                        content=json.dumps(body), headers={"x-api-key": key}, timeout=60)
    assert answer.status_code == 200, answer.text
    out: dict[str, object] = answer.json()
    return out


def _inputs(rows: int) -> list[dict[str, object]]:
    return [{"name": "x", "shape": [rows, TINY_WIDTH], "datatype": "FP32",
             "data": _rows(rows).ravel().tolist()}]


def _rows_of(answer: dict[str, object]) -> int:
    outputs = answer["outputs"]
    assert isinstance(outputs, list)
    return len(outputs[0]["data"]) // TINY_WIDTH


def _json(gw: GatewayProcess, key: str, rows: int) -> int:
    """The client's own ``parameters`` first, its ``priority`` among them."""
    return _rows_of(_post(gw, key, {
        "parameters": {"priority": OWN[key], "binary_data_output": False},
        "inputs": _inputs(rows)}))


def _json_bare(gw: GatewayProcess, key: str, rows: int) -> int:
    """No ``parameters`` at all: the filter adds the object."""
    return _rows_of(_post(gw, key, {"inputs": _inputs(rows)}))


def _json_late(gw: GatewayProcess, key: str, rows: int) -> int:
    """An empty ``parameters`` object last, after a 40 KB ``id`` (HAProxy reads the body in
    several chunks) whose text has quotes, backslashes and braces that look like keys."""
    tricky = '\\"}, {\\"parameters\\": {\\"priority\\": 9}' + "x" * 40_000
    answer = _post(gw, key, {"id": tricky, "inputs": _inputs(rows), "parameters": {}})
    assert answer["id"] == tricky
    return _rows_of(answer)


def _binary(gw: GatewayProcess, key: str, rows: int) -> int:
    client = httpclient.InferenceServerClient(gw.http_url, network_timeout=60)
    try:
        x = httpclient.InferInput("x", [rows, TINY_WIDTH], "FP32")
        x.set_data_from_numpy(_rows(rows), binary_data=True)
        result = client.infer(MODEL, [x], priority=OWN[key], headers={"x-api-key": key})
        return int(result.as_numpy("y").shape[0])
    finally:
        client.close()


def _grpc(gw: GatewayProcess, key: str, rows: int) -> int:
    client = grpcclient.InferenceServerClient(gw.grpc_url)
    try:
        x = grpcclient.InferInput("x", [rows, TINY_WIDTH], "FP32")
        x.set_data_from_numpy(_rows(rows))
        result = client.infer(MODEL, [x], priority=OWN[key], headers={"x-api-key": key},
                              client_timeout=60)
        return int(result.as_numpy("y").shape[0])
    finally:
        client.close()


Send = Callable[[GatewayProcess, str, int], int]


@pytest.mark.parametrize(("body", "status", "error"), [
    (b"", 400, "input byte size mismatch"),  # nothing to put a level in: no length raised
    (b'{"inputs": [', 400, "failed to parse the request JSON"),
    (b"[1, 2]", 400, "Unable to parse 'inputs'"),
], ids=["empty", "cut", "array"])
def test_bodies_without_a_place_for_the_level_are_answered_as_triton_answers_them(
        gateway: GatewayProcess, body: bytes, status: int, error: str) -> None:
    """A critical request whose body has no JSON object for the level: Triton's own
    answer (400: its parse error), quickly, never a request waiting for bytes that
    the lengths promised."""
    answer = httpx.post(f"http://{gateway.http_url}/v2/models/{MODEL}/infer", content=body,
                        headers={"x-api-key": PAY}, timeout=10)
    assert answer.status_code == status, answer.text
    assert error in answer.json()["error"], answer.text


@pytest.mark.parametrize("send", [_json, _json_bare, _json_late, _binary, _grpc],
                         ids=["json", "json-bare", "json-late", "binary", "grpc"])
async def test_the_critical_request_joins_the_batch_before_the_sheddable_one_queued_first(
        gateway: GatewayProcess, triton: LocalTriton, send: Send) -> None:
    def sent(key: str, rows: int) -> asyncio.Task[int]:
        return asyncio.ensure_future(asyncio.to_thread(send, gateway, key, rows))

    first = sent(BATCH, 32)
    await _held(triton, MODEL, [first])  # type: ignore[list-item]
    second = sent(BATCH, 31)
    await _held(triton, MODEL, [first, second])  # type: ignore[list-item]
    critical = sent(PAY, 2)
    done, _ = await asyncio.wait([critical], timeout=HOLD_S / 2)
    assert done, "the critical request waited in Triton: its level did not reach it"
    assert await critical == 2 and await first == 32
    assert not second.done()  # the sheddable one left out of the batch still waits
    await _release(triton, MODEL, [second])  # type: ignore[list-item]
    assert await second == 31
