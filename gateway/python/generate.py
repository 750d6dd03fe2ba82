"""HTTP ``generate`` and ``generate_stream`` (Triton's generate extension) over the data
plane, routed like infer: auth, rate limit, admission, routing, metrics, one retry on
another member when the first cannot be reached (before any byte of the answer).

``POST /v2/models/{m}[/versions/{v}]/generate`` answers one JSON object;
``.../generate_stream`` answers server-sent events (``data: {...}``), relayed chunk by
chunk as the member writes them: nothing is buffered, so each event reaches the client
when Triton sends it. The request holds its admission slot until the last event. A
client that goes away cancels the upstream request. Errors the gateway produces are
Triton's shape, ``{"error": "..."}``; Triton's own answers (an error event mid-stream
included) are relayed as they are. A request still open when the server closes (its
task cancelled by uvicorn once the gateway's drain is over, ``gateway/embedded.py``)
ends as Triton ends a failed one: a 503, or, once its events have begun, an error event
saying the gateway is shutting down, so that the client retries instead of reading a
body cut short.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from gateway.auth import Scope
from gateway.errors import (
    DeadlineExceeded,
    GatewayError,
    Unavailable,
    error_answer,
    outcome_of_answer,
)
from gateway.policy import deadline, parse_errors
from gateway.policy.rollout import http_pinned_path
from gateway.pools import PoolMember
from gateway.python.fast_path import FastPath, options_from_headers, read_body
from gateway.python.forwarder import Forwarder, RequestOptions
from gateway.upstream.http import UpstreamHTTP

GENERATE_PATH = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?/generate(_stream)?$")
FORWARDED = ("content-type", "content-encoding")
RELAYED = ("content-type",)
SHUTTING_DOWN = "the gateway is shutting down: retry the request"

ASGIScope = dict[str, Any]
ASGIReceive = Callable[[], Awaitable[dict[str, Any]]]
ASGISend = Callable[[dict[str, Any]], Awaitable[None]]
_END = object()


class EventCounter:
    """Counts server-sent events (``\\n\\n``-terminated) in a byte stream cut anywhere."""

    def __init__(self) -> None:
        self.events = 0
        self._tail = b""

    def feed(self, chunk: bytes) -> int:
        data = self._tail + chunk
        found = data.count(b"\n\n")
        self.events += found
        self._tail = data[data.rfind(b"\n\n") + 2:] if found else data[-1:]
        return found


class GenerateFastPath(FastPath):
    """ASGI layer for the generate extension; every other request falls through."""

    path = GENERATE_PATH

    async def __call__(self, scope: ASGIScope, receive: ASGIReceive, send: ASGISend) -> None:
        match = self.matched(scope)
        if match is None:
            await self.app(scope, receive, send)
            return
        stream = match.group(3) is not None
        started = ended = False
        try:
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            options = options_from_headers(headers)
            if self.auth.predict_gated:
                self.auth.require(options.api_key, Scope.PREDICT)
            body = await read_body(receive, self.max_body_bytes)
            forwarded = {k: v for k, v in headers.items() if k in FORWARDED}
            path, version = scope["path"], None
            if match.group(2) is None:
                version = self.forwarder.pin(match.group(1))  # a rollout's split
                path = path if version is None else http_pinned_path(path, version)
            relay = _Relay(self.upstream, self.forwarder, match.group(1), path, body,
                           forwarded, options, stream)
            async for message in relay.run(receive):
                started = True
                ended = message["type"] == "http.response.body" and \
                    not message.get("more_body")
                await send(message)
        except asyncio.CancelledError:
            # the server is closing (only uvicorn cancels a request): this request's
            # task ends here, with the answer ended rather than cut
            if not ended:
                await _end_at_shutdown(send, started, stream)
        except GatewayError as error:
            if started:  # the answer has begun: all that is left is to end it
                await send({"type": "http.response.body", "body": b""})
                return
            status, data, error_headers = error_answer(error)
            error_headers.append((b"content-length", str(len(data)).encode()))
            await send({"type": "http.response.start", "status": status,
                        "headers": error_headers})
            await send({"type": "http.response.body", "body": data})


class _Relay:
    """One generate request: the upstream call runs inside ``Forwarder.forward`` (so it
    holds its admission slot while it streams); ASGI messages come out of ``out``."""

    def __init__(self, upstream: UpstreamHTTP, forwarder: Forwarder, model: str, path: str,
                 body: bytes, headers: dict[str, str], options: RequestOptions,
                 stream: bool) -> None:
        self.upstream, self.forwarder = upstream, forwarder
        self.model, self.path, self.body, self.headers = model, path, body, headers
        self.options, self.stream = options, stream
        self.protocol = "http_generate_stream" if stream else "http_generate"
        self.out: asyncio.Queue[Any] = asyncio.Queue(maxsize=64)
        self.started = False  # response headers relayed: no failover from here on

    async def run(self, receive: ASGIReceive) -> Any:
        task = asyncio.create_task(self._forward())
        watcher = asyncio.create_task(_disconnected(receive))
        try:
            while True:
                getter = asyncio.ensure_future(self.out.get())
                done, _ = await asyncio.wait({getter, watcher},
                                             return_when=asyncio.FIRST_COMPLETED)
                if getter not in done:  # the client went away: cancel upstream
                    getter.cancel()
                    return
                item = getter.result()
                if item is _END:
                    break
                yield item
            await task  # raises the gateway's error, if any
        finally:
            for pending in (task, watcher):
                pending.cancel()
            for pending in (task, watcher):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await pending

    async def _forward(self) -> None:
        try:
            await self.forwarder.forward(self.model, self._call, protocol=self.protocol,
                                         options=self.options, outcome=outcome_of_answer)
        finally:
            await self.out.put(_END)

    async def _call(self, member: PoolMember) -> int:
        url = f"http://{member.spec.http_address}{self.path}"
        timeout = aiohttp.ClientTimeout(total=self.options.deadline_s, sock_connect=2.0,
                                        sock_read=self.upstream.timeout_s)
        sent_at = time.monotonic()
        if self.started:
            raise RuntimeError("a generate request is sent once its answer has begun")
        try:
            async with self.upstream.session.post(url, data=self.body, headers=self.headers,
                                                  timeout=timeout) as resp:
                headers = [(k.lower().encode(), v.encode()) for k, v in resp.headers.items()
                           if k.lower() in RELAYED]
                if not self.stream or resp.status != 200:  # one JSON object (or error)
                    data = await resp.read()
                    status = parse_errors.http_status(resp.status, data)
                    headers.append((b"content-length", str(len(data)).encode()))
                    await self.out.put({"type": "http.response.start", "status": status,
                                        "headers": headers})
                    await self.out.put({"type": "http.response.body", "body": data})
                    return status
                await self.out.put({"type": "http.response.start", "status": resp.status,
                                    "headers": headers})
                self.started = True
                try:
                    await self._relay_events(resp, sent_at)
                except (aiohttp.ClientError, ConnectionError, TimeoutError):
                    # the answer has begun: no retry, no other status; end it where it broke
                    await self.out.put({"type": "http.response.body", "body": b""})
                    return 502
                return resp.status
        except (aiohttp.ClientConnectionError, ConnectionError) as exc:
            raise Unavailable(f"member {member.key} unreachable: {exc!r}") from exc
        except TimeoutError as exc:
            raise DeadlineExceeded(deadline.NO_ANSWER.format(member=member.key)) from exc

    async def _relay_events(self, resp: aiohttp.ClientResponse, sent_at: float) -> None:
        metrics = self.forwarder.metrics
        counter = EventCounter()
        try:
            async for chunk in resp.content.iter_any():
                found = counter.feed(chunk)
                if found and found == counter.events:  # the first event(s) arrived
                    metrics.first_response.labels(self.model, self.protocol).observe(
                        time.monotonic() - sent_at)
                await self.out.put({"type": "http.response.body", "body": chunk,
                                    "more_body": True})
        finally:
            metrics.responses_per_request.labels(self.model, self.protocol).observe(
                counter.events)
        await self.out.put({"type": "http.response.body", "body": b""})


async def _end_at_shutdown(send: ASGISend, started: bool, stream: bool) -> None:
    """A 503 (``Unavailable``) if nothing was sent yet, else the events' last one,
    Triton's ``{"error": ...}``, and the end of the body."""
    if not started:
        status, data, headers = error_answer(Unavailable(SHUTTING_DOWN))
        headers.append((b"content-length", str(len(data)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})
        return
    last = f"data: {json.dumps({'error': SHUTTING_DOWN})}\n\n".encode() if stream else b""
    await send({"type": "http.response.body", "body": last})


async def _disconnected(receive: ASGIReceive) -> None:
    """Returns when the client has gone away (the body was read before)."""
    while (await receive())["type"] != "http.disconnect":
        pass
