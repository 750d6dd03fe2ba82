"""``gateway serve --data-plane haproxy`` on one node: the cluster's process layout.

In a cluster each data-plane replica runs HAProxy and the agent with its own Python
forwarder (``gateway/agent.py``), and the control plane runs no forwarder. On one node
``gateway serve`` keeps the same split so that the control plane's process can crash
without taking a stream, a ``generate``, a miss or a health call with it:

- HAProxy, programmed by this process, outlives it (``HAProxyProcess(detached=True)``)
  and a restart adopts it through its master socket;
- the replica's forwarder runs in a process of its own, ``gateway agent --no-haproxy``
  (:class:`LocalReplica`), started in a session of its own so that it outlives this
  process too, and adopted by a restart (its pid in the run folder). It follows the
  control plane's snapshots as a cluster's replica does, and routes on its last one
  while the control plane is away;
- this process runs the control plane alone, and keeps the replica running: one that
  exits (a crash, a port another process took) is started again (:meth:`LocalReplica.tend`,
  :class:`RestartBackoff`), its log's last lines in this process's log.

The addresses all three use must survive a restart: they are chosen once and kept in
the run folder (:func:`local_layout`), with the token the replica presents to the
control plane when auth is on (the folder is private to this user).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from gateway.embedded import CLOSE_S
from gateway.files import write_atomically
from gateway.netaddr import free_ports

log = logging.getLogger(__name__)
LAYOUT_FILE = "local-layout.json"
PID_FILE = "replica.pid"
REPLICA_TOKEN_NAME = "data-plane-replica"  # (its principal's name in the token table)
STOP_GRACE_S = 5.0  # after its own drain, the replica's servers close within this
RESTART_FIRST_S = 1.0  # a replica that exited starts again this long after, at first
RESTART_MAX_S = 30.0  # the longest wait while it keeps exiting
STABLE_S = 60.0  # one that ran this long before it exited starts the waits over
LOG_TAIL_CHARS = 800  # of the replica's log, quoted when it exits


@dataclass(frozen=True)
class LocalLayout:
    """The loopback ports of the control plane's servers and of the replica's forwarder,
    the replica's status port (its ``/metrics``), and the replica's admin token."""

    control_http: int
    control_grpc: int
    replica_http: int
    replica_grpc: int
    replica_status: int
    token: str


def local_layout(run_dir: Path, taken: tuple[int, ...] = ()) -> LocalLayout:
    """The layout kept in ``run_dir``, or a new one (free ports, none of them ``taken``,
    the ports the gateway serves on; a fresh token) written there for the next start."""
    path = run_dir / LAYOUT_FILE
    with contextlib.suppress(OSError, ValueError, TypeError):
        return LocalLayout(**json.loads(path.read_text()))
    control_http, control_grpc, replica_http, replica_grpc, status = free_ports(5, taken=taken)
    layout = LocalLayout(control_http, control_grpc, replica_http, replica_grpc, status,
                         secrets.token_urlsafe(32))
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_atomically(path, json.dumps(asdict(layout)), mode=0o600)  # (holds a token)
    return layout


@dataclass(frozen=True)
class ReplicaOptions:
    drain_timeout_s: float = 10.0
    max_request_bytes: int = 256 * 1024 * 1024
    log_level: str = "warning"
    auth: bool = False  # the control plane checks tokens: the replica presents its own


@dataclass
class RestartBackoff:
    """When to start again a replica that exited (pure: the caller gives the time):
    :data:`RESTART_FIRST_S` after its exit, the wait doubling up to :data:`RESTART_MAX_S`
    each time one exits within :data:`STABLE_S` of its start (a port another process
    holds fails every start: its log is not flooded), from the first wait again after
    one that ran longer."""

    wait_s: float = 0.0
    started_at: float = -math.inf

    def start_at(self, exited_at: float) -> float:
        """The time to start a replica that exited at ``exited_at``."""
        if exited_at - self.started_at >= STABLE_S:
            self.wait_s = RESTART_FIRST_S
        else:
            self.wait_s = min(RESTART_MAX_S, max(RESTART_FIRST_S, 2 * self.wait_s))
        return exited_at + self.wait_s

    def started(self, now: float) -> None:
        self.started_at = now


class LocalReplica:
    """The replica's process: started, or adopted when a previous control plane's is
    still running; started again when it exits (:meth:`tend`); stopped after a drain
    of its own (SIGTERM)."""

    def __init__(self, run_dir: Path, layout: LocalLayout, options: ReplicaOptions) -> None:
        self.run_dir = run_dir
        self.layout = layout
        self.options = options
        self.state_dir = run_dir / "replica"
        self.pid: int | None = None
        self._child: subprocess.Popen[bytes] | None = None  # when this process started it
        self.adopted = False
        self.backoff = RestartBackoff()
        self._restart_at: float | None = None  # while the one that exited waits
        self._stop_sent: float | None = None  # when begin_stop sent SIGTERM (monotonic)

    def command(self) -> list[str]:
        layout, options = self.layout, self.options
        return [sys.executable, "-m", "gateway", "agent", "--no-haproxy",
                "--control-plane", f"127.0.0.1:{layout.control_http}",
                "--control-grpc", f"127.0.0.1:{layout.control_grpc}",
                "--state-dir", str(self.state_dir), "--host", "127.0.0.1",
                "--http-port", str(layout.replica_http),
                "--grpc-port", str(layout.replica_grpc),
                "--status-port", str(layout.replica_status),
                "--max-request-bytes", str(options.max_request_bytes),
                "--drain-timeout", str(options.drain_timeout_s),
                "--log-level", options.log_level]

    def _running(self) -> int | None:
        """The pid of the replica a previous start left running on this run folder."""
        with contextlib.suppress(OSError, ValueError):
            pid = int((self.run_dir / PID_FILE).read_text())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            if stat[0] != "Z" and b"agent" in cmdline and \
                    str(self.state_dir).encode() in cmdline:
                return pid
        return None

    def start(self) -> None:
        """Adopt the running replica, or start one (in a session of its own: it outlives
        this process, and a terminal's Ctrl-C reaches only this one)."""
        self.pid = self._running()
        self.adopted = self.pid is not None
        if self.pid is not None:
            log.warning("adopting the running data-plane replica (pid %d)", self.pid)
            return
        self.state_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("INFERGATE_AGENT_TOKEN", None)
        if self.options.auth:
            env["INFERGATE_AGENT_TOKEN"] = self.layout.token
        with (self.run_dir / "replica.log").open("ab") as out:
            self._child = subprocess.Popen(self.command(), stdout=out,
                                           stderr=subprocess.STDOUT, env=env,
                                           stdin=subprocess.DEVNULL, start_new_session=True)
        self.pid = self._child.pid
        (self.run_dir / PID_FILE).write_text(str(self.pid))

    def tend(self, now: float) -> str | None:
        """One look at the replica (by the one task that keeps it; ``now``: monotonic):
        one that exited is told in the log with its own log's last lines, and started
        again once its wait (:class:`RestartBackoff`) is over. The agent id of the one
        that exited when a new one started, else None."""
        if self.alive():
            return None
        if self._restart_at is None:
            self._restart_at = self.backoff.start_at(now)
            log.error("the data-plane replica (pid %s) exited; starting it again in %.0f s. "
                      "The end of its log (%s): %s", self.pid, self._restart_at - now,
                      self.run_dir / "replica.log", self.log_tail())
        if now < self._restart_at:
            return None
        gone, self._restart_at = self.agent_id, None
        self.start()
        self.backoff.started(now)
        return gone

    def log_tail(self) -> str:
        try:
            with (self.run_dir / "replica.log").open("rb") as file:
                file.seek(max(0, file.seek(0, os.SEEK_END) - LOG_TAIL_CHARS))
                return file.read().decode(errors="replace").strip() or "(empty)"
        except OSError as error:
            return f"(unreadable: {error})"

    @property
    def agent_id(self) -> str | None:
        """Its name to the snapshot feed (``AgentSettings.agent_id``'s default)."""
        return None if self.pid is None else f"{socket.gethostname()}-{self.pid}"

    def alive(self) -> bool:
        if self._child is not None:
            return self._child.poll() is None
        return self.pid is not None and self._running() == self.pid

    def begin_stop(self) -> None:
        """SIGTERM: the replica drains (readiness false, in-flight finishing for
        ``drain_timeout_s``), then closes its servers."""
        if self.pid is not None and self.alive():
            self._stop_sent = time.monotonic()
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)

    def wait_http_closed(self) -> None:
        """Blocking: until the replica, stopping, has ended its HTTP server's streams
        (its status says ``http_closed``), bounded: HAProxy in front stops next, before
        the replica's gRPC streams end (``ReplicaForwarder.stop``). The bound runs from
        the end of the replica's own drain, which began at :meth:`begin_stop`: it closes
        its HTTP server then, not when this one closed its own (with no poll of the
        snapshot feed left open, the control plane's closes at once)."""
        url = f"http://127.0.0.1:{self.layout.replica_status}/status"
        drained = (self._stop_sent + self.options.drain_timeout_s
                   if self._stop_sent is not None else -math.inf)
        deadline = max(time.monotonic(), drained) + CLOSE_S + 1.0
        while self.alive() and time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                if httpx.get(url, timeout=0.5).json().get("phase") == "http_closed":
                    return
            time.sleep(0.05)

    def wait_stopped(self) -> None:
        """Blocking: until the replica has exited (SIGKILL past its drain and grace)."""
        if self.pid is None:
            return
        deadline = time.monotonic() + self.options.drain_timeout_s + STOP_GRACE_S
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.alive():
            log.warning("the data-plane replica (pid %d) outlived its drain: killed", self.pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        if self._child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._child.wait(5)
        with contextlib.suppress(OSError):
            (self.run_dir / PID_FILE).unlink()
