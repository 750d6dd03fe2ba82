"""The Python plane's ASGI fast paths: a plain ASGI layer in front of the FastAPI app for
one POST path of the hot path (FastAPI's request/response machinery costs more per call
than the forwarding itself), with what every fast path shares: reading the body under
its limit, the request's options (deadline, API key: ``gateway/policy``) and an error's
answer from the one error table. ``http_api.py`` (infer) and ``generate.py`` build on it.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from gateway.auth import TokenTable
from gateway.errors import PayloadTooLarge
from gateway.policy.access import presented_token
from gateway.policy.deadline import HTTP_TIMEOUT_HEADER, http_deadline_s
from gateway.python.forwarder import Forwarder, RequestOptions
from gateway.upstream.http import UpstreamHTTP

ASGIScope = dict[str, Any]
ASGIReceive = Callable[[], Awaitable[dict[str, Any]]]
ASGISend = Callable[[dict[str, Any]], Awaitable[None]]


def options_from_headers(headers: Mapping[str, str]) -> RequestOptions:
    """The deadline and API key (:mod:`gateway.policy.deadline`, :mod:`gateway.policy.access`)."""
    return RequestOptions(deadline_s=http_deadline_s(headers.get(HTTP_TIMEOUT_HEADER)),
                          api_key=presented_token(headers.get))


class FastPath:
    """A plain ASGI layer in front of the FastAPI app for one POST path of the hot path;
    every other request falls through to ``app``."""

    path: re.Pattern[str]

    def __init__(self, app: Any, forwarder: Forwarder, upstream: UpstreamHTTP,
                 auth: TokenTable | None = None,
                 max_body_bytes: int = 256 * 1024 * 1024) -> None:
        self.app, self.forwarder, self.upstream = app, forwarder, upstream
        self.auth = auth or TokenTable()
        self.max_body_bytes = max_body_bytes

    def matched(self, scope: ASGIScope) -> re.Match[str] | None:
        match = self.path.match(scope["path"]) if scope["type"] == "http" else None
        return match if match is not None and scope["method"] == "POST" else None


async def read_body(receive: ASGIReceive, limit: int) -> bytes:
    """The whole body, refused (413) as soon as it grows past ``limit``."""
    message = await receive()
    body = message.get("body", b"")
    size = len(body)
    chunks = [body]
    while message.get("more_body") and size <= limit:
        message = await receive()
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
    if size > limit:
        raise PayloadTooLarge(f"request body larger than {limit} bytes")
    return b"".join(chunks)
