"""gRPC adapter: ``inference.GRPCInferenceService`` (Triton's service) over the data plane.

The servicer base class and messages come from ``tritonclient.grpc``. Model calls are
forwarded on one persistent channel per member, so a single client connection to the
gateway still spreads its requests over every member. Triton's own status codes and
messages are relayed unchanged; connection failures become :class:`Unavailable` (and
so a retry on another member).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from gateway.dataplane import DataPlane
from gateway.errors import GatewayError, Unavailable, grpc_status_name
from gateway.pools import PoolMember

CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
    ("grpc.keepalive_time_ms", 30_000),
]


class UpstreamGRPC:
    """One persistent aio channel and stub per member."""

    def __init__(self) -> None:
        self._stubs: dict[str, service_pb2_grpc.GRPCInferenceServiceStub] = {}
        self._channels: list[grpc.aio.Channel] = []

    def stub(self, member: PoolMember) -> service_pb2_grpc.GRPCInferenceServiceStub:
        stub = self._stubs.get(member.key)
        if stub is None:
            target = f"{member.spec.host}:{member.spec.grpc_port}"
            channel = grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)
            self._channels.append(channel)
            stub = self._stubs[member.key] = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        return stub

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()


class RelayedError(Exception):
    """Triton answered with an error: relay its code and message as they are."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


async def _invoke(method: Callable[..., Awaitable[Any]], request: Any, context: Any) -> Any:
    timeout = context.time_remaining() if context is not None else None
    try:
        return await method(request, timeout=timeout)
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.UNAVAILABLE:
            raise Unavailable(f"member unreachable: {exc.details()}") from exc
        raise RelayedError(exc.code(), exc.details() or "") from exc


class GatewayServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, dataplane: DataPlane, upstream: UpstreamGRPC) -> None:
        self.dataplane = dataplane
        self.upstream = upstream

    async def _model_call(self, rpc: str, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def call(member: PoolMember) -> Any:
            return await _invoke(getattr(self.upstream.stub(member), rpc), request, context)

        try:
            return await self.dataplane.forward(request.name if rpc != "ModelInfer"
                                                else request.model_name, call, protocol="grpc")
        except GatewayError as err:
            await _abort(context, err)
        except RelayedError as err:
            await context.abort(err.code, err.details)

    async def ServerLive(self, request: Any, context: Any) -> Any:  # noqa: N802
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        return service_pb2.ServerReadyResponse(ready=self.dataplane.ready())

    async def ServerMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        try:
            member = self.dataplane.any_member()
            return await _invoke(self.upstream.stub(member).ServerMetadata, request, context)
        except GatewayError as err:
            await _abort(context, err)
        except RelayedError as err:
            await context.abort(err.code, err.details)

    async def ModelReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        return await self._model_call("ModelReady", request, context)

    async def ModelMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        return await self._model_call("ModelMetadata", request, context)

    async def ModelConfig(self, request: Any, context: Any) -> Any:  # noqa: N802
        return await self._model_call("ModelConfig", request, context)

    async def ModelStatistics(self, request: Any, context: Any) -> Any:  # noqa: N802
        return await self._model_call("ModelStatistics", request, context)

    async def ModelInfer(self, request: Any, context: Any) -> Any:  # noqa: N802
        return await self._model_call("ModelInfer", request, context)


async def _abort(context: grpc.aio.ServicerContext, error: GatewayError) -> None:
    if error.retry_after_s is not None:
        context.set_trailing_metadata((("retry-after", str(max(1, round(error.retry_after_s)))),))
    await context.abort(grpc.StatusCode[grpc_status_name(error)], error.message)


def create_grpc_server(
    dataplane: DataPlane, upstream: UpstreamGRPC, address: str
) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server(options=CHANNEL_OPTIONS)
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(
        GatewayServicer(dataplane, upstream), server
    )
    port = server.add_insecure_port(address)
    return server, port
