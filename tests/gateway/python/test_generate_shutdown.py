"""A generate request still open when the server closes (uvicorn cancels its task once
the drain is over): the answer ends as Triton ends a failed one, not cut short. The ASGI
layer called directly, the real upstream client, a small aiohttp member that answers
like Triton's generate_stream and then holds the stream open."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from gateway.config import GatewayConfig
from gateway.config.pools import MemberSpec, PoolSpec
from gateway.python.forwarder import Forwarder
from gateway.python.generate import SHUTTING_DOWN, GenerateFastPath
from gateway.upstream.http import UpstreamHTTP
from infergate.triton.local import free_port
from tests.gateway.conftest import generate_member

FIRST = b'data: {"index":0}\n\n'


async def _member(port: int, events: int, arrived: asyncio.Event,
                  release: asyncio.Event) -> web.AppRunner:
    """Answers ``events`` events, then holds the stream open until ``release`` (none:
    holds back its answer's head too)."""
    async def generate_stream(request: web.Request) -> web.StreamResponse:
        arrived.set()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        if events:
            await resp.prepare(request)
            for _ in range(events):
                await resp.write(FIRST)
        await release.wait()  # a long generation
        return resp

    return await generate_member(port, generate_stream)


async def _cancelled_after(events: int) -> list[dict[str, Any]]:
    """What the ASGI layer sent for a generate_stream whose task is cancelled once
    ``events`` events were relayed (0: before the member answered)."""
    port = free_port()
    member = MemberSpec(http_port=port, grpc_port=port)
    dataplane = Forwarder.for_config(GatewayConfig(pools=(PoolSpec(name="p",
                                                                   members=(member,)),)))
    arrived, release, relayed = asyncio.Event(), asyncio.Event(), asyncio.Event()
    runner = await _member(port, events, arrived, release)
    upstream = UpstreamHTTP()
    sent: list[dict[str, Any]] = []
    body = [{"type": "http.request", "body": b"{}", "more_body": False}]

    async def receive() -> dict[str, Any]:
        if body:
            return body.pop()
        await asyncio.Event().wait()  # the client stays
        raise AssertionError

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if b"".join(m.get("body", b"") for m in sent).count(b"\n\n") >= events:
            relayed.set()

    async def fallthrough(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("generate must not fall through")

    app = GenerateFastPath(fallthrough, dataplane, upstream)
    scope = {"type": "http", "method": "POST", "path": "/v2/models/m/generate_stream",
             "headers": [(b"content-type", b"application/json")]}
    try:
        task = asyncio.create_task(app(scope, receive, send))
        await asyncio.wait_for(arrived.wait(), 10)
        if events:
            await asyncio.wait_for(relayed.wait(), 10)
        await asyncio.sleep(0.05)
        task.cancel()  # what uvicorn does past its graceful-shutdown timeout
        await asyncio.wait_for(task, 5)  # the request ends: no CancelledError
    finally:
        release.set()
        await upstream.aclose()
        await runner.cleanup()
    return sent


def test_generate_stream_ends_with_error_event_when_cancelled_mid_stream() -> None:
    sent = asyncio.run(_cancelled_after(2))
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    assert b"".join(m["body"] for m in sent[1:-1]) == FIRST * 2
    last = sent[-1]
    assert not last.get("more_body")
    assert last["body"] == f"data: {json.dumps({'error': SHUTTING_DOWN})}\n\n".encode()


def test_generate_stream_answers_503_when_cancelled_before_answer_began() -> None:
    sent = asyncio.run(_cancelled_after(0))
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 503
    assert json.loads(sent[1]["body"]) == {"error": SHUTTING_DOWN}
