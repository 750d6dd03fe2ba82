"""generate_stream's failover in-process: the ASGI layer through httpx, the real
upstream client, one member that refuses connections and one small aiohttp server
that answers like Triton's generate_stream."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import httpx
from aiohttp import web

from gateway.config import GatewayConfig
from gateway.config.pools import MemberSpec, PoolSpec
from gateway.python.forwarder import Forwarder
from gateway.python.generate import GenerateFastPath
from gateway.upstream.http import UpstreamHTTP
from infergate.triton.local import free_ports
from tests.gateway.conftest import generate_member

EVENTS = [b'data: {"index":0}\n\n', b'data: {"index":1}\n\n', b'data: {"index":2}\n\n']


async def _member(port: int, break_after: int | None = None) -> web.AppRunner:
    async def generate_stream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i, event in enumerate(EVENTS):
            if break_after is not None and i == break_after:
                assert request.transport is not None
                request.transport.abort()  # the member dies mid-answer
                return resp
            await resp.write(event)
        await resp.write_eof()
        return resp

    return await generate_member(port, generate_stream)


async def _call(break_after: int | None = None) -> tuple[httpx.Response, Forwarder, Any]:
    live_port, dead_port = free_ports(2)
    members = (MemberSpec(http_port=dead_port, grpc_port=dead_port),
               MemberSpec(http_port=live_port, grpc_port=live_port))
    config = GatewayConfig(pools=(PoolSpec(name="p", members=members),))
    dataplane = Forwarder.for_config(config)
    dead, live = dataplane.state.pools[0].members
    live.upstream_queue = 50  # the router prefers the (dead) idle member first
    live.queue_scraped_at = dataplane.clock()
    runner = await _member(live_port, break_after)
    upstream = UpstreamHTTP()

    async def fallthrough(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("generate must not fall through")

    app = GenerateFastPath(fallthrough, dataplane, upstream)
    try:
        transport = httpx.ASGITransport(app=cast(Any, app))
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            resp = await client.post("/v2/models/m/generate_stream", json={"text_input": "x"})
    finally:
        await upstream.aclose()
        await runner.cleanup()
    return resp, dataplane, (dead, live)


def test_generate_stream_fails_over_when_first_member_refuses_connection() -> None:
    resp, dataplane, (dead, live) = asyncio.run(_call())
    assert resp.status_code == 200
    assert resp.content == b"".join(EVENTS)
    assert dead.consecutive_failures == 1 and dead.ejected_until > 0
    assert live.consecutive_failures == 0


def test_generate_stream_ends_answer_without_retry_when_member_dies_mid_stream() -> None:
    resp, dataplane, (dead, live) = asyncio.run(_call(break_after=1))
    assert resp.status_code == 200  # the answer had begun: status and first event stand
    assert resp.content == EVENTS[0]
    text = dataplane.metrics.render().decode()
    assert ('infergate_requests_total{model="m",outcome="upstream_error",pool="p",'
            'protocol="http_generate_stream",traffic="user"} 1.0') in text
