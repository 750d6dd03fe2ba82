"""gRPC adapter: ``inference.GRPCInferenceService`` (Triton's service) over the data plane.

The servicer base class, the method table and the messages come from
``tritonclient.grpc``. One thing is changed on the hot path: ``ModelInfer`` requests and
responses travel as raw bytes. The gateway reads only the model name (field 1) from the
request with a tiny wire-format scan (``gateway/policy/model_name.py``) and forwards the
bytes untouched but for fields appended at the end (the deadline as Triton's ``timeout``
parameter; during a rollout, the version it is pinned to; never to a message cut short,
which Triton is left to refuse as it does through HAProxy): decoding and
re-encoding a request with megabytes of ``raw_input_contents`` costs more than the
rest of the proxy.

One persistent channel per member: a single client connection to the gateway still
spreads its requests over every member. Triton's own status codes and messages are
relayed unchanged; connection failures become :class:`Unavailable` (so, a retry on
another member).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from gateway.auth import Scope, TokenTable
from gateway.control.fanout import fan_out, settings_members, settle
from gateway.control.model_control import ModelControl
from gateway.errors import (
    GatewayError,
    Unavailable,
    Unsupported,
    grpc_status_name,
    outcome_of_answer,
)
from gateway.policy import parse_errors
from gateway.policy.access import presented_token
from gateway.policy.deadline import triton_timeout_us
from gateway.policy.model_name import grpc_message_whole, grpc_model_name
from gateway.pools import PoolMember
from gateway.python.dataplane import DataPlane, RequestOptions
from gateway.python.streams import StreamEnd, StreamRelay
from gateway.upstream.grpc import CHANNEL_OPTIONS, SERVICE, UpstreamGRPC

SHARED_MEMORY_RPCS = (
    "SystemSharedMemoryStatus", "SystemSharedMemoryRegister", "SystemSharedMemoryUnregister",
    "CudaSharedMemoryStatus", "CudaSharedMemoryRegister", "CudaSharedMemoryUnregister",
)


def with_timeout_parameter(request: bytes, deadline_s: float) -> bytes:
    """The client's remaining deadline as Triton's ``timeout`` request parameter (µs,
    :func:`~gateway.policy.deadline.triton_timeout_us`).

    Appended on the wire without decoding: a later entry of a protobuf map field wins,
    so this sets ``parameters["timeout"]`` whatever the request carried before. Triton
    rejects a request whose queue wait exceeds it (when the model allows overrides).
    """
    extra = service_pb2.ModelInferRequest()
    extra.parameters["timeout"].int64_param = triton_timeout_us(deadline_s)
    return request + extra.SerializeToString()


class RelayedError(Exception):
    """Triton answered with an error: relay its code and message as they are."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


def _outcome(result: bytes | RelayedError) -> str:
    if isinstance(result, RelayedError):
        return outcome_of_answer(200, result.code.value[0])
    return "success"


async def _invoke(method: Callable[..., Awaitable[Any]], request: Any, timeout: float | None
                  ) -> Any:
    try:
        return await method(request, timeout=timeout)
    except grpc.aio.AioRpcError as exc:
        details = parse_errors.bounded(exc.details() or "")
        code = parse_errors.grpc_code(exc.code(), details)
        if code == grpc.StatusCode.UNAVAILABLE:  # not Triton's answer about the request
            raise Unavailable(f"member unreachable: {exc.details()}") from exc
        raise RelayedError(code, details) from exc


async def _abort(context: grpc.aio.ServicerContext, error: Exception) -> None:
    if isinstance(error, RelayedError):
        await context.abort(error.code, error.details)
    assert isinstance(error, GatewayError)
    if error.retry_after_s is not None:
        context.set_trailing_metadata((("retry-after", str(max(1, round(error.retry_after_s)))),))
    await context.abort(grpc.StatusCode[grpc_status_name(error)], error.message)


def _options(context: grpc.aio.ServicerContext) -> RequestOptions:
    metadata = dict(context.invocation_metadata() or ())
    api_key = presented_token(metadata.get)
    return RequestOptions(deadline_s=context.time_remaining(), api_key=api_key)


class GatewayServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, dataplane: DataPlane, control: ModelControl,
                 upstream: UpstreamGRPC, auth: TokenTable | None = None) -> None:
        self.dataplane = dataplane
        self.control = control
        self.upstream = upstream
        self.auth = auth or TokenTable()
        self.streams = StreamRelay(dataplane, upstream)

    def _require(self, context: Any, scope: Scope) -> RequestOptions:
        options = _options(context)
        if scope is not Scope.PREDICT or self.auth.predict_gated:
            self.auth.require(options.api_key, scope)
        return options

    # -- model calls -------------------------------------------------------------------
    async def ModelInfer(self, request: bytes, context: Any) -> bytes:  # noqa: N802
        try:
            model = grpc_model_name(request)
            options = self._require(context, Scope.PREDICT)
            version = None
            # a message cut short goes as sent: appended fields could complete it, and
            # Triton's parse error (INVALID_ARGUMENT) is the answer, as through HAProxy
            if grpc_message_whole(request):
                if options.deadline_s is not None:
                    request = with_timeout_parameter(request, options.deadline_s)
                request, version = self.dataplane.pin_grpc(model, request)  # in a rollout

            async def call(member: PoolMember) -> bytes | RelayedError:
                try:
                    return await _invoke(self.upstream.raw_infer(member), request,
                                         options.deadline_s)
                except RelayedError as relayed:
                    return relayed  # Triton's answer: counted by its code, then relayed

            result = await self.dataplane.forward(model, call, protocol="grpc",
                                                  options=options, outcome=_outcome,
                                                  version=version)
            if isinstance(result, RelayedError):
                raise result
            return result
        except (GatewayError, RelayedError) as err:
            await _abort(context, err)
            raise  # unreachable: abort raises

    async def ModelStreamInfer(  # noqa: N802
        self, request_iterator: AsyncIterator[bytes], context: Any
    ) -> AsyncIterator[bytes]:
        """Relayed to one member as a stream for its whole life (``gateway/python/streams.py``);
        messages are raw bytes. Triton's errors for single requests travel in
        ``error_message`` as Triton sends them; the stream's own end (the member's
        status, a gateway error before the stream is established) is the call's status."""
        try:
            options = self._require(context, Scope.PREDICT)
            first = await anext(aiter(request_iterator), None)
            if first is None:
                return
            model = grpc_model_name(first)
            async for item in self.streams.relay(model, first, request_iterator, options):
                if isinstance(item, StreamEnd):
                    if item.code != grpc.StatusCode.OK:
                        await context.abort(item.code, item.details)
                    return
                yield item
        except GatewayError as err:
            await _abort(context, err)

    async def _model_call(self, rpc: str, model: str, request: Any, context: Any) -> Any:
        options = _options(context)

        async def call(member: PoolMember) -> Any:
            return await _invoke(getattr(self.upstream.stub(member), rpc), request,
                                 options.deadline_s)

        try:
            self._require(context, Scope.PREDICT)
            return await self.dataplane.forward(model, call, protocol="grpc", options=options,
                                                metered=False)
        except (GatewayError, RelayedError) as err:
            await _abort(context, err)

    async def ModelReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        return await self._model_call("ModelReady", request.name, request, context)

    async def ModelMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        return await self._model_call("ModelMetadata", request.name, request, context)

    async def ModelConfig(self, request: Any, context: Any) -> Any:  # noqa: N802
        return await self._model_call("ModelConfig", request.name, request, context)

    async def ModelStatistics(self, request: Any, context: Any) -> Any:  # noqa: N802
        return await self._model_call("ModelStatistics", request.name, request, context)

    # -- server calls ------------------------------------------------------------------
    async def ServerLive(self, request: Any, context: Any) -> Any:  # noqa: N802
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        return service_pb2.ServerReadyResponse(ready=self.dataplane.state.ready())

    async def ServerMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        try:
            member = self.dataplane.state.any_member()
            return await _invoke(self.upstream.stub(member).ServerMetadata, request,
                                 context.time_remaining())
        except (GatewayError, RelayedError) as err:
            await _abort(context, err)

    # -- repository: routed to every member of the pools that own the model ----------
    async def RepositoryIndex(self, request: Any, context: Any) -> Any:  # noqa: N802
        try:
            self._require(context, Scope.ADMIN)
            answers = await self.control.index(
                lambda m: _invoke(self.upstream.stub(m).RepositoryIndex, request, None)
            )
        except (GatewayError, RelayedError) as err:
            await _abort(context, err)
        merged = service_pb2.RepositoryIndexResponse()
        seen = set()
        for answer in answers:
            for entry in answer.models:
                if (entry.name, entry.version) not in seen:
                    seen.add((entry.name, entry.version))
                    merged.models.append(entry)
        return merged

    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:  # noqa: N802
        try:
            self._require(context, Scope.ADMIN)
            await self.control.broadcast(
                request.model_name,
                lambda m: _invoke(self.upstream.stub(m).RepositoryModelLoad, request, None),
            )
            return service_pb2.RepositoryModelLoadResponse()
        except (GatewayError, RelayedError) as err:
            await _abort(context, err)

    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:  # noqa: N802
        try:
            self._require(context, Scope.ADMIN)
            await self.control.broadcast(
                request.model_name,
                lambda m: _invoke(self.upstream.stub(m).RepositoryModelUnload, request, None),
            )
            return service_pb2.RepositoryModelUnloadResponse()
        except (GatewayError, RelayedError) as err:
            await _abort(context, err)

    # -- trace and log settings: every member concerned (gateway/control/fanout.py) ----------
    async def TraceSetting(self, request: Any, context: Any) -> Any:  # noqa: N802
        return await self._settings("TraceSetting", request.model_name or None, request,
                                    context)

    async def LogSettings(self, request: Any, context: Any) -> Any:  # noqa: N802
        return await self._settings("LogSettings", None, request, context)

    async def _settings(self, rpc: str, model: str | None, request: Any, context: Any) -> Any:
        try:
            self._require(context, Scope.ADMIN)
            answers = await fan_out(
                settings_members(self.control, model),
                lambda m: _invoke(getattr(self.upstream.stub(m), rpc), request,
                                  context.time_remaining()),
            )
            return settle(answers, lambda _: None)
        except (GatewayError, RelayedError) as err:
            await _abort(context, err)


