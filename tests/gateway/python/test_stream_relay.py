"""The stream relay in-process: upstream stream calls faked at the member boundary (the
shape of grpc.aio's stream-stream call), the data plane real."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
from tritonclient.grpc import service_pb2

from gateway.config import GatewayConfig
from gateway.config.pools import MemberSpec, PoolSpec
from gateway.metrics import create_metrics
from gateway.pools import PoolMember
from gateway.python.forwarder import NO_OPTIONS, Forwarder, RequestOptions
from gateway.python.streams import (
    EMPTY_FINAL,
    SHUTTING_DOWN,
    StreamEnd,
    StreamRelay,
    StreamTally,
)


def _response(request_id: str, final: bool, output: bool = True) -> bytes:
    response = service_pb2.ModelInferResponse(id=request_id, model_name="m")
    response.parameters["triton_final_response"].bool_param = final
    if output:
        response.outputs.add(name="y", datatype="INT32", shape=[1])
    return service_pb2.ModelStreamInferResponse(infer_response=response).SerializeToString()


def _unavailable() -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(),
                                grpc.aio.Metadata(), details="connection refused")


class FakeCall:
    """A member's ModelStreamInfer: two responses per request (one with an output, then
    Triton's empty final), or a failure at a chosen read."""

    def __init__(self, fail_on_read: int | None,
                 code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE) -> None:
        self.fail_on_read = fail_on_read
        self.code = code
        self.reads = 0
        self.written: list[service_pb2.ModelInferRequest] = []
        self.responses: asyncio.Queue[Any] = asyncio.Queue()
        self.cancelled = False

    async def write(self, raw: bytes) -> None:
        request = service_pb2.ModelInferRequest.FromString(raw)
        self.written.append(request)
        await self.responses.put(_response(request.id, final=False))
        await self.responses.put(_response(request.id, final=True, output=False))

    async def done_writing(self) -> None:
        await self.responses.put(grpc.aio.EOF)

    async def read(self) -> Any:
        self.reads += 1
        if self.fail_on_read is not None and self.reads >= self.fail_on_read:
            if self.code == grpc.StatusCode.UNAVAILABLE:
                raise _unavailable()
            raise grpc.aio.AioRpcError(self.code, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                       details="cancelled by the member")
        return await self.responses.get()

    def cancel(self) -> None:
        self.cancelled = True


class FakeUpstream:
    def __init__(self, fail_on_read: list[int | None],
                 code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE) -> None:
        self.plan = list(fail_on_read)  # per call, in order
        self.code = code
        self.calls: list[tuple[PoolMember, FakeCall]] = []
        self.timeouts: list[float | None] = []

    def raw_stream(self, member: PoolMember) -> Any:
        def open_call(timeout: float | None = None) -> FakeCall:
            call = FakeCall(self.plan.pop(0), self.code)
            self.calls.append((member, call))
            self.timeouts.append(timeout)
            return call

        return open_call


def _dataplane() -> Forwarder:
    members = (MemberSpec(grpc_port=9001), MemberSpec(grpc_port=9002))
    config = GatewayConfig(pools=(PoolSpec(name="p", members=members),))
    return Forwarder.for_config(config)


def _request(request_id: str, empty_final: bool = False) -> bytes:
    request = service_pb2.ModelInferRequest(model_name="m", id=request_id)
    if empty_final:
        request.parameters[EMPTY_FINAL].bool_param = True
    return request.SerializeToString()


async def _relay(upstream: FakeUpstream, requests: list[bytes],
                 options: RequestOptions = NO_OPTIONS, keep_open: bool = False,
                 stop_after: int | None = None) -> list[Any]:
    dataplane = _dataplane()

    async def rest() -> AsyncIterator[bytes]:
        for raw in requests[1:]:
            yield raw
        if keep_open:
            await asyncio.Event().wait()

    relay = StreamRelay(dataplane, upstream)
    items = []
    stream = relay.relay("m", requests[0], rest(), options)
    async for item in stream:
        items.append(item)
        if stop_after is not None and len(items) >= stop_after:
            break
    await stream.aclose()  # what grpc does to a handler whose client went away
    return items


def _ids(items: list[Any]) -> list[str]:
    return [service_pb2.ModelStreamInferResponse.FromString(i).infer_response.id
            for i in items if isinstance(i, bytes)]


def test_relay_replays_requests_on_another_member_when_first_fails_before_answering() -> None:
    upstream = FakeUpstream([1, None])  # the first member fails on its first read
    items = asyncio.run(_relay(upstream, [_request("a"), _request("b")]))
    assert items[-1] == StreamEnd(grpc.StatusCode.OK)
    assert _ids(items) == ["a", "b"]  # empty finals dropped: the client did not ask
    (first_member, first), (second_member, second) = upstream.calls
    assert first_member.key != second_member.key
    assert [r.id for r in second.written] == ["a", "b"]
    assert first.cancelled


