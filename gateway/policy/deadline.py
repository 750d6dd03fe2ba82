"""The client's deadline: how long a request may take, as each protocol says it.

- HTTP has no standard header; ours is ``X-Request-Timeout-Ms``: a whole number of
  milliseconds from 1 to 999,999,999, written without sign, fraction or leading zero.
  Anything else is the client's mistake (400): a deadline the gateway would silently
  ignore is worse than none.
- gRPC says it in ``grpc-timeout`` (up to 8 digits and a unit, gRPC's wire format): the
  Python plane's gRPC server reads it, HAProxy maps each unit below.

Both data planes read this module: the Python forwarder calls :func:`http_deadline_s`,
HAProxy's rules match :data:`HTTP_TIMEOUT_PATTERN` and convert with
:data:`GRPC_TIMEOUT_MS_CONVERTERS` (``gateway/haproxy/request_rules.py``).

**Hopeless work is shed** (:func:`expected_ms`): a request with a deadline that the
pool it was routed to cannot meet is refused at once, 504 / DEADLINE_EXCEEDED with
:data:`HOPELESS`, before Triton spends anything on it (every deadline answer of the
gateway's own begins "Deadline Exceeded", :data:`EXCEEDED`, as gRPC's and Triton's
do). The expected time is the model's service time *S* in that pool plus its wait:
each of the ``load + 1 - capacity`` requests beyond what the pool executes at once waits
for one request's worth of the pool's throughput (*drain*). Both come from Triton's own
counters, read every probe round (``gateway/control/probes.py``): *S* is the compute
time per request (``nv_inference_compute_{input,infer,output}_duration_us`` over
``nv_inference_request_success``) of the last round with answers, within
:data:`FRESH_S`; *drain* is the slower of *S* over the pool's capacity and one over the
most answers per second the pool gave the model within :data:`PEAK_WINDOW_S` (its
throughput when busy: a pool that executes fewer at once than its capacity says). A
model with no fresh service time is never refused so: a pool that shed every request
for a while (no answers, nothing measured) lets requests through again and measures
anew, so a service time measured in a burst (large batches) cannot keep refusing
everything after it. Both planes compute it in integers, the same way
(HAProxy's ``mul``/``div``). Admitted requests carry the deadline on: HAProxy as the
member's server timeout, the Python plane also as Triton's per-request ``timeout``
(honoured for models with a queue policy; HAProxy cannot change a request's body).
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


# every answer the gateway gives for a deadline begins with gRPC's own words for it (what
# a client's deadline, and Triton, say), then the gateway's reason: Triton's clients and
# QA tests look for them
EXCEEDED = "Deadline Exceeded"
HOPELESS = (EXCEEDED + ": deadline of {deadline} ms cannot be met: model '{model}' is "
            "expected to take {expected} ms in pool '{pool}' (load {load} for capacity "
            "{capacity}), more than 9/10 of it; refused before Triton does the work")
EXPIRED = EXCEEDED + ": the deadline passed before the request was admitted"
NO_ANSWER = EXCEEDED + ": no answer from member {member} in time"
# a request is admitted when it is expected within this share of its deadline: the rest
# is for what the estimate leaves out (the answer's way back, connections, a busy host)
SHARE_NUM, SHARE_DEN = 9, 10
# the most of its deadline a request waiting for a model's load may wait, and only while
# that load is under way and expected to end in time: past this, its refusal (or the
# answer, once the model is resident) must still reach the client before its own
# deadline fires
LAST_NUM, LAST_DEN = 19, 20


def last_share_s(seconds: float) -> float:
    """The most of ``seconds`` a request waiting for a load may wait (:data:`LAST_NUM` /
    :data:`LAST_DEN`): the waiting room's bound, and the replica's and the control
    plane's on a replica's miss."""
    return seconds * LAST_NUM / LAST_DEN


# a service time measured longer ago than this is not the service now; the throughput
# of the busiest round within PEAK_WINDOW_S is the pool's when busy
FRESH_S, PEAK_WINDOW_S = 5.0, 60.0


def expected_ms(service_us: int, load: int, capacity: int, drain_us: int) -> int:
    """Milliseconds a request is expected to take in a pool with ``load`` requests in it
    (this one not counted) that executes ``capacity`` at once: its service time plus
    ``drain_us`` for each request ahead of it beyond that."""
    wait = drain_us * max(0, load + 1 - max(1, capacity))
    return (service_us + wait) // 1000


def hopeless(deadline_ms: int, expected: int) -> bool:
    """Expected beyond 9/10 of the deadline (:data:`SHARE_NUM` / :data:`SHARE_DEN`), in
    integers as HAProxy compares them."""
    return expected * SHARE_DEN > deadline_ms * SHARE_NUM


# Triton's queue gets this share of what is left of a deadline (its ``timeout``
# parameter): its answer (the drop, "Request timeout expired") must reach the gateway
# before the gateway's own timer for the call ends it with a less telling 504
TRITON_SHARE = 0.9


def triton_timeout_us(deadline_s: float) -> int:
    """Triton's per-request ``timeout`` (microseconds) for a deadline ``deadline_s`` away."""
    return max(1, int(deadline_s * TRITON_SHARE * 1e6))


