"""What HAProxy answers itself, built from ``gateway.errors``' one table (pure, no I/O).

``http-request return`` actions for the frontends' rules (:func:`http_return`,
:func:`grpc_return`; :mod:`gateway.haproxy.config` places them), and one error file per
status HAProxy may produce on its own (:data:`LOCAL_ERRORS`, :func:`error_files`), for
the ``http-errors`` sections.
"""

from __future__ import annotations

from http import HTTPStatus

from gateway import errors
from gateway.policy import access, deadline


def http_return(error: type[errors.GatewayError], message_lf: str,
                retry_after: int | None = None) -> str:
    """``http-request return`` for the HTTP frontend; ``message_lf`` is log-format text
    already escaped for a JSON string inside a quoted HAProxy argument."""
    hdrs = f" hdr retry-after {retry_after}" if retry_after is not None else ""
    if error is errors.Unauthorized:
        hdrs += ' hdr www-authenticate "' + access.WWW_AUTHENTICATE.replace('"', '\\"') + '"'
    body = '{\\"error\\":\\"' + message_lf + '\\"}'
    return (f"http-request return status {errors.http_status_of(error)} "
            f'content-type application/json{hdrs} lf-string "{body}"')


def grpc_return(error: type[errors.GatewayError], message_lf: str,
                retry_after: int | None = None) -> str:
    """A trailers-only gRPC answer: HTTP 200, ``grpc-status`` and ``grpc-message``. Its
    ``content-type`` comes from the gRPC frontend's ``http-after-response`` rule
    (:mod:`gateway.haproxy.frontend`): HAProxy ignores one given to a return without
    payload, and warns of each at start."""
    hdrs = f" hdr retry-after {retry_after}" if retry_after is not None else ""
    return (f"http-request return status 200 "
            f"hdr grpc-status {errors.grpc_code_number(error)} "
            f'hdr grpc-message "{message_lf}"{hdrs}')


# status HAProxy may produce itself -> (error class, message)
LOCAL_ERRORS: dict[int, tuple[type[errors.GatewayError], str]] = {
    400: (errors.InvalidInput, "malformed HTTP request"),
    403: (errors.Forbidden, "request denied"),
    408: (errors.DeadlineExceeded, "the request was not received in time"),
    413: (errors.PayloadTooLarge, "request too large"),
    500: (errors.GatewayError, "internal error in the gateway's data plane"),
    502: (errors.Unavailable, "invalid or no answer from the Triton member"),
    503: (errors.Unavailable, "no healthy Triton member could take the request"),
    504: (errors.DeadlineExceeded,
          deadline.EXCEEDED + ": no answer from the Triton member in time"),
}


# what a data-plane replica answers for a call to the control plane while it cannot be
# reached (gateway/policy/planes.py): it names the control plane, never the members
CONTROL_DOWN = ("the gateway's control plane cannot be reached now (the lifecycle API, the "
                "console and the repository API wait for it; inference goes on)")
CONTROL_ERRORS: dict[int, tuple[type[errors.GatewayError], str]] = {
    502: (errors.Unavailable, CONTROL_DOWN),
    503: (errors.Unavailable, CONTROL_DOWN),
    504: (errors.Unavailable, "the gateway's control plane did not answer in time"),
}


def error_files() -> dict[str, str]:
    """One file per status HAProxy may produce; each answers with the error table's
    status and code (a 502 from a broken member is the table's 503, say). ``control_``
    files: a replica's backends toward the control plane (:data:`CONTROL_ERRORS`)."""
    files = {}
    for prefix, table in (("", LOCAL_ERRORS), ("control_", {**LOCAL_ERRORS, **CONTROL_ERRORS})):
        for status, (error, message) in table.items():
            files[f"{prefix}http-{status}.http"] = _http_file(error, message)
            files[f"{prefix}grpc-{status}.http"] = _grpc_file(error, message)
    return files


def _http_file(error: type[errors.GatewayError], message: str) -> str:
    body = '{"error": "' + message + '"}'
    code = errors.http_status_of(error)
    retry = "retry-after: 1\r\n" if code == 503 else ""
    return (f"HTTP/1.1 {code} {HTTPStatus(code).phrase}\r\ncontent-type: application/json\r\n"
            f"{retry}content-length: {len(body)}\r\ncache-control: no-cache\r\n\r\n{body}")


def _grpc_file(error: type[errors.GatewayError], message: str) -> str:
    return ("HTTP/1.1 200 OK\r\ncontent-type: application/grpc\r\n"
            f"grpc-status: {errors.grpc_code_number(error)}\r\ngrpc-message: {message}\r\n"
            "content-length: 0\r\n\r\n")
