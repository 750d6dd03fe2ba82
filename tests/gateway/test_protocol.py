"""Every KServe v2 call an unmodified tritonclient makes works through the gateway as it
does against Triton: HTTP and gRPC, sync and aio clients, and the same errors."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from tritonclient.utils import InferenceServerException

from converters.tiny import TINY_MODEL_NAME, TINY_WIDTH
from infergate.triton.local import LocalTriton
from tests.procs import GatewayProcess, wait_until

pytestmark = pytest.mark.integration
X = np.arange(2 * TINY_WIDTH, dtype=np.float32).reshape(2, TINY_WIDTH)


def _inputs(module: Any, x: np.ndarray = X, name: str = "x", datatype: str = "FP32") -> list:
    inp = module.InferInput(name, list(x.shape), datatype)
    if module in (httpclient, httpaio):
        inp.set_data_from_numpy(x, binary_data=True)
    else:
        inp.set_data_from_numpy(x)
    return [inp]


@pytest.fixture(params=["http", "grpc"])
def sync_client(request: pytest.FixtureRequest, gateway: GatewayProcess) -> Any:
    if request.param == "http":
        client: Any = httpclient.InferenceServerClient(gateway.http_url)
    else:
        client = grpcclient.InferenceServerClient(gateway.grpc_url)
    yield request.param, client
    client.close()


def test_gateway_answers_server_and_model_calls_when_sync_clients(sync_client: Any) -> None:
    protocol, client = sync_client
    module = httpclient if protocol == "http" else grpcclient
    assert client.is_server_live()
    assert client.is_server_ready()
    meta = client.get_server_metadata()
    assert (meta["name"] if protocol == "http" else meta.name) == "triton"
    assert client.is_model_ready(TINY_MODEL_NAME)
    assert client.is_model_ready(TINY_MODEL_NAME, "1")
    model_meta = client.get_model_metadata(TINY_MODEL_NAME)
    name = model_meta["name"] if protocol == "http" else model_meta.name
    assert name == TINY_MODEL_NAME
    config = client.get_model_config(TINY_MODEL_NAME)
    max_batch = (config["max_batch_size"] if protocol == "http"
                 else config.config.max_batch_size)
    assert max_batch == 64
    stats = client.get_inference_statistics(TINY_MODEL_NAME)
    assert stats is not None
    result = client.infer(TINY_MODEL_NAME, _inputs(module), model_version="1")
    np.testing.assert_array_equal(result.as_numpy("y"), 2 * X + 1)


def test_gateway_infers_with_json_tensors_when_http_client_sends_json(
    gateway: GatewayProcess,
) -> None:
    client = httpclient.InferenceServerClient(gateway.http_url)
    inp = httpclient.InferInput("x", list(X.shape), "FP32")
    inp.set_data_from_numpy(X, binary_data=False)
    out = httpclient.InferRequestedOutput("y", binary_data=False)
    result = client.infer(TINY_MODEL_NAME, [inp], outputs=[out])
    np.testing.assert_array_equal(result.as_numpy("y"), 2 * X + 1)
    client.close()


def test_gateway_serves_aio_clients_when_http_and_grpc(gateway: GatewayProcess) -> None:
    async def run() -> None:
        h = httpaio.InferenceServerClient(gateway.http_url)
        g = grpcaio.InferenceServerClient(gateway.grpc_url)
        try:
            assert await h.is_server_ready() and await g.is_server_ready()
            assert await h.is_model_ready(TINY_MODEL_NAME)
            assert await g.is_model_ready(TINY_MODEL_NAME)
            results = await asyncio.gather(
                *(h.infer(TINY_MODEL_NAME, _inputs(httpaio)) for _ in range(8)),
                *(g.infer(TINY_MODEL_NAME, _inputs(grpcaio)) for _ in range(8)),
            )
            for r in results:
                np.testing.assert_array_equal(r.as_numpy("y"), 2 * X + 1)
        finally:
            await h.close()
            await g.close()

    asyncio.run(run())


def test_gateway_streams_infer_responses_when_grpc_stream(gateway: GatewayProcess) -> None:
    client = grpcclient.InferenceServerClient(gateway.grpc_url)
    received: list[Any] = []
    done = __import__("threading").Event()

    def callback(result: Any, error: Any) -> None:
        received.append((result, error))
        if len(received) == 4:
            done.set()

    client.start_stream(callback=callback)
    try:
        for i in range(3):
            client.async_stream_infer(TINY_MODEL_NAME, _inputs(grpcclient, X + i),
                                      request_id=str(i))
        client.async_stream_infer("no_such_model", _inputs(grpcclient), request_id="bad")
        assert done.wait(30)
    finally:
        client.stop_stream()
        client.close()
    good = sorted((r for r, e in received if e is None), key=lambda r: r.get_response().id)
    assert [r.get_response().id for r in good] == ["0", "1", "2"]
    for i, r in enumerate(good):
        np.testing.assert_array_equal(r.as_numpy("y"), 2 * (X + i) + 1)
    errors = [e for _, e in received if e is not None]
    assert len(errors) == 1 and "no_such_model" in str(errors[0])


def test_gateway_routes_repository_calls_when_load_unload_index(
    gateway: GatewayProcess, triton: LocalTriton
) -> None:
    assert triton.endpoints is not None
    for client in (httpclient.InferenceServerClient(gateway.http_url),
                   grpcclient.InferenceServerClient(gateway.grpc_url)):
        index = client.get_model_repository_index()
        names = ({m["name"] for m in index} if isinstance(index, list)
                 else {m.name for m in index.models})
        assert TINY_MODEL_NAME in names
        client.unload_model(TINY_MODEL_NAME)
        assert not client.is_model_ready(TINY_MODEL_NAME)
        # Triton finishes an unload in the background; a load issued meanwhile returns
        # before the model is back. Wait until the index says it is gone.
        assert wait_until(lambda c=client: _state(c) == "UNAVAILABLE", 30)
        client.load_model(TINY_MODEL_NAME)
        assert client.is_model_ready(TINY_MODEL_NAME)
        client.close()
    direct = httpclient.InferenceServerClient(triton.endpoints.http_url)
    assert direct.is_model_ready(TINY_MODEL_NAME)  # the load really reached Triton
    direct.close()


def _state(client: Any) -> str:
    index = client.get_model_repository_index()
    entries = index if isinstance(index, list) else [
        {"name": m.name, "state": m.state} for m in index.models
    ]
    return next(str(e.get("state", "")) for e in entries if e["name"] == TINY_MODEL_NAME)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_gateway_refuses_shared_memory_when_registered(gateway: GatewayProcess,
                                                       protocol: str) -> None:
    client: Any = (httpclient.InferenceServerClient(gateway.http_url) if protocol == "http"
                   else grpcclient.InferenceServerClient(gateway.grpc_url))
    with pytest.raises(InferenceServerException) as info:
        client.register_system_shared_memory("region", "/shm_key", 64)
    assert "not supported through the gateway" in info.value.message()
    assert info.value.status() in ("501", "StatusCode.UNIMPLEMENTED")
    client.close()


BAD_REQUESTS: dict[str, Callable[[Any, Any], Any]] = {
    "unknown model": lambda c, m: c.infer("no_such_model", _inputs(m)),
    "unknown version": lambda c, m: c.infer(TINY_MODEL_NAME, _inputs(m), model_version="9"),
    "wrong shape": lambda c, m: c.infer(
        TINY_MODEL_NAME, _inputs(m, np.ones((1, TINY_WIDTH + 1), np.float32))),
    "wrong datatype": lambda c, m: c.infer(
        TINY_MODEL_NAME, _inputs(m, np.ones((1, TINY_WIDTH), np.int32), datatype="INT32")),
    "missing input": lambda c, m: c.infer(TINY_MODEL_NAME, _inputs(m, name="nope")),
    "metadata of unknown model": lambda c, m: c.get_model_metadata("no_such_model"),
}


def _error_of(call: Callable[[Any, Any], Any], client: Any, module: Any) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as info:
        call(client, module)
    return str(info.value.status()), info.value.message()


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_gateway_error_matches_triton_when_bad_request(
    gateway: GatewayProcess, triton: LocalTriton, case: str, protocol: str
) -> None:
    assert triton.endpoints is not None
    module: Any = httpclient if protocol == "http" else grpcclient
    target = gateway.http_url if protocol == "http" else gateway.grpc_url
    direct_url = triton.endpoints.http_url if protocol == "http" else triton.endpoints.grpc_url
    via_gateway = _error_of(BAD_REQUESTS[case], module.InferenceServerClient(target), module)
    direct = _error_of(BAD_REQUESTS[case], module.InferenceServerClient(direct_url), module)
    assert via_gateway[0] == direct[0]
    # same meaning: Triton's message, minus request ids
    assert via_gateway[1].split("] ")[-1] == direct[1].split("] ")[-1]