def _shared_memory(name: str) -> Callable[[Any, Any], Awaitable[Any]]:
    """No region is ever registered: status lists none, unregistering any (or all) is
    done (clients clean up defensively), registering is refused."""
    if not name.endswith("Register"):
        empty = getattr(service_pb2, f"{name}Response")

        async def answer(request: Any, context: Any) -> Any:
            return empty()

        return answer

    async def handler(request: Any, context: Any) -> Any:
        await _abort(context, Unsupported(
            f"{name}: shared memory is not supported through the gateway (the gateway and "
            "Triton do not share memory with the client); send tensors in the request"
        ))

    return handler


class _HandlerRecorder:
    """Stands in for a server to capture the method table tritonclient generates."""

    def __init__(self) -> None:
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: Any) -> None:
        self.handlers.update(handlers)


def method_handlers(servicer: GatewayServicer) -> dict[str, grpc.RpcMethodHandler]:
    recorder = _HandlerRecorder()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, recorder)
    handlers = dict(recorder.handlers)
    handlers["ModelInfer"] = grpc.unary_unary_rpc_method_handler(
        servicer.ModelInfer, request_deserializer=None, response_serializer=None
    )
    handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(
        servicer.ModelStreamInfer, request_deserializer=None, response_serializer=None
    )
    for name in SHARED_MEMORY_RPCS:
        old = handlers[name]
        handlers[name] = grpc.unary_unary_rpc_method_handler(
            _shared_memory(name),
            request_deserializer=old.request_deserializer,
            response_serializer=old.response_serializer,
        )
    return handlers


def create_grpc_server(
    dataplane: DataPlane, control: ModelControl, upstream: UpstreamGRPC, address: str,
    auth: TokenTable | None = None, max_message_bytes: int = 256 * 1024 * 1024,
) -> tuple[grpc.aio.Server, int]:
    """``max_message_bytes``: larger requests are refused by grpc-core itself with
    RESOURCE_EXHAUSTED before any handler runs."""
    server = grpc.aio.server(options=[
        *(o for o in CHANNEL_OPTIONS if o[0] != "grpc.max_receive_message_length"),
        ("grpc.so_reuseport", 1),
        ("grpc.max_receive_message_length", max_message_bytes),
    ])
    handlers = method_handlers(GatewayServicer(dataplane, control, upstream, auth))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    port = server.add_insecure_port(address)
    return server, port
