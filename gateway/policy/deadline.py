"""The client's deadline: how long a request may take, as each protocol says it.

- HTTP has no standard header; ours is ``X-Request-Timeout-Ms``: a whole number of
  milliseconds from 1 to 999,999,999, written without sign, fraction or leading zero.
  Anything else is the client's mistake (400): a deadline the gateway would silently
  ignore is worse than none.
- gRPC says it in ``grpc-timeout`` (up to 8 digits and a unit, gRPC's wire format): the
  Python plane's gRPC server reads it, HAProxy maps each unit below.

Both data planes read this module: the Python forwarder calls :func:`http_deadline_s`,
HAProxy's rules match :data:`HTTP_TIMEOUT_PATTERN` and convert with
:data:`GRPC_TIMEOUT_MS_CONVERTERS` (``gateway/haproxy/config.py``).
"""

from __future__ import annotations

import re

from gateway.errors import InvalidInput

HTTP_TIMEOUT_HEADER = "x-request-timeout-ms"
HTTP_TIMEOUT_PATTERN = r"^[1-9][0-9]{0,8}$"
BAD_HTTP_TIMEOUT = ("X-Request-Timeout-Ms must be a whole number of milliseconds from 1 to "
                    "999999999, got '{value}'")
_HTTP_TIMEOUT = re.compile(HTTP_TIMEOUT_PATTERN)

GRPC_TIMEOUT_PATTERN = r"^[0-9]{1,8}[HMSmun]$"
# grpc-timeout's unit -> HAProxy converters from its digits to milliseconds (rounded up:
# a deadline of a few microseconds is still a deadline)
GRPC_TIMEOUT_MS_CONVERTERS = {"H": ",mul(3600000)", "M": ",mul(60000)", "S": ",mul(1000)",
                              "m": "", "u": ",div(1000),add(1)", "n": ",div(1000000),add(1)"}


def http_deadline_s(value: str | None) -> float | None:
    """Seconds the client allows (``X-Request-Timeout-Ms``), None without the header;
    InvalidInput for a value that is not a valid deadline."""
    if value is None:
        return None
    if not _HTTP_TIMEOUT.fullmatch(value):
        raise InvalidInput(BAD_HTTP_TIMEOUT.format(value=value[:64]))
    return int(value) / 1e3
