"""The gateway's one error hierarchy and its one mapping to HTTP and gRPC status codes.

Both transports call :func:`http_status` / :func:`grpc_status_name`; neither keeps its
own table. gRPC codes are named by string so that the core never imports ``grpc``; the
gRPC adapter turns the name into ``grpc.StatusCode[name]``.

Errors from Triton itself (a wrong shape, an unknown model on the server) are *not*
translated: the transports forward Triton's own status and message, so a client sees
exactly what Triton would have said. Only failures of the gateway or of the connection
to a member become :class:`GatewayError`.
"""

from __future__ import annotations

import json

from gateway.policy.access import WWW_AUTHENTICATE


class GatewayError(Exception):
    """Root of every error the gateway answers on purpose."""

    retry_after_s: float | None = None

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidInput(GatewayError):
    """The request is malformed before it reaches any Triton server."""


class ModelNotFound(GatewayError):
    """No pool serves this model."""


class ModelNotReady(GatewayError):
    """The model exists but is still loading or warming up: try again shortly."""

    def __init__(self, message: str, retry_after_s: float = 1.0, reason: str = "") -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.reason = reason  # which limit (the per-tenant counts' label)


class Unavailable(GatewayError):
    """No healthy member could take the request (connection refused, all ejected)."""

    def __init__(self, message: str, retry_after_s: float | None = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Overloaded(GatewayError):
    """Admission control shed the request; the client should back off."""

    def __init__(self, message: str, retry_after_s: float = 1.0, reason: str = "") -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.reason = reason  # which limit refused it (the per-tenant counts' label)


class DeadlineExceeded(GatewayError):
    """The client's deadline passed before an answer arrived."""


class Unauthorized(GatewayError):
    """No or unknown API token."""


class Forbidden(GatewayError):
    """The token lacks the scope this call needs."""


class Unsupported(GatewayError):
    """A protocol feature the gateway deliberately does not offer (e.g. shared memory)."""


class Conflict(GatewayError):
    """The request clashes with work in progress (a second upload of a model that is
    converting) or with the model's state (deleting the serving version)."""


class PayloadTooLarge(GatewayError):
    """An upload exceeds its size limit; nothing of it is kept."""


class JobNotFound(GatewayError):
    """No conversion job has this id."""


class DeployFailed(GatewayError):
    """A member refused to load a version, or its warm-up failed; the version that was
    serving still serves."""


# error class -> (HTTP status, gRPC status code name). Looked up along the MRO.
ERROR_TABLE: dict[type[GatewayError], tuple[int, str]] = {
    GatewayError: (500, "INTERNAL"),
    InvalidInput: (400, "INVALID_ARGUMENT"),
    ModelNotFound: (404, "NOT_FOUND"),
    ModelNotReady: (503, "UNAVAILABLE"),
    Unavailable: (503, "UNAVAILABLE"),
    Overloaded: (429, "RESOURCE_EXHAUSTED"),
    DeadlineExceeded: (504, "DEADLINE_EXCEEDED"),
    Unauthorized: (401, "UNAUTHENTICATED"),
    Forbidden: (403, "PERMISSION_DENIED"),
    Unsupported: (501, "UNIMPLEMENTED"),
    Conflict: (409, "ABORTED"),
    PayloadTooLarge: (413, "RESOURCE_EXHAUSTED"),
    JobNotFound: (404, "NOT_FOUND"),
    DeployFailed: (500, "INTERNAL"),
}


# gRPC status code numbers (the wire values of ``grpc-status``), fixed by the gRPC spec;
# the HAProxy data plane writes them into the answers it produces itself.
GRPC_CODE_NUMBERS: dict[str, int] = {
    "OK": 0, "CANCELLED": 1, "UNKNOWN": 2, "INVALID_ARGUMENT": 3, "DEADLINE_EXCEEDED": 4,
    "NOT_FOUND": 5, "ALREADY_EXISTS": 6, "PERMISSION_DENIED": 7, "RESOURCE_EXHAUSTED": 8,
    "FAILED_PRECONDITION": 9, "ABORTED": 10, "OUT_OF_RANGE": 11, "UNIMPLEMENTED": 12,
    "INTERNAL": 13, "UNAVAILABLE": 14, "DATA_LOSS": 15, "UNAUTHENTICATED": 16,
}

# error class -> the ``outcome`` label of ``infergate_requests_total`` (and the ``reason``
# of ``infergate_rejected_requests_total``) when the gateway itself answers with it.
OUTCOMES: dict[type[GatewayError], str] = {
    Overloaded: "rejected",
    DeadlineExceeded: "deadline",
    Unavailable: "unavailable",
    ModelNotReady: "not_ready",
}


def outcome_name(error: GatewayError | type[GatewayError]) -> str:
    """The metrics outcome for an answer the gateway produced (``error`` otherwise)."""
    cls = error if isinstance(error, type) else type(error)
    for base in cls.__mro__:
        if base in OUTCOMES:
            return OUTCOMES[base]
    return "error"


# gRPC codes Triton answers for a client's mistake (counted as ``client_error``)
GRPC_CLIENT_CODES = frozenset({3, 5, 6, 7, 9, 11, 12, 16})
GRPC_OUTCOMES = {4: "deadline", 8: "rejected", 14: "unavailable"}
# the outcome of a request whose client gave up before its answer
CANCELLED_OUTCOME = "cancelled"


def outcome_of_answer(http_status: int, grpc_status: int | None = None) -> str:
    """The metrics outcome of an answer relayed from Triton (HTTP status, or gRPC's
    ``grpc-status`` when it has one)."""
    if grpc_status is not None:
        if grpc_status == 0:
            return "success"
        if grpc_status in GRPC_CLIENT_CODES:
            return "client_error"
        return GRPC_OUTCOMES.get(grpc_status, "upstream_error")
    if http_status < 400:
        return "success"
    return "client_error" if http_status < 500 else "upstream_error"


def grpc_code_number(error: GatewayError | type[GatewayError]) -> int:
    return GRPC_CODE_NUMBERS[_lookup_class(error if isinstance(error, type) else type(error))[1]]


def _lookup_class(cls: type[GatewayError]) -> tuple[int, str]:
    for base in cls.__mro__:
        if base in ERROR_TABLE:
            return ERROR_TABLE[base]
    return ERROR_TABLE[GatewayError]


def http_status_of(cls: type[GatewayError]) -> int:
    return _lookup_class(cls)[0]


def _lookup(error: GatewayError) -> tuple[int, str]:
    return _lookup_class(type(error))


def http_status(error: GatewayError) -> int:
    return _lookup(error)[0]


def grpc_status_name(error: GatewayError) -> str:
    return _lookup(error)[1]


def error_answer(error: GatewayError) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    headers = [(b"content-type", b"application/json")]
    if error.retry_after_s is not None:
        headers.append((b"retry-after", str(max(1, round(error.retry_after_s))).encode()))
    if isinstance(error, Unauthorized):
        headers.append((b"www-authenticate", WWW_AUTHENTICATE.encode()))
    return http_status(error), json.dumps({"error": error.message}).encode(), headers
