"""Triton's answers to requests it cannot parse, turned into the client errors they are.

Triton answers a body it cannot parse (``{not json``, an output ``name`` that is an
object, protobuf bytes that do not decode) with HTTP 500 / gRPC ``INTERNAL``: a server
error for a client's mistake. The gateway answers 400 / ``INVALID_ARGUMENT`` with
Triton's own message instead.

A request Triton's queue dropped because its timeout expired (the client's deadline,
or the model's SLO: ``converters/triton_config.py``'s queue policy) is answered 503 /
``UNAVAILABLE`` "Request timeout expired": for the client its deadline passed, 504 /
``DEADLINE_EXCEEDED`` (:data:`QUEUE_TIMEOUT`).

Likewise a ``Content-Encoding`` Triton does not know (501 "Unsupported compression
type"): 400. And a repository load of a model the repository lacks (Triton: 500 / INTERNAL
"failed to load 'm', failed to poll from model repository"): 404 / ``NOT_FOUND``.

Triton gives no status that tells these apart from its real internal errors, so this is
the one place where the gateway matches Triton's message text (by prefix; the load
failure by its fixed tail), and only on a 500 / ``INTERNAL``. The Python adapters use
:func:`http_status` and :func:`grpc_code`; HAProxy's ``http-response`` rules
(``gateway/haproxy/backends.py``) are built from :data:`PREFIXES` (inference only: the
repository calls reach the control plane). Checked against tritonserver 2.51's
messages by ``tests/fuzz`` and ``tests/gateway/test_compat.py``.
"""

from __future__ import annotations

# the start of Triton's message for a request it could not parse (HTTP JSON body or
# gRPC message; "request params": a JSON value of the wrong type in the body; "parameter
# key": a "parameters" key holding a NUL, which Triton's lookup cuts short)
PREFIXES = ("failed to parse", "Unable to parse", "failed to get request params",
            "parameter key ")
HTTP_BODY_START = b'{"error":"'  # Triton's HTTP error body: {"error":"<message>"}
NOT_IN_REPOSITORY = "failed to poll from model repository"
UNKNOWN_ENCODING = "Unsupported compression type"  # Triton's 501 for a Content-Encoding
QUEUE_TIMEOUT = "Request timeout expired"  # Triton's 503 / UNAVAILABLE: dropped from its queue


def is_parse_error(message: str) -> bool:
    return message.startswith(PREFIXES)


def http_status(status: int, body: bytes) -> int:
    """400 for Triton's 500 about an unparseable request (and its 501 for an unknown
    Content-Encoding), 504 for its 503 of a request its queue dropped; any other status
    as it is."""
    if status not in (500, 501, 503) or not body.startswith(HTTP_BODY_START):
        return status
    message = body[len(HTTP_BODY_START):].decode("utf-8", "replace")
    if status == 503:
        return 504 if message.startswith(QUEUE_TIMEOUT) else status
    if status == 501:
        return 400 if message.startswith(UNKNOWN_ENCODING) else status
    if is_parse_error(message):
        return 400
    return 404 if NOT_IN_REPOSITORY in message else status


def grpc_code(code: str, details: str) -> str:
    """By status name (``grpc.StatusCode``'s): INVALID_ARGUMENT for Triton's INTERNAL
    about an unparseable request, DEADLINE_EXCEEDED for its UNAVAILABLE of a request its
    queue dropped; any other as it is."""
    if code == "UNAVAILABLE":
        return "DEADLINE_EXCEEDED" if details.startswith(QUEUE_TIMEOUT) else code
    if code != "INTERNAL":
        return code
    if is_parse_error(details):
        return "INVALID_ARGUMENT"
    return "NOT_FOUND" if NOT_IN_REPOSITORY in details else code


# Triton quotes requests back in its messages (a 10,000-dimension shape in full); gRPC
# clients refuse a status message above 16 KiB (their metadata limit), so a relayed
# message is cut well below it
MAX_MESSAGE_CHARS = 4096


def bounded(message: str) -> str:
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    return message[:MAX_MESSAGE_CHARS] + f"... ({len(message)} characters, cut)"
