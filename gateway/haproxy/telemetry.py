"""Per-request telemetry from HAProxy: one log line per inference request, streamed
from HAProxy's ring buffer to a loopback TCP port this process reads (from processes
of its own user only), counted into the gateway's ``infergate_*`` metrics (same names,
labels and meaning as the Python data plane's).

The line (``frontend.LOG_FORMAT``): ``model pool proto status grpc_status Ta outcome
termination tenant class reason version Tw deadline`` (tenant, class and reason ``-``
without tenants; ``reason``: which limit refused it; ``version``: the one a rollout
pinned the request to, else ``-``; ``Tw``: milliseconds it waited in a backend's queue
for a member's slot, ``infergate_tenant_queue_wait_seconds``, -1 when it never reached
one; ``deadline``: the client's, in milliseconds, ``-`` without one; ``status`` -1: no
answer was sent, as for a call its client cancelled, counted ``cancelled``, or
``deadline`` when its deadline had come: ``deadline.given_up_at_deadline``).
This runs beside the hot path, in a thread, after HAProxy has answered: a few
microseconds of Python per request, never in the request's way.
Latency is HAProxy's ``%Ta``: the request's active time, from its first byte to the
response's last, without the time its keep-alive connection sat idle before it; in
HAProxy's resolution, whole milliseconds (truncated), recorded as the middle of that
millisecond.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.errors import CANCELLED_OUTCOME, outcome_of_answer
from gateway.metrics import GatewayMetrics, observe_many
from gateway.policy import deadline
from gateway.telemetry import VersionTally

log = logging.getLogger(__name__)
# outcomes HAProxy decided itself (``txn.out``); auth failures and unknown models are not
# inference outcomes, as on the Python data plane
NOTE_EVERY_S = 0.25
SMALL_CHUNK, GATHER_S = 16384, 0.02
LOCAL_OUTCOMES = {"rejected": "rejected", "not_ready": "not_ready", "shed": "deadline"}
NOT_COUNTED = {"auth", "unknown", "too_large"}
GIVEN_UP = ("c", "C")  # termination states the client ended (timeout or abort)


def classify(proto: str, status: int, grpc_status: str, local: str, termination: str,
             active_ms: int = 0, deadline_ms: int | None = None) -> str | None:
    """The ``outcome`` label of one logged request, or None when it is not counted;
    ``active_ms`` (%Ta) and the client's ``deadline_ms`` tell a client that gave up at its
    deadline from one that gave up before."""
    if local in NOT_COUNTED:
        return None
    if local in LOCAL_OUTCOMES:
        return LOCAL_OUTCOMES[local]
    if proto == "grpc" and status == 200 and grpc_status.isdigit():
        # the answer's own status reached the client, whatever ended the stream after it
        # (Triton at its deadline sends its status, then resets: logged SD)
        return outcome_of_answer(status, int(grpc_status))
    first = termination[:1]
    if first == "s" or status == 504:
        return "deadline"  # the server timeout is the client's deadline
    if first in ("S", "P") or status == 503 and grpc_status == "-":
        return "unavailable"
    if first in GIVEN_UP:
        return "deadline" if deadline.given_up_at_deadline(active_ms, deadline_ms) \
            else CANCELLED_OUTCOME
    if status < 0:  # no answer at all (HAProxy logs -1), and not the client's doing
        return "unavailable"
    return outcome_of_answer(status)


class RequestLog:
    """Counts parsed lines into the metrics; children cached per label set."""

    def __init__(self, metrics: GatewayMetrics,
                 on_served: Callable[[set[str]], None] | None = None,
                 tally: VersionTally | None = None) -> None:
        self.metrics = metrics
        self.tally = tally  # a rollout's answers per version (pinned requests only)
        self.on_served = on_served  # models that served user requests, per chunk
        self._noted: dict[str, float] = {}  # model -> when on_served last told about it
        self._children: dict[tuple[str, ...], Any] = {}
        self.lines = 0

    def _child(self, key: tuple[str, ...]) -> Any:
        child = self._children.get(key)
        if child is None:
            kind, *labels = key
            m = self.metrics
            family = {"requests": m.requests, "latency": m.latency, "rejected": m.rejected,
                      "t_requests": m.tenant_requests, "t_refused": m.tenant_refused,
                      "t_latency": m.tenant_latency, "t_queue": m.tenant_queue_wait}[kind]
            child = self._children[key] = family.labels(*labels)
        return child

    def record(self, line: str, count: int = 1) -> str | None:
        """``count`` requests that logged this same line; their outcome."""
        fields = line.split()
        if len(fields) < 8:
            return None
        model, pool, proto, status_text, gs, active_ms, local, termination = fields[:8]
        # -1: no answer was sent (a gRPC call its client cancelled while Triton held it)
        if model == "-" or not status_text.removeprefix("-").isdigit():
            return None
        self.lines += count
        tenant, priority, reason, version, queued_ms, deadline_text = (fields + ["-"] * 6)[8:14]
        active = int(active_ms) if active_ms.lstrip("-").isdigit() else 0
        outcome = classify(proto, int(status_text), gs, local, termination, active,
                           int(deadline_text) if deadline_text.isdigit() else None)
        if outcome is None:
            return None
        tenant_known = tenant != "-" and priority != "-"
        self._child(("requests", model, pool, proto, outcome, "user")).inc(count)
        if tenant_known:
            self._child(("t_requests", tenant, priority, outcome)).inc(count)
        if local in LOCAL_OUTCOMES:  # refused by the gateway itself
            self._child(("rejected", model, outcome)).inc(count)
            if tenant_known and reason != "-":
                self._child(("t_refused", tenant, priority, reason)).inc(count)
        elif pool != "-" and termination[:1] not in GIVEN_UP and active_ms.lstrip("-").isdigit():
            # (a request its client gave up on has no latency of the gateway's: the
            # client's patience; the Python plane observes none either)
            # whole milliseconds, truncated: the middle of that millisecond, an unbiased
            # figure (the truncated one is half a millisecond low on average)
            seconds = (max(0, int(active_ms)) + 0.5) / 1e3
            observe_many(self._child(("latency", model, pool, proto, "user")), seconds, count)
            if tenant_known:
                observe_many(self._child(("t_latency", tenant, priority)), seconds, count)
                if queued_ms.isdigit():  # -1: never queued (refused before)
                    observe_many(self._child(("t_queue", tenant, priority)),
                                 int(queued_ms) / 1e3, count)
            if version.isdigit() and self.tally is not None:
                self.tally.record(model, int(version), outcome == "success", seconds,
                                  time.monotonic(), count)
        return outcome

    def record_chunk(self, lines: list[bytes]) -> None:
        """Identical lines (same model, outcome, millisecond) are counted together: under
        load a chunk holds thousands of lines and only a few dozen distinct ones."""
        served: set[str] = set()
        for line, count in Counter(lines).items():
            if line and self.record(line.decode("utf-8", "replace"), count) == "success":
                served.add(line.split(b" ", 1)[0].decode("utf-8", "replace"))
        if served and self.on_served is not None:
            now = time.monotonic()  # keep-warm's clock needs seconds, not every request
            fresh = {m for m in served if now - self._noted.get(m, -1.0) >= NOTE_EVERY_S}
            if fresh:
                self._noted.update(dict.fromkeys(fresh, now))
                self.on_served(fresh)


def _proc_net_tcp_address(host: str, port: int) -> str:
    """``127.0.0.1:8000`` as Linux's /proc/net/tcp writes it (``0100007F:1F40`` here)."""
    return f"{int.from_bytes(socket.inet_aton(host), sys.byteorder):08X}:{port:04X}"


