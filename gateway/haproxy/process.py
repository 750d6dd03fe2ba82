"""The HAProxy process: files on disk, start in master-worker mode, seamless reload,
graceful stop. Which HAProxy and where it runs is all this module knows.

``haproxy -W`` keeps a master process that re-executes workers on ``reload``; listening
sockets pass to the new worker (``expose-fd listeners``), so a reload drops no
connection and the old worker finishes what it has in flight. In Kubernetes HAProxy
runs in its own container (``external=True``): the control plane only writes the files
and talks to the master socket on the shared volume.

Started here, HAProxy either ends with the process that started it (a parent-death
signal: ``infergate up``, the agent) or, ``detached``, outlives its crash (``gateway
serve``): it keeps routing on its last configuration, and the next start on the same
run folder finds its master alive on ``master.sock`` and adopts it with a reload, as
the control plane does with HAProxy in its own container. A graceful stop ends it
either way.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from gateway.haproxy.render import Rendered
from gateway.haproxy.runtime import send
from gateway.haproxy.snapshot import Layout

log = logging.getLogger(__name__)


class HAProxyError(RuntimeError):
    """HAProxy refused its configuration or did not start."""


def find_haproxy() -> str | None:
    """The ``haproxy`` binary on PATH or in the usual Debian place, if installed."""
    return shutil.which("haproxy") or next(
        (p for p in ("/usr/sbin/haproxy", "/usr/local/sbin/haproxy") if os.access(p, os.X_OK)),
        None,
    )


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    """In the child: SIGTERM when the gateway dies, however it dies (Linux). Only where
    ``setpriv`` is missing (:func:`_die_with_parent_command`)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_files(rendered: Rendered, layout: Layout, written: Rendered | None = None) -> int:
    """Error files, Lua, maps, then the configuration: a reload always finds a whole set.
    ``written``: what the last call wrote to the same layout; files it already holds
    are left alone (under load a probe round changes a member's weight and nothing
    else: one file to write, not every map and error file). Returns the files written."""
    count = 0
    for name, body in rendered.error_files.items():
        if written is None or written.error_files.get(name) != body:
            _atomic_write(layout.run_dir / "errors" / name, body)
            count += 1
    for name, text in rendered.lua.items():
        if written is None or written.lua.get(name) != text:
            _atomic_write(layout.run_dir / name, text)
            count += 1
    for name, entries in rendered.maps.items():
        if written is None or written.maps.get(name) != entries:
            _atomic_write(layout.map_path(name),
                          "".join(f"{k} {v}\n" for k, v in sorted(entries.items())))
            count += 1
    if written is None or written.config != rendered.config:
        _atomic_write(layout.config_path, rendered.config)
        count += 1
    return count


def _die_with_parent_command() -> list[str]:
    """``setpriv --pdeathsig TERM --``: HAProxy gets SIGTERM when the gateway dies, set
    by util-linux in the child instead of by Python code between fork and exec. The
    gateway runs gRPC's threads; a fork that runs Python in the child (``preexec_fn``)
    also runs gRPC's fork handlers there, and one aborted a starting HAProxy (SIGABRT,
    "epoll_wait error: Bad file descriptor" from gRPC's poller, seen once in a test
    that restarts a gateway). Without ``preexec_fn`` the child is started by vfork,
    which runs no fork handler."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM", "--"] if setpriv else []


def _master_pid(show_proc: str) -> int | None:
    """The master's pid in the master CLI's ``show proc`` answer."""
    for line in show_proc.splitlines():
        fields = line.split()
        if len(fields) > 1 and fields[1] == "master":
            return int(fields[0])
    return None


def _gone(pid: int) -> bool:
    """No such process, or a zombie (an adopted master is not ours to reap)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


