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

What a start finds of an earlier one on its run folder is adopted or ended, never left
beside it: HAProxy binds its ports with ``SO_REUSEPORT``, so a second one starts fine
on the same ports and the kernel splits the clients between the two, the first on a
stale configuration and, its sockets unlinked, out of every control plane's reach. The
master's pid (``haproxy.pid``, written by HAProxy) names the process group it leads; a
master that is reloading does not answer on its socket for a moment, and one that does
not answer at all is ended with its workers, as is a worker whose master is gone. Only
processes of that group running this folder's configuration are ever signalled.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from gateway.files import write_atomically
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


def _die_with_parent() -> None:
    """In the child: SIGTERM when the gateway dies, however it dies (Linux). Only where
    ``setpriv`` is missing (:func:`_die_with_parent_command`)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def write_files(rendered: Rendered, layout: Layout, written: Rendered | None = None) -> int:
    """Error files, Lua, maps, then the configuration: a reload always finds a whole set.
    ``written``: what the last call wrote to the same layout; files it already holds
    are left alone (under load a probe round changes a member's weight and nothing
    else: one file to write, not every map and error file). Returns the files written."""
    count = 0
    for name, body in rendered.error_files.items():
        if written is None or written.error_files.get(name) != body:
            write_atomically(layout.run_dir / "errors" / name, body)
            count += 1
    for name, text in rendered.lua.items():
        if written is None or written.lua.get(name) != text:
            write_atomically(layout.run_dir / name, text)
            count += 1
    for name, entries in rendered.maps.items():
        if written is None or written.maps.get(name) != entries:
            write_atomically(layout.map_path(name),
                             "".join(f"{k} {v}\n" for k, v in sorted(entries.items())))
            count += 1
    if written is None or written.config != rendered.config:
        write_atomically(layout.config_path, rendered.config)
        count += 1
    return count


def private_run_dir(name: str, instead: str = "pass --haproxy-run-dir") -> Path:
    """A folder for HAProxy's files and sockets in the temporary folder, named ``name``
    by its caller after what it serves, so that a restart finds the same one (and a
    crash's HAProxy in it); private to this user: a folder someone else made or can
    write is refused (``instead``: what the error tells to do, besides removing it)."""
    run_dir = Path(tempfile.gettempdir()) / name
    run_dir.mkdir(mode=0o700, exist_ok=True)
    found = os.lstat(run_dir)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or \
            found.st_mode & 0o077:
        raise ValueError(f"{run_dir} is not a private folder of this user: remove it or "
                         f"{instead}")
    return run_dir


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


def alerts_first(output: str, limit: int = 2000) -> str:
    """HAProxy's ``-c`` output as an error's message: its ``[ALERT]`` lines (the cause)
    first, then the rest while ``limit`` characters allow. A configuration with many
    warnings once pushed its one alert out of a message that kept only the tail."""
    lines = output.strip().splitlines()
    alerts = [line for line in lines if "[ALERT]" in line]
    others = [line for line in lines if "[ALERT]" not in line]
    text = "\n".join(alerts)[:limit]
    for line in others:
        if len(text) + len(line) + 1 > limit:
            break
        text = f"{text}\n{line}" if text else line
    return text


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


def _runs(pid: int, config: Path) -> bool:
    """Whether ``pid`` runs ``-f config``, as a master or worker started on this run
    folder does (a pid or group id read from a file may have been reused since)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(flag == b"-f" and value == str(config).encode()
               for flag, value in zip(argv, argv[1:], strict=False))


def group_members(group: int, config: Path) -> list[int]:
    """The live HAProxy processes of process group ``group`` that run ``config``: a
    master (the group's leader) and its workers, or workers whose master is gone."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z" and int(fields[2]) == group and _runs(int(entry.name), config):
                found.append(int(entry.name))
    return sorted(found)


def recorded_master(layout: Layout) -> int | None:
    """The pid HAProxy wrote at its start on this run folder (``-p``), if any."""
    with contextlib.suppress(OSError, ValueError):
        return int(pid_file(layout).read_text().split()[0])
    return None


def pid_file(layout: Layout) -> Path:
    return layout.run_dir / "haproxy.pid"


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
        # a soft stop signalled while a reload of ours re-executes the master is lost
        # for the worker it forks: stop and reload take turns
        self._turn = threading.RLock()

    def check(self) -> None:
        """``haproxy -c``: refuse a configuration before any process sees it (skipped
        where HAProxy runs in another container and no binary is here)."""
        if self.external and find_haproxy() is None:
            return
        # without -q: its alerts are the error's message
        result = subprocess.run([self.binary, "-c", "-f", str(self.layout.config_path)],
                                capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise HAProxyError("HAProxy refused the configuration: "
                               + alerts_first(result.stderr or result.stdout))

    def start(self, timeout_s: float = 10.0) -> None:
        self.check()
        if self.external:
            # the HAProxy container starts on the first configuration it finds
            self._wait_for_admin(max(timeout_s, 120.0))
            return
        master = self._predecessor(timeout_s)
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
             "-p", str(pid_file(self.layout)), "-f", str(self.layout.config_path)],
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

    def _predecessor(self, timeout_s: float) -> int | None:
        """The master an earlier start left on this run folder, to adopt (detached);
        whatever else of it lives is ended first (module docstring). A master that is
        alive but silent is given ``timeout_s`` (a reload re-executes it)."""
        config, group = self.layout.config_path, recorded_master(self.layout)
        deadline = time.monotonic() + timeout_s
        master = None
        while self.detached:
            master = self.live_master()
            if master is not None or group is None or _gone(group) or \
                    not _runs(group, config) or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        left = group_members(group, config) if group not in (None, master) else []
        if group is not None and left:
            log.warning("HAProxy: ending what an earlier start left on %s, unanswering "
                        "(group %d: %s)", self.layout.run_dir, group, left)
            self._end(group, ((signal.SIGTERM, 2.0), (signal.SIGKILL, 2.0)))
        return master

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
        with self._turn:
            self._reload_now(timeout_s)

    def _reload_now(self, timeout_s: float) -> None:
        before = self._worker_pid()
        answer = self._send_reload(timeout_s)
        if "Success=0" in answer:
            raise HAProxyError(f"HAProxy reload failed: {answer.strip()[-2000:]}")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pid = self._worker_pid()
            if pid is not None and pid != before:
                return
            time.sleep(0.05)
        raise HAProxyError("HAProxy reload: no new worker answered")

    def _send_reload(self, timeout_s: float) -> str:
        """``reload`` on the master socket. The master the last reload re-executed may
        refuse it for a few ms after its new worker answers (2.6.12: 1 to 10 in 300
        back-to-back reloads); a refused connection delivered nothing: sent again."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return send(self.layout.master_socket, "reload", timeout_s)
            except ConnectionRefusedError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.01)

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
        return self._master is not None and not _gone(self._master)

    def stop(self, grace_s: float = 10.0) -> None:
        """Soft stop (listeners close, in-flight finishes) for up to ``grace_s``, then
        SIGTERM, then SIGKILL: over within ``grace_s`` + 2 s (after a reload of ours in
        flight), workers whose master is gone included."""
        with self._turn:
            if self._master is not None:
                self._end(self._master, ((signal.SIGUSR1, grace_s), (signal.SIGTERM, 1.0),
                                         (signal.SIGKILL, 1.0)))

    def _end(self, group: int, steps: tuple[tuple[signal.Signals, float], ...]) -> None:
        """Each step's signal to every process of ``group`` (its own session: the
        master's pid) that runs this folder's configuration, until none is left."""
        if self._exited(group, 0):
            return
        for sig, wait_s in steps:
            for pid in group_members(group, self.layout.config_path):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
                    if sig is signal.SIGTERM:  # a stopped process acts on it once continued
                        os.kill(pid, signal.SIGCONT)
            if self._exited(group, wait_s):
                return
            log.warning("HAProxy did not stop after %s", sig.name)

    def _exited(self, group: int, wait_s: float) -> bool:
        """Whether the master and every worker of ``group`` are gone within ``wait_s``
        (a child of ours is reaped)."""
        deadline = time.monotonic() + wait_s
        while True:
            if self._proc is not None:
                self._proc.poll()
            if not group_members(group, self.layout.config_path):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def log_tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        return ""
