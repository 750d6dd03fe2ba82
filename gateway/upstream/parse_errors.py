"""Triton's answers to requests it cannot parse, turned into the client errors they are.

Triton answers a body it cannot parse (``{not json``, an output ``name`` that is an
object, protobuf bytes that do not decode) with HTTP 500 / gRPC ``INTERNAL``: a server
error for a client's mistake. The gateway answers 400 / ``INVALID_ARGUMENT`` with
Triton's own message instead.

Triton gives no status that tells these apart from its real internal errors, so this is
the one place where the gateway matches Triton's message text, by prefix, and only on a
500 / ``INTERNAL``. Both data planes use these prefixes: the Python adapters through
:func:`http_status` and :func:`grpc_code`, HAProxy through the ``http-response`` rules
``gateway/haproxy/render.py`` builds from :data:`PREFIXES` (checked against
tritonserver 2.51's messages by ``tests/fuzz``).
"""

from __future__ import annotations

import grpc

# the start of Triton's message for a request it could not parse (HTTP JSON body or
# gRPC message); Triton writes both spellings
PREFIXES = ("failed to parse", "Unable to parse")
HTTP_BODY_START = b'{"error":"'  # Triton's HTTP error body: {"error":"<message>"}


def is_parse_error(message: str) -> bool:
    return message.startswith(PREFIXES)


def http_status(status: int, body: bytes) -> int:
    """400 for Triton's 500 about an unparseable request; any other status as it is."""
    message = body[len(HTTP_BODY_START):].decode("utf-8", "replace")
    if status == 500 and body.startswith(HTTP_BODY_START) and is_parse_error(message):
        return 400
    return status


def grpc_code(code: grpc.StatusCode, details: str) -> grpc.StatusCode:
    """INVALID_ARGUMENT for Triton's INTERNAL about an unparseable request."""
    if code == grpc.StatusCode.INTERNAL and is_parse_error(details):
        return grpc.StatusCode.INVALID_ARGUMENT
    return code