def service_quantum(us: float) -> int:
    """A measured service time kept to two significant digits: HAProxy's map changes
    when the figure does, not with every microsecond of noise."""
    value = max(1, round(us))
    scale = 10 ** max(0, len(str(value)) - 2)
    return round(value / scale) * scale


# **A call whose client's deadline passed is counted ``deadline``**, whoever ended it:
# Triton's queue, the gateway's timer, or the client's own timer (its cancellation
# reaches the gateway at about the deadline: a gRPC client ends a call at its deadline
# itself). A cancellation counts as the deadline's when it comes no earlier than this
# before the deadline (the client's clock and the gateway's differ by the request's way
# there and the cancellation's way back): the smaller of AT_DEADLINE_MS and a tenth of
# the deadline. Earlier, the client gave up (``cancelled``). Both planes decide with
# :func:`given_up_at_deadline`: the Python forwarder in seconds, HAProxy's log lines in
# whole milliseconds (%Ta against the deadline it logs).
AT_DEADLINE_MS = 50


def given_up_at_deadline(elapsed_ms: float, deadline_ms: float | None) -> bool:
    """Whether a call its client cancelled after ``elapsed_ms`` ended at its deadline
    (``deadline_ms`` from when the gateway received it; None: no deadline)."""
    if deadline_ms is None:
        return False
    return elapsed_ms >= deadline_ms - min(AT_DEADLINE_MS, deadline_ms / 10)


# **A gRPC stream the control plane relays behind HAProxy ends at the client's deadline
# by the client's own timer**, not the gateway's: HAProxy 2.6 turns a server's end of a
# stream whose client still has its side open into RST_STREAM(CANCEL) right after the
# trailers (haproxy/haproxy#1219), and a client that reads the reset before the trailers
# reports "Stream removed (RST_STREAM ... error code 8)" instead of "Deadline Exceeded".
# HAProxy gives the control plane the client's deadline plus STREAM_GRACE_MS (its
# ``grpc-timeout``) and says the grace in GRACE_HEADER; the control plane then waits,
# and asks the member to wait, that much longer, so the client's own timer (which fires
# first) ends the stream, as straight to Triton. A client that ignores its own deadline
# is ended STREAM_GRACE_MS after it. The Python data plane's front door needs none: its
# gRPC server's end of a stream reaches the client intact.
STREAM_GRACE_MS = 1000
GRACE_HEADER = "x-infergate-deadline-grace-ms"
# the longest deadline (milliseconds) a grace is added to: grpc-timeout takes 8 digits
GRACE_MAX_DEADLINE_MS = 10 ** 8 - 1 - STREAM_GRACE_MS


def grace_s(value: str | None) -> float:
    """The grace HAProxy said in GRACE_HEADER, in seconds; 0 without one (or a value that
    is not a whole number of milliseconds up to STREAM_GRACE_MS)."""
    if value is None or not value.isdigit() or int(value) > STREAM_GRACE_MS:
        return 0.0
    return int(value) / 1e3