def tcp_peer_uid(peer: tuple[str, int], local: tuple[str, int],
                 table: Path = Path("/proc/net/tcp")) -> int | None:
    """The user owning the IPv4 socket at ``peer`` connected to ``local`` (None when the
    kernel lists none: it closed meanwhile)."""
    want = (_proc_net_tcp_address(*peer), _proc_net_tcp_address(*local))
    with contextlib.suppress(OSError):
        for line in table.read_text().splitlines()[1:]:
            fields = line.split()  # sl local rem st tx:rx tr:when retrnsmt uid ...
            if len(fields) > 7 and (fields[1], fields[2]) == want:
                return int(fields[7])
    return None


class LogReceiver:
    """Listens on the loopback TCP address HAProxy's ring forwards to (one connection per
    HAProxy worker: a reload brings a new one) and feeds :class:`RequestLog`, line by
    line. A loopback port is open to every local user where the unix socket it replaces
    was this user's alone: a connection from another user's process is closed unread
    (its lines would be counted as served requests)."""

    def __init__(self, address: str, request_log: RequestLog) -> None:
        host, _, port = address.rpartition(":")
        self.address = (host, int(port))
        self.request_log = request_log
        self._sock: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()  # RequestLog's caches are not shared across readers

    def start(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(self.address)
        sock.listen(8)
        self._sock = sock
        self._spawn(self._accept_loop, "haproxy-log-accept")

    def _spawn(self, target: Any, name: str, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        sock = self._sock
        assert sock is not None
        while True:
            try:
                conn, peer = sock.accept()
            except OSError:
                return  # closed
            if tcp_peer_uid(peer, self.address) != os.getuid():
                log.warning("telemetry: refused a connection from %s:%d (not this user's)",
                            *peer)
                conn.close()
                continue
            self._spawn(self._read_loop, "haproxy-log", conn)

    def _read_loop(self, conn: socket.socket) -> None:
        pending = b""
        with conn:
            while True:
                try:
                    data = conn.recv(262144)
                except OSError:
                    return
                if not data:
                    return
                *lines, pending = (pending + data).split(b"\n")
                with self._lock:
                    try:
                        self.request_log.record_chunk(lines)
                    except Exception:  # noqa: BLE001 - bad lines must not stop the counting
                        log.exception("bad HAProxy log lines %r", lines[:3])
                if len(data) < SMALL_CHUNK:
                    # let lines gather in HAProxy's ring: a wake-up per request at low
                    # rates costs more than the counting (metrics lag by this much)
                    time.sleep(GATHER_S)

    def stop(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
            self._sock = None
