"""gRPC ``ModelStreamInfer`` relayed to one member as a stream for its whole life.

The first request's model picks the member (admission, rate limit and routing as for
``ModelInfer``: :meth:`Forwarder.forward`, where a stream holds one admission slot while
it lives); every later request of the stream goes to the same member, pipelined: the
client's requests are written upstream as they arrive, the member's responses are
relayed as they arrive (many per request for a decoupled model). Messages travel as raw
bytes; only the request's model name, id and parameters and the response's id and
parameters are read.

Relayed both ways: the client cancelling (the upstream call is cancelled, so Triton
sees it), the client's deadline (the upstream call's timeout), and the member's own end
of the stream (its status and message, e.g. CANCELLED or DEADLINE_EXCEEDED). A member
that fails before its first response is replaced once (the requests it was sent are
replayed on another member); after that its failure ends the stream with UNAVAILABLE.
A client message that is not a ``ModelInferRequest`` is not forwarded: the member
finishes the requests before it, then the stream ends with INVALID_ARGUMENT. A stream
still open when the gateway's drain is over (``closing``) ends with UNAVAILABLE, which
a client retries on another replica (the upstream call is cancelled).

Per-request metrics (:class:`StreamTally`): the gateway asks Triton for its empty final
response (``triton_enable_empty_final_response``), so it knows when each request is
complete, and drops those empty finals again for clients that did not ask for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, cast

import grpc
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

from gateway.errors import Unavailable, outcome_of_answer
from gateway.metrics import GatewayMetrics
from gateway.policy import parse_errors
from gateway.policy.model_name import grpc_message_whole
from gateway.pools import PoolMember
from gateway.python.forwarder import Forwarder, RequestOptions

EMPTY_FINAL = "triton_enable_empty_final_response"
FINAL = "triton_final_response"
_END = object()


def _force_empty_final() -> bytes:
    extra = service_pb2.ModelInferRequest()
    extra.parameters[EMPTY_FINAL].bool_param = True
    return extra.SerializeToString()


FORCE_EMPTY_FINAL = _force_empty_final()  # appended on the wire: a later map entry wins
SHUTTING_DOWN = "the gateway is shutting down: retry the stream"


@dataclass
class _Pending:
    request_id: str
    model: str
    sent_at: float
    client_wants_final: bool
    responses: int = 0
    answered: bool = False


@dataclass
class StreamTally:
    """Attributes responses to the stream's requests (by id: the oldest pending request
    with that id) and records time to first response and responses per request."""

    metrics: GatewayMetrics
    protocol: str
    clock: Callable[[], float] = time.monotonic
    pending: list[_Pending] = field(default_factory=list)

    def sent(self, request_id: str, model: str, client_wants_final: bool) -> None:
        self.pending.append(_Pending(request_id, model, self.clock(), client_wants_final))

    def received(self, response_id: str, final: bool, empty: bool) -> bool:
        """Record one response; False when it is an empty final the client did not ask
        for (the gateway drops it)."""
        entry = next((p for p in self.pending if p.request_id == response_id),
                     self.pending[0] if self.pending else None)
        if entry is None:
            return True
        real = not (final and empty)
        if real:
            entry.responses += 1
            if not entry.answered:
                entry.answered = True
                self.metrics.first_response.labels(entry.model, self.protocol).observe(
                    self.clock() - entry.sent_at)
        if final:
            self.pending.remove(entry)
            self._done(entry)
        return real or entry.client_wants_final

    def close(self) -> None:
        """The stream ended: requests never completed are recorded as they stand."""
        for entry in self.pending:
            self._done(entry)
        self.pending.clear()

    def _done(self, entry: _Pending) -> None:
        self.metrics.responses_per_request.labels(entry.model, self.protocol).observe(
            entry.responses)


@dataclass(frozen=True)
class StreamEnd:
    """How the member ended the stream (OK, or its status and message)."""

    code: grpc.StatusCode
    details: str = ""


def stream_outcome(end: StreamEnd) -> str:
    return outcome_of_answer(200, end.code.value[0])


def _inspect_request(raw: bytes) -> tuple[str, str, bool] | None:
    """(model name, id, whether the client asked for empty final responses); None for
    bytes that are not a ModelInferRequest."""
    try:
        request = service_pb2.ModelInferRequest.FromString(raw)
    except DecodeError:
        return None
    param = request.parameters.get(EMPTY_FINAL)
    return request.model_name, request.id, bool(param is not None and param.bool_param)


def _inspect_response(raw: bytes) -> tuple[str, bool, bool]:
    """(id, final, empty) of one stream response (Triton's own bytes: well-formed)."""
    response = service_pb2.ModelStreamInferResponse.FromString(raw)
    infer = response.infer_response
    final = FINAL in infer.parameters and infer.parameters[FINAL].bool_param
    empty = not response.error_message and not infer.outputs
    return infer.id, final, empty


class StreamSession:
    """One client stream: reads the client's requests once, writes them to the member
    chosen for this attempt, and puts the member's responses on ``out``."""

    def __init__(self, upstream: Any, metrics: GatewayMetrics, requests: AsyncIterator[bytes],
                 first: bytes, options: RequestOptions, protocol: str = "grpc_stream",
                 pin: Callable[[str, bytes], bytes] = lambda model, raw: raw) -> None:
        self.upstream = upstream
        self.pin = pin  # a request pinned to a version by a rollout's split
        self.options = options
        self.tally = StreamTally(metrics, protocol)
        self.out: asyncio.Queue[Any] = asyncio.Queue(maxsize=64)
        self.incoming: asyncio.Queue[Any] = asyncio.Queue()
        self.incoming.put_nowait(first)
        self.requests = requests
        self.replay: list[bytes] = []  # sent to the member, none answered yet
        self.answered = False
        self.client_done = False
        self.malformed = False  # a client message was not a request: the stream ends
        self.started = time.monotonic()

    async def read_client(self) -> None:
        async for raw in self.requests:
            await self.incoming.put(raw)
        await self.incoming.put(_END)

    async def run(self, member: PoolMember) -> StreamEnd:
        """One attempt on ``member``; raises Unavailable (retry elsewhere) only while no
        response has been relayed."""
        timeout = None
        if self.options.deadline_s is not None:
            timeout = max(0.001, self.options.deadline_s - (time.monotonic() - self.started))
        call = self.upstream.raw_stream(member)(timeout=timeout)
        writer = asyncio.create_task(self._write(call))
        try:
            while True:
                raw = await call.read()
                if raw is grpc.aio.EOF:
                    if self.malformed:
                        return StreamEnd(grpc.StatusCode.INVALID_ARGUMENT,
                                         "malformed protobuf request in the stream")
                    return StreamEnd(grpc.StatusCode.OK)
                self.answered = True
                self.replay.clear()
                response_id, final, empty = _inspect_response(raw)
                if self.tally.received(response_id, final, empty):
                    await self.out.put(raw)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                if not self.answered:
                    raise Unavailable(f"member {member.key} unreachable: {exc.details()}"
                                      ) from exc
                return StreamEnd(grpc.StatusCode.UNAVAILABLE,
                                 f"member {member.key} failed during the stream: "
                                 f"{exc.details()}")
            details = exc.details() or ""
            code = parse_errors.grpc_code(exc.code().name, details)
            return StreamEnd(grpc.StatusCode[code], details)
        finally:
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await writer
            call.cancel()  # no-op when finished; else Triton sees the cancellation

    async def _write(self, call: Any) -> None:
        for replayed in list(self.replay):
            await call.write(replayed)
        while True:
            item = _END if self.client_done else await self.incoming.get()
            if item is _END:
                self.client_done = True
                await call.done_writing()
                return
            raw = cast(bytes, item)
            inspected = _inspect_request(raw)
            if inspected is None:  # the member finishes the others, then the stream ends
                self.malformed = True
                self.client_done = True
                await call.done_writing()
                return
            model, request_id, wants_final = inspected
            raw = self.pin(model, raw)
            self.tally.sent(request_id, model, wants_final)
            if not wants_final:
                raw += FORCE_EMPTY_FINAL
            if not self.answered:
                self.replay.append(raw)
            await call.write(raw)


class StreamRelay:
    """What the gRPC adapter's ``ModelStreamInfer`` calls. ``closing``: set once the
    gateway's drain is over."""

    def __init__(self, forwarder: Forwarder, upstream: Any,
                 closing: asyncio.Event | None = None) -> None:
        self.forwarder = forwarder
        self.upstream = upstream
        self.closing = closing or asyncio.Event()

    def _pin(self, model: str, raw: bytes) -> bytes:
        """A rollout's version appended to a message whole at its top level; one cut
        short goes as sent (an appended field could complete it), as ``ModelInfer``."""
        return self.forwarder.pin_grpc(model, raw)[0] if grpc_message_whole(raw) else raw

    async def relay(self, model: str, first: bytes, requests: AsyncIterator[bytes],
                    options: RequestOptions) -> AsyncGenerator[bytes | StreamEnd, None]:
        """The member's responses as raw bytes, then how the stream ended (UNAVAILABLE
        once ``closing`` is set). Gateway errors before the stream is established
        (unknown model, overload, no member) are raised."""
        session = StreamSession(self.upstream, self.forwarder.metrics, requests, first,
                                options, pin=self._pin)
        reader = asyncio.create_task(session.read_client())

        async def forward() -> StreamEnd:
            try:
                return await self.forwarder.forward(model, session.run,
                                                    protocol="grpc_stream",
                                                    options=options, outcome=stream_outcome)
            finally:
                await session.out.put(_END)

        task = asyncio.create_task(forward())
        watcher = asyncio.create_task(self._wake_at_close(session))
        try:
            while True:
                item = await session.out.get()
                if self.closing.is_set() and not task.done():
                    yield StreamEnd(grpc.StatusCode.UNAVAILABLE, SHUTTING_DOWN)
                    return
                if item is _END:
                    break
                yield item
            yield await task
        finally:
            for pending in (task, reader, watcher):
                pending.cancel()
            for pending in (task, reader, watcher):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await pending
            session.tally.close()

    async def _wake_at_close(self, session: StreamSession) -> None:
        """Once the drain is over, wakes the relay waiting for the member's next
        response (a full queue has it awake already)."""
        await self.closing.wait()
        with contextlib.suppress(asyncio.QueueFull):
            session.out.put_nowait(_END)
