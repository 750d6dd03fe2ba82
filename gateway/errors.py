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

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Unavailable(GatewayError):
    """No healthy member could take the request (connection refused, all ejected)."""

    def __init__(self, message: str, retry_after_s: float | None = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Overloaded(GatewayError):
    """Admission control shed the request; the client should back off."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


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


def _lookup(error: GatewayError) -> tuple[int, str]:
    for cls in type(error).__mro__:
        if cls in ERROR_TABLE:
            return ERROR_TABLE[cls]
    return ERROR_TABLE[GatewayError]


def http_status(error: GatewayError) -> int:
    return _lookup(error)[0]


def grpc_status_name(error: GatewayError) -> str:
    return _lookup(error)[1]
