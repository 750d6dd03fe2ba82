"""One error table, two transports: every GatewayError maps to the same HTTP status and
gRPC code through both adapters (in-process: ASGI transport, loopback gRPC server)."""

from __future__ import annotations

import asyncio
from typing import Any
from unittest.mock import create_autospec

import grpc
import httpx
import pytest

from gateway import errors
from gateway.config import GatewayConfig
from gateway.config.pools import MemberSpec, PoolSpec
from gateway.control.model_control import ModelControl
from gateway.python.forwarder import Forwarder
from gateway.python.grpc_api import create_grpc_server
from gateway.upstream.grpc import SERVICE, UpstreamGRPC
from gateway.upstream.http import UpstreamHTTP
from gateway.upstream.triton import MemberAdmin
from tests.gateway.conftest import gateway_app

ALL_ERRORS = [errors.GatewayError, *errors.GatewayError.__subclasses__()]
# the canonical HTTP <-> gRPC correspondence (grpc-gateway / Google API design)
CANONICAL = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
             404: "NOT_FOUND", 409: "ABORTED", 413: "RESOURCE_EXHAUSTED",
             429: "RESOURCE_EXHAUSTED", 500: "INTERNAL",
             501: "UNIMPLEMENTED", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}


def _make(cls: type[errors.GatewayError]) -> errors.GatewayError:
    return cls(f"boom from {cls.__name__}")


def _dataplane() -> Forwarder:
    config = GatewayConfig(pools=(PoolSpec(name="p", members=(MemberSpec(),)),))
    return Forwarder.for_config(config)


@pytest.mark.parametrize("cls", ALL_ERRORS, ids=lambda c: c.__name__)
def test_error_table_maps_every_error_to_canonical_pair(cls: type[errors.GatewayError]) -> None:
    error = _make(cls)
    assert CANONICAL[errors.http_status(error)] == errors.grpc_status_name(error)


@pytest.mark.parametrize("cls", ALL_ERRORS, ids=lambda c: c.__name__)
def test_error_reaches_http_and_grpc_clients_with_table_codes(
    cls: type[errors.GatewayError],
) -> None:
    error = _make(cls)

    async def failing(*args: Any, **kwargs: Any) -> Any:
        raise error

    async def run() -> tuple[int, str, str, grpc.StatusCode, str]:
        dataplane = _dataplane()
        upstream_http = create_autospec(UpstreamHTTP, instance=True)
        upstream_http.request.side_effect = failing
        upstream_grpc = create_autospec(UpstreamGRPC, instance=True)
        upstream_grpc.raw_infer.return_value = failing
        control = ModelControl(
        dataplane.core, MemberAdmin(create_autospec(httpx.AsyncClient, instance=True)))
        app = gateway_app(dataplane, control, upstream_http)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://gw") as client:
            resp = await client.post("/v2/models/m/infer", content=b"{}")
        server, port = create_grpc_server(dataplane, control, upstream_grpc, "127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                call = channel.unary_unary(f"/{SERVICE}/ModelInfer")
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await call(b"\x0a\x01m")  # ModelInferRequest(model_name="m")
        finally:
            await server.stop(None)
        return (resp.status_code, resp.json()["error"], resp.headers.get("retry-after", ""),
                info.value.code(), info.value.details() or "")

    status, message, retry_after, code, details = asyncio.run(run())
    assert status == errors.http_status(error)
    assert code.name == errors.grpc_status_name(error)
    if cls is errors.Unavailable:
        # a connection failure ejects the member, so the second transport finds none
        assert "'m'" in message and "'m'" in details
    else:
        assert message == details == error.message
    assert bool(retry_after) == (error.retry_after_s is not None)