def test_relay_ends_unavailable_without_retry_when_member_fails_after_answering() -> None:
    upstream = FakeUpstream([3, None])  # two reads answered, the third fails
    items = asyncio.run(_relay(upstream, [_request("a"), _request("b")]))
    end = items[-1]
    assert isinstance(end, StreamEnd) and end.code == grpc.StatusCode.UNAVAILABLE
    assert "failed during the stream" in end.details
    assert len(upstream.calls) == 1
    assert _ids(items) == ["a"]


def test_relay_keeps_empty_finals_when_client_asked_for_them() -> None:
    upstream = FakeUpstream([None])
    items = asyncio.run(_relay(upstream, [_request("a", empty_final=True), _request("b")]))
    assert _ids(items) == ["a", "a", "b"]
    # the gateway asked for b's empty final itself (a later map entry on the wire wins)
    assert all(r.parameters[EMPTY_FINAL].bool_param for _, c in upstream.calls
               for r in c.written)


def test_tally_counts_responses_per_request_when_ids_interleave() -> None:
    metrics = create_metrics()
    now = [0.0]
    tally = StreamTally(metrics, "grpc_stream", clock=lambda: now[0])
    tally.sent("a", "m", client_wants_final=False)
    tally.sent("b", "m", client_wants_final=True)
    now[0] = 0.5
    assert tally.received("b", final=False, empty=False)
    now[0] = 1.0
    assert tally.received("a", final=False, empty=False)
    assert tally.received("a", final=False, empty=False)
    assert not tally.received("a", final=True, empty=True)  # dropped: a did not ask
    assert tally.received("b", final=True, empty=True)  # kept: b asked
    assert metrics.registry.get_sample_value(
        "infergate_responses_per_request_sum", {"model": "m", "protocol": "grpc_stream"}) == 3
    assert metrics.registry.get_sample_value(
        "infergate_time_to_first_response_seconds_sum",
        {"model": "m", "protocol": "grpc_stream"}) == 1.5


def test_relay_cancels_upstream_call_when_client_goes_away() -> None:
    upstream = FakeUpstream([None])
    items = asyncio.run(_relay(upstream, [_request("a")], keep_open=True, stop_after=1))
    assert _ids(items) == ["a"]
    assert upstream.calls[0][1].cancelled


def test_relay_relays_member_status_when_member_cancels() -> None:
    upstream = FakeUpstream([2], code=grpc.StatusCode.CANCELLED)
    items = asyncio.run(_relay(upstream, [_request("a")], keep_open=True))
    assert items[-1] == StreamEnd(grpc.StatusCode.CANCELLED, "cancelled by the member")
    assert len(upstream.calls) == 1


def test_relay_gives_upstream_the_client_deadline_when_client_has_one() -> None:
    upstream = FakeUpstream([None])
    asyncio.run(_relay(upstream, [_request("a")], RequestOptions(deadline_s=7.5)))
    (timeout,) = upstream.timeouts
    assert timeout is not None and 7.0 < timeout <= 7.5


def test_relay_ends_invalid_argument_after_earlier_answers_when_message_malformed() -> None:
    upstream = FakeUpstream([None])
    items = asyncio.run(_relay(upstream, [_request("a"), b"\xff\xff\xff", _request("b")],
                               keep_open=True))
    assert _ids(items) == ["a"]
    assert items[-1] == StreamEnd(grpc.StatusCode.INVALID_ARGUMENT,
                                  "malformed protobuf request in the stream")
    assert [r.id for r in upstream.calls[0][1].written] == ["a"]


def test_relay_ends_unavailable_and_cancels_upstream_when_gateway_closes() -> None:
    """The drain is over (``closing`` set) while the client's stream is open and the
    member still has work: the stream ends with a status a client retries."""
    upstream = FakeUpstream([None])

    async def run() -> list[Any]:
        closing = asyncio.Event()

        async def still_open() -> AsyncIterator[bytes]:
            await asyncio.Event().wait()
            yield b""  # never reached

        relay = StreamRelay(_dataplane(), upstream, closing)
        items = []
        stream = relay.relay("m", _request("a"), still_open(), NO_OPTIONS)
        async for item in stream:
            items.append(item)
            closing.set()  # after the first response
        await stream.aclose()
        return items

    items = asyncio.run(run())
    assert _ids(items) == ["a"]
    assert items[-1] == StreamEnd(grpc.StatusCode.UNAVAILABLE, SHUTTING_DOWN)
    assert "shutting down" in SHUTTING_DOWN
    assert upstream.calls[0][1].cancelled
