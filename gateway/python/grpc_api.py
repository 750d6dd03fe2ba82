"""The Python data plane's gRPC surface: ``ModelInfer`` and ``ModelStreamInfer`` of
Triton's ``inference.GRPCInferenceService`` on the forwarder; every other RPC is the
control plane's (:class:`gateway.control.grpc_app.ControlServicer`, subclassed here).

The method table and the messages come from ``tritonclient.grpc``. One thing is changed
on the hot path: ``ModelInfer`` requests and
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

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
from tritonclient.grpc import service_pb2

from gateway.auth import Scope, TokenTable
from gateway.control.grpc_app import (
    ControlServicer,
    RelayedError,
    abort,
    api_key,
    invoke,
    method_handlers,
)
from gateway.control.model_control import ModelControl
from gateway.errors import GatewayError, outcome_of_answer
from gateway.policy import deadline, triton_priority
from gateway.policy.deadline import triton_timeout_us
from gateway.policy.model_name import (
    GRPC_VERSION_FIELD,
    _first_length_delimited,
    grpc_message_whole,
    grpc_model_name,
)
from gateway.policy.rollout import SHADOW_HEADER, Shadow, pin_grpc_version
from gateway.pools import PoolMember
from gateway.python.forwarder import (
    LOAD_WAIT_HEADER,
    LOAD_WAIT_MS,
    MIRROR_TIMEOUT_S,
    Forwarder,
    RequestOptions,
)
from gateway.python.shadow import compare_grpc
from gateway.python.streams import StreamEnd, StreamRelay
from gateway.upstream.grpc import SERVICE, UpstreamGRPC, server_options


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


def _outcome(result: bytes | RelayedError) -> str:
    if isinstance(result, RelayedError):
        return outcome_of_answer(200, result.code.value[0])
    return "success"


def _named_version(message: bytes) -> int | None:
    raw = _first_length_delimited(message, GRPC_VERSION_FIELD)
    return int(raw) if raw and raw.isdigit() else None


def _marked(context: Any) -> bool:
    return any(key == SHADOW_HEADER for key, _ in context.invocation_metadata() or ())


def _options(context: grpc.aio.ServicerContext) -> RequestOptions:
    """The call's deadline (with the grace HAProxy gave a stream, ``deadline.GRACE_HEADER``)
    and API key."""
    grace = next((value for key, value in context.invocation_metadata() or ()
                  if key == deadline.GRACE_HEADER), None)
    remaining = context.time_remaining()
    return RequestOptions(deadline_s=remaining, api_key=api_key(context),
                          grace_s=deadline.grace_s(grace) if remaining is not None else 0.0)


class GatewayServicer(ControlServicer):
    """The control plane's servicer with the inference RPCs on the Python forwarder."""

    def __init__(self, forwarder: Forwarder, control: ModelControl,
                 upstream: UpstreamGRPC, auth: TokenTable | None = None,
                 closing: asyncio.Event | None = None) -> None:
        super().__init__(forwarder.core, control, upstream, auth)
        self.forwarder = forwarder
        self.streams = StreamRelay(forwarder, upstream, closing)

    def _options(self, context: Any, scope: Scope) -> RequestOptions:
        self._require(context, scope)
        return _options(context)

    # -- model calls -------------------------------------------------------------------
    async def ModelInfer(self, request: bytes, context: Any) -> bytes:  # noqa: N802
        try:
            model = grpc_model_name(request)
            options = self._options(context, Scope.PREDICT)
            version, shadow, unpinned = None, None, request
            # a message cut short goes as sent: appended fields could complete it, and
            # Triton's parse error (INVALID_ARGUMENT) is the answer, as through HAProxy
            if grpc_message_whole(request):
                if options.deadline_s is not None:
                    request = with_timeout_parameter(request, options.deadline_s)
                level = self.forwarder.triton_level(model, options)
                if level is not None:  # the class's level (a later map entry wins)
                    request += triton_priority.grpc_entry(level)
                unpinned = request
                request, version = self.forwarder.pin_grpc(model, request)  # in a rollout
                if self.forwarder.state.shadows:  # a shadow step: mirrored to the candidate?
                    marked = _marked(context)
                    shadow = self.forwarder.shadow(
                        model, version if version is not None or not marked
                        else _named_version(request), marked)

            async def call(member: PoolMember) -> bytes | RelayedError:
                try:
                    return await invoke(self.upstream.raw_infer(member), request,
                                         options.deadline_s)
                except RelayedError as relayed:
                    return relayed  # Triton's answer: counted by its code, then relayed

            LOAD_WAIT_MS.set(None)
            started = self.forwarder.clock()
            result = await self.forwarder.forward(model, call, protocol="grpc",
                                                  options=options, outcome=_outcome,
                                                  version=version)
            if shadow is not None:
                self._mirror(shadow, model, pin_grpc_version(unpinned, shadow.candidate),
                             result, self.forwarder.clock() - started)
            waited = LOAD_WAIT_MS.get()
            if waited is not None:  # a miss: it waited for its model to load
                context.set_trailing_metadata(((LOAD_WAIT_HEADER, str(waited)),))
            if isinstance(result, RelayedError):
                raise result
            return result
        except (GatewayError, RelayedError) as err:
            await abort(context, err)
            raise  # unreachable: abort raises

    def _mirror(self, shadow: Shadow, model: str, message: bytes,
                stable: bytes | RelayedError, seconds: float) -> None:
        """The request's copy pinned to the candidate (the last ``model_version``
        wins), fire-and-forget beside stable's answer."""
        async def call(member: PoolMember) -> bytes | RelayedError:
            try:
                return await invoke(self.upstream.raw_infer(member), message,
                                    MIRROR_TIMEOUT_S)
            except RelayedError as relayed:
                return relayed

        self.forwarder.mirror(shadow, model, "grpc", call,
                              (not isinstance(stable, RelayedError), seconds),
                              compare_grpc(stable, shadow.metric))

    async def ModelStreamInfer(  # noqa: N802
        self, request_iterator: AsyncIterator[bytes], context: Any
    ) -> AsyncIterator[bytes]:
        """Relayed to one member as a stream for its whole life (``gateway/python/streams.py``);
        messages are raw bytes. Triton's errors for single requests travel in
        ``error_message`` as Triton sends them; the stream's own end (the member's
        status, a gateway error before the stream is established) is the call's status."""
        try:
            options = self._options(context, Scope.PREDICT)
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
            await abort(context, err)


def create_grpc_server(
    forwarder: Forwarder, control: ModelControl, upstream: UpstreamGRPC, address: str,
    auth: TokenTable | None = None, max_message_bytes: int = 256 * 1024 * 1024,
    closing: asyncio.Event | None = None,
) -> tuple[grpc.aio.Server, int]:
    """``max_message_bytes``: larger requests are refused by grpc-core itself with
    RESOURCE_EXHAUSTED before any handler runs; ``closing``: set once the drain is
    over, it ends the ``ModelStreamInfer`` streams still open (UNAVAILABLE)."""
    server = grpc.aio.server(options=server_options(max_message_bytes))
    servicer = GatewayServicer(forwarder, control, upstream, auth, closing)
    handlers = method_handlers(servicer)
    handlers["ModelInfer"] = grpc.unary_unary_rpc_method_handler(
        servicer.ModelInfer, request_deserializer=None, response_serializer=None
    )
    handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(
        servicer.ModelStreamInfer, request_deserializer=None, response_serializer=None
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    port = server.add_insecure_port(address)
    return server, port
