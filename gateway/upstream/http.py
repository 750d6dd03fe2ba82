"""The Python data plane's HTTP client toward Triton members: one keep-alive pool."""

from __future__ import annotations

from collections.abc import Mapping

import aiohttp

from gateway.errors import DeadlineExceeded, Unavailable
from gateway.policy import deadline
from gateway.pools import PoolMember

FORWARDED_RESPONSE_HEADERS = ("content-type", "inference-header-content-length")


class UpstreamResponse:
    __slots__ = ("status", "body", "headers")

    def __init__(self, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        self.status, self.body, self.headers = status, body, headers


class UpstreamHTTP:
    """Keep-alive connections to every member's HTTP port (one aiohttp session).

    Responses are relayed uncompressed and never decoded: ``auto_decompress`` is off and
    we ask Triton for ``identity``.
    """

    def __init__(self, timeout_s: float = 60.0, max_connections: int = 256) -> None:
        self.timeout_s = timeout_s
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:  # created lazily, inside the running event loop
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_connections, limit_per_host=0),
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding"),
                timeout=aiohttp.ClientTimeout(total=self.timeout_s, sock_connect=2.0),
            )
        return self._session

    async def request(
        self,
        member: PoolMember,
        method: str,
        path: str,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> UpstreamResponse:
        url = f"http://{member.spec.http_address}{path}"
        timeout = aiohttp.ClientTimeout(total=timeout_s) if timeout_s else None
        try:
            async with self.session.request(method, url, data=body, headers=headers,
                                            timeout=timeout) as resp:
                data = await resp.read()
                relayed = [
                    (k.lower().encode(), v.encode()) for k, v in resp.headers.items()
                    if k.lower() in FORWARDED_RESPONSE_HEADERS
                ]
                return UpstreamResponse(resp.status, data, relayed)
        except (aiohttp.ClientConnectionError, ConnectionError) as exc:
            raise Unavailable(f"member {member.key} unreachable: {exc!r}") from exc
        except TimeoutError as exc:
            raise DeadlineExceeded(deadline.NO_ANSWER.format(member=member.key)) from exc

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
