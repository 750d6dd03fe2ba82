"""What a standby control plane passes to the leader (:mod:`gateway.control.standby`):
HTTP as a streaming reverse proxy (:class:`LeaderProxy`), gRPC as a TCP relay
(:class:`TcpRelay`), each to the address the leader wrote with its term
(:class:`~gateway.lifecycle.records.leader.LeaderSeen`).

- **Streaming both ways.** An upload's body goes on to the leader as it arrives, never
  held whole here; the answer comes back as the leader sends it (an event stream, a
  report file). Hop-by-hop headers (RFC 9110 7.6.1, and those ``Connection`` names) are
  dropped; ``X-Forwarded-For/-Host/-Proto`` are added.
- **Bounded where it must be.** Connecting gives up after ``connect_timeout_s``; after
  that a call lasts what it lasts (an upload, an event stream, a long poll: the client
  decides how long it waits), and a leader whose node vanished is noticed by TCP
  keepalives (:data:`KEEPALIVE`): the call fails, it does not hang for good.
- **A failure is the client's to see, never swallowed.** No leader known, or the leader
  not reached (the call certainly did not arrive): 503 + ``Retry-After``. The leader
  failed after the call went out: 503 *without* ``Retry-After``, saying that the outcome
  is unknown (an upload may have been accepted: its job is the leader's to report). The
  leader failed mid-answer: the answer is cut short, which the client sees as an
  incomplete body.
- **Never twice.** What one standby passes on carries :data:`VIA`; a standby that
  receives it answers 503 instead of passing it again, so two standbys with a stale view
  of the leader cannot bounce a call between them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Callable

import httpx
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from gateway.errors import Unavailable
from gateway.netaddr import split_host_port

log = logging.getLogger(__name__)

CONNECT_S = 2.0  # how long a standby tries to reach the leader before it answers 503
RETRY_AFTER_S = 2  # a standby's Retry-After: the next poll knows the new leader
VIA = "x-infergate-standby"  # on a call a standby passed on: that standby's holder
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate",
                        "proxy-authorization", "proxy-connection", "te", "trailer",
                        "trailers", "transfer-encoding", "upgrade"})
# the leader's host gone without a word (a node lost): a call fails within ~8 s
KEEPALIVE = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
             *[(socket.IPPROTO_TCP, getattr(socket, name), value)
               for name, value in (("TCP_KEEPIDLE", 5), ("TCP_KEEPINTVL", 1),
                                   ("TCP_KEEPCNT", 3)) if hasattr(socket, name)]]
CHUNK = 64 * 1024

Locate = Callable[[], str]  # the leader's host:port, or Unavailable saying why there is none


class LeaderProxy:
    """HTTP calls passed to the leader at ``locate()``; ``via``: this standby's name."""

    def __init__(self, locate: Locate, via: str, connect_timeout_s: float = CONNECT_S) -> None:
        self._locate = locate
        self._via = via
        transport = httpx.AsyncHTTPTransport(
            socket_options=KEEPALIVE,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=32))
        self._client = httpx.AsyncClient(transport=transport, trust_env=False,
                                         timeout=httpx.Timeout(None, connect=connect_timeout_s))

    async def forward(self, request: Request) -> Response:
        """The leader's answer to ``request``, streamed; :class:`Unavailable` where the
        call cannot be passed or failed before the leader answered."""
        if request.headers.get(VIA):
            raise Unavailable(f"passed on already, by standby {request.headers[VIA]!r}, to a "
                              "replica that does not lead: the leadership is moving; retry",
                              RETRY_AFTER_S)
        address = self._locate()
        scope = request.scope
        target = scope.get("raw_path") or request.url.path.encode()
        if scope.get("query_string"):
            target += b"?" + scope["query_string"]
        has_body = "content-length" in request.headers or \
            "transfer-encoding" in request.headers
        outgoing = self._client.build_request(
            request.method, httpx.URL(f"http://{address}").copy_with(raw_path=target),
            headers=self._headers(request), content=request.stream() if has_body else None)
        try:
            answer = await self._client.send(outgoing, stream=True)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise Unavailable(f"the leader at {address} cannot be reached ({exc!r}); the "
                              "call was not passed on: retry", RETRY_AFTER_S) from exc
        except httpx.HTTPError as exc:
            raise Unavailable(f"the leader at {address} failed during the call ({exc!r}): "
                              "it may or may not have taken effect; look before you "
                              "retry", retry_after_s=None) from exc
        response = StreamingResponse(_relayed(answer, address), status_code=answer.status_code)
        dropped = _hop_by_hop(answer.headers.get_list("connection"))
        response.raw_headers = [(k, v) for k, v in answer.headers.raw
                                if k.decode("latin-1").lower() not in dropped]
        return response

    def _headers(self, request: Request) -> list[tuple[bytes, bytes]]:
        dropped = _hop_by_hop(request.headers.getlist("connection")) | {
            "host", "expect", "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto"}
        if "transfer-encoding" in request.headers:  # it framed the body, not the length
            dropped |= {"content-length"}  # (RFC 9112 6.3; the front door reads it so)
        headers = [(k, v) for k, v in request.headers.raw
                   if k.decode("latin-1").lower() not in dropped]
        chain = [*request.headers.getlist("x-forwarded-for"),
                 *([request.client.host] if request.client else [])]
        forwarded = {"x-forwarded-for": ", ".join(chain),
                     "x-forwarded-host": request.headers.get("host", ""),
                     "x-forwarded-proto": request.url.scheme, VIA: self._via}
        return headers + [(k.encode(), v.encode("latin-1")) for k, v in forwarded.items()
                          if v]

    async def aclose(self) -> None:
        await self._client.aclose()