class HAProxyProcess:
    """``detached``: HAProxy outlives a crash of this process and a later start on the
    same run folder adopts it (module docstring); else it ends with this process."""

    def __init__(self, layout: Layout, binary: str | None = None, external: bool = False,
                 log_file: Path | None = None, detached: bool = False) -> None:
        self.layout = layout
        self.binary = binary or find_haproxy() or "haproxy"
        self.external = external
        self.detached = detached
        self.log_file = log_file or layout.run_dir / "haproxy.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._master: int | None = None  # the master's pid, started or adopted here

    def check(self) -> None:
        """``haproxy -c``: refuse a configuration before any process sees it (skipped
        where HAProxy runs in another container and no binary is here)."""
        if self.external and find_haproxy() is None:
            return
        # without -q: its alerts are the error's message
        result = subprocess.run([self.binary, "-c", "-f", str(self.layout.config_path)],
                                capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise HAProxyError(f"HAProxy refused the configuration: "
                               f"{(result.stderr or result.stdout).strip()[-2000:]}")

    def start(self, timeout_s: float = 10.0) -> None:
        self.check()
        if self.external:
            # the HAProxy container starts on the first configuration it finds
            self._wait_for_admin(max(timeout_s, 120.0))
            return
        master = self.live_master() if self.detached else None
        if master is not None:
            self._adopt(master, timeout_s)
            return
        for stale in (self.layout.admin_socket, self.layout.master_socket):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
        out = self.log_file.open("ab")
        prefix = [] if self.detached else _die_with_parent_command()
        self._proc = subprocess.Popen(
            [*prefix, self.binary, "-W", "-db", "-S", f"{self.layout.master_socket},mode,600",
             "-f", str(self.layout.config_path)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            # a Ctrl-C reaches us first; we stop it in order (or, detached, not at all)
            start_new_session=True,
            preexec_fn=None if prefix or self.detached else _die_with_parent,
        )
        out.close()
        self._master = self._proc.pid
        try:
            self._wait_for_admin(timeout_s)
        except HAProxyError:
            self.stop(0)  # one that never answered serves nobody: not left behind
            raise

    def live_master(self) -> int | None:
        """The pid of the master answering on the run folder's master socket, if one
        does (a predecessor's, left serving by its crash)."""
        with contextlib.suppress(OSError, ValueError):
            # the master CLI keeps a connection open after one command: quit closes it
            return _master_pid(send(self.layout.master_socket, "show proc; quit", 2.0))
        return None

    def _adopt(self, master: int, timeout_s: float) -> None:
        """The files written are this start's (its control plane listens on new ports):
        a seamless reload moves the running HAProxy onto them."""
        log.warning("HAProxy: adopting the running master (pid %d) on %s", master,
                    self.layout.run_dir)
        self._master = master
        self._reload(timeout_s)

    def _wait_for_admin(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise HAProxyError(f"HAProxy exited ({self._proc.returncode}): "
                                   f"{self.log_tail()}")
            with contextlib.suppress(OSError):
                if "Name:" in send(self.layout.admin_socket, "show info", 1.0):
                    return
            time.sleep(0.05)
        raise HAProxyError(f"HAProxy did not answer on {self.layout.admin_socket}: "
                           f"{self.log_tail()}")

    def reload(self, timeout_s: float = 10.0) -> None:
        """Seamless reload through the master CLI; returns once the new worker answers."""
        self.check()
        self._reload(timeout_s)

    def _reload(self, timeout_s: float) -> None:
        before = self._worker_pid()
        answer = send(self.layout.master_socket, "reload", timeout_s)
        if "Success=0" in answer:
            raise HAProxyError(f"HAProxy reload failed: {answer.strip()[-2000:]}")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pid = self._worker_pid()
            if pid is not None and pid != before:
                return
            time.sleep(0.05)
        raise HAProxyError("HAProxy reload: no new worker answered")

    def _worker_pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError):
            text = send(self.layout.admin_socket, "show info", 1.0)
            for line in text.splitlines():
                if line.startswith("Pid:"):
                    return int(line.split(":", 1)[1])
        return None

    @property
    def pid(self) -> int | None:
        """The master's (None where HAProxy runs elsewhere)."""
        return self._master

    def running(self) -> bool:
        return self._master is not None and not self._exited(0)

    def stop(self, grace_s: float = 10.0) -> None:
        """Soft stop (listeners close, in-flight finishes) for up to ``grace_s``, then
        SIGTERM, then SIGKILL: over within ``grace_s`` + 2 s."""
        master = self._master
        if master is None or self._exited(0):
            return
        for sig, wait_s in ((signal.SIGUSR1, grace_s), (signal.SIGTERM, 1.0),
                            (signal.SIGKILL, 1.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(master, sig)  # its own session: the group is the master's pid
            if self._exited(wait_s):
                return
            log.warning("HAProxy did not stop after %s", sig.name)

    def _exited(self, wait_s: float) -> bool:
        """Whether the master is gone within ``wait_s`` (a child of ours is reaped)."""
        if self._proc is not None:
            try:
                self._proc.wait(timeout=wait_s)
                return True
            except subprocess.TimeoutExpired:
                return False
        deadline = time.monotonic() + wait_s
        while not _gone(self._master or 0):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def log_tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        return ""
