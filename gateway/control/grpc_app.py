"""The control plane's gRPC surface: every RPC of Triton's
``inference.GRPCInferenceService`` but inference's.

Server and model metadata, readiness, config and statistics (asked of one member
serving the model, :meth:`ModelControl.ask`), the repository RPCs fanned out to the
members, trace and log settings, shared memory (refused: the gateway shares none). A
data plane adds ``ModelInfer`` and ``ModelStreamInfer`` (``gateway/python/grpc_api.py``
subclasses :class:`ControlServicer`); HAProxy forwards every other RPC to the server
the assembler builds from it. Triton's own status codes and messages are relayed
unchanged; a member that cannot be reached is :class:`Unavailable`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from gateway.auth import Scope, TokenTable
from gateway.control.fanout import fan_out, settings_members, settle
from gateway.control.model_control import ModelControl
from gateway.core import Core
from gateway.errors import GatewayError, Unavailable, Unsupported, grpc_status_name
from gateway.policy import parse_errors
from gateway.policy.access import presented_token
from gateway.pools import PoolMember
from gateway.upstream.grpc import SERVICE, UpstreamGRPC, server_options

SHARED_MEMORY_RPCS = (
    "SystemSharedMemoryStatus", "SystemSharedMemoryRegister", "SystemSharedMemoryUnregister",
    "CudaSharedMemoryStatus", "CudaSharedMemoryRegister", "CudaSharedMemoryUnregister",
)


class RelayedError(Exception):
    """Triton answered with an error: relay its code and message as they are."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


async def invoke(method: Callable[..., Awaitable[Any]], request: Any, timeout: float | None
                  ) -> Any:
    try:
        return await method(request, timeout=timeout)
    except grpc.aio.AioRpcError as exc:
        details = parse_errors.bounded(exc.details() or "")
        code = grpc.StatusCode[parse_errors.grpc_code(exc.code().name, details)]
        if code == grpc.StatusCode.UNAVAILABLE:  # not Triton's answer about the request
            raise Unavailable(f"member unreachable: {exc.details()}") from exc
        raise RelayedError(code, details) from exc


async def abort(context: grpc.aio.ServicerContext, error: Exception) -> None:
    if isinstance(error, RelayedError):
        await context.abort(error.code, error.details)
    assert isinstance(error, GatewayError)
    if error.retry_after_s is not None:
        context.set_trailing_metadata((("retry-after", str(max(1, round(error.retry_after_s)))),))
    await context.abort(grpc.StatusCode[grpc_status_name(error)], error.message)


def api_key(context: grpc.aio.ServicerContext) -> str | None:
    """The API key the call presents (metadata ``x-api-key`` or a bearer token)."""
    return presented_token(dict(context.invocation_metadata() or ()).get)


class ControlServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, core: Core, control: ModelControl, upstream: UpstreamGRPC,
                 auth: TokenTable | None = None) -> None:
        self.core = core
        self.control = control
        self.upstream = upstream
        self.auth = auth or TokenTable()

    def _require(self, context: Any, scope: Scope) -> None:
        if scope is not Scope.PREDICT or self.auth.predict_gated:
            self.auth.require(api_key(context), scope)

    async def _model_call(self, rpc: str, model: str, request: Any, context: Any) -> Any:
        async def call(member: PoolMember) -> Any:
            return await invoke(getattr(self.upstream.stub(member), rpc), request,
                                 context.time_remaining())

        try:
            self._require(context, Scope.PREDICT)
            return await self.control.ask(model, call)
        except (GatewayError, RelayedError) as err:
            await abort(context, err)

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
        return service_pb2.ServerReadyResponse(ready=self.core.state.ready())

    async def ServerMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        try:
            member = self.core.state.any_member()
            return await invoke(self.upstream.stub(member).ServerMetadata, request,
                                 context.time_remaining())
        except (GatewayError, RelayedError) as err:
            await abort(context, err)

    # -- repository: routed to every member of the pools that own the model ----------
    async def RepositoryIndex(self, request: Any, context: Any) -> Any:  # noqa: N802
        try:
            self._require(context, Scope.ADMIN)
            answers = await self.control.index(
                lambda m: invoke(self.upstream.stub(m).RepositoryIndex, request, None)
            )
        except (GatewayError, RelayedError) as err:
            await abort(context, err)
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
                lambda m: invoke(self.upstream.stub(m).RepositoryModelLoad, request, None),
            )
            return service_pb2.RepositoryModelLoadResponse()
        except (GatewayError, RelayedError) as err:
            await abort(context, err)

    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:  # noqa: N802
        try:
            self._require(context, Scope.ADMIN)
            await self.control.broadcast(
                request.model_name,
                lambda m: invoke(self.upstream.stub(m).RepositoryModelUnload, request, None),
            )
            return service_pb2.RepositoryModelUnloadResponse()
        except (GatewayError, RelayedError) as err:
            await abort(context, err)

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
                lambda m: invoke(getattr(self.upstream.stub(m), rpc), request,
                                  context.time_remaining()),
            )
            return settle(answers, lambda _: None)
        except (GatewayError, RelayedError) as err:
            await abort(context, err)


def _shared_memory(name: str) -> Callable[[Any, Any], Awaitable[Any]]:
    """No region is ever registered: status lists none, unregistering any (or all) is
    done (clients clean up defensively), registering is refused."""
    if not name.endswith("Register"):
        empty = getattr(service_pb2, f"{name}Response")

        async def answer(request: Any, context: Any) -> Any:
            return empty()

        return answer

    async def handler(request: Any, context: Any) -> Any:
        await abort(context, Unsupported(
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


def method_handlers(servicer: ControlServicer) -> dict[str, grpc.RpcMethodHandler]:
    """Triton's method table over ``servicer`` (the messages as tritonclient decodes
    them), shared memory answered as the gateway does; a data plane replaces the
    inference RPCs' handlers with its own."""
    recorder = _HandlerRecorder()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, recorder)
    handlers = dict(recorder.handlers)
    for name in SHARED_MEMORY_RPCS:
        old = handlers[name]
        handlers[name] = grpc.unary_unary_rpc_method_handler(
            _shared_memory(name),
            request_deserializer=old.request_deserializer,
            response_serializer=old.response_serializer,
        )
    return handlers


NOT_THE_DATA_PLANE = ("this is the gateway's control plane: inference is served by its "
                      "data plane (HAProxy and its replicas, on the gateway's ports)")


def create_control_grpc_server(
    core: Core, control: ModelControl, upstream: UpstreamGRPC, address: str,
    auth: TokenTable | None = None, max_message_bytes: int = 256 * 1024 * 1024,
) -> tuple[grpc.aio.Server, int]:
    """The control plane's own gRPC server, with no forwarder: the repository API, trace
    and log settings (``gateway/policy/planes.py``), health and metadata; an inference
    call reaching it is refused (``UNAVAILABLE``) saying the data plane serves it."""
    server = grpc.aio.server(options=server_options(max_message_bytes))
    handlers = method_handlers(ControlServicer(core, control, upstream, auth))

    async def not_here(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAVAILABLE, NOT_THE_DATA_PLANE)

    async def not_here_stream(requests: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAVAILABLE, NOT_THE_DATA_PLANE)
        yield  # (a stream handler)

    handlers["ModelInfer"] = grpc.unary_unary_rpc_method_handler(not_here)
    handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(not_here_stream)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    return server, server.add_insecure_port(address)