def _hop_by_hop(connection: list[str]) -> frozenset[str]:
    named = {token.strip().lower() for value in connection for token in value.split(",")}
    return HOP_BY_HOP | named


async def _relayed(answer: httpx.Response, address: str) -> AsyncIterator[bytes]:
    try:
        async for chunk in answer.aiter_raw():
            yield chunk
    except httpx.HTTPError as exc:  # the answer is cut short: the client sees it so
        log.warning("standby: the leader at %s failed mid-answer: %r", address, exc)
        raise
    finally:
        await answer.aclose()


class TcpRelay:
    """Connections to a standby's gRPC port, relayed byte for byte to the leader's gRPC
    address: an HTTP/2 connection is the leader's from end to end. Where the leader
    cannot be reached the connection is closed at once, which a gRPC client reads as
    UNAVAILABLE (and retries)."""

    def __init__(self, locate: Locate, connect_timeout_s: float = CONNECT_S) -> None:
        self._locate = locate
        self._timeout = connect_timeout_s
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._relay, host, port, reuse_address=True)

    async def _relay(self, client_r: asyncio.StreamReader,
                     client_w: asyncio.StreamWriter) -> None:
        self._open.add(client_w)
        try:
            address = self._locate()
            host, port = split_host_port(address)
            leader_r, leader_w = await asyncio.wait_for(
                asyncio.open_connection(host, port), self._timeout)
        except (Unavailable, OSError, ValueError) as exc:  # (TimeoutError is an OSError)
            log.info("standby: a gRPC connection not relayed: %s", exc)
            client_w.close()
            self._open.discard(client_w)
            return
        self._open.add(leader_w)
        sock = leader_w.get_extra_info("socket")
        if sock is not None:
            for option in KEEPALIVE:
                sock.setsockopt(*option)
        try:
            await asyncio.gather(_pipe(client_r, leader_w), _pipe(leader_r, client_w))
        finally:
            for writer in (client_w, leader_w):
                writer.close()
                self._open.discard(writer)

    async def close(self) -> None:
        """Stop listening and end every relayed connection."""
        if self._server is not None:
            self._server.close()
        for writer in list(self._open):
            writer.close()
        if self._server is not None:
            await self._server.wait_closed()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One direction until either side ends; then both end (gRPC has no use for a
    half-closed connection)."""
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    writer.close()
