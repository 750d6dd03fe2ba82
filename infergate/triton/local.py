"""Run a real ``tritonserver`` (from the ``nvidia-pytriton`` wheel) as a child process.

The server runs from a separate *runtime environment* (a venv holding
``nvidia-pytriton``, ``onnxruntime`` and ``numpy<2``): Triton's Python-backend stub
imports the ``python3`` first on ``PATH`` when the server starts, and with numpy 2 every
response fails with "output tensor shape does not match size of output". Production
Triton images keep the model runtime apart from the services in the same way.

Lifecycle guarantees:
- the server gets its own process group and ``PR_SET_PDEATHSIG``: if we die, it dies;
- ``stop()`` sends SIGTERM, waits, then SIGKILLs the whole group (server + stubs);
- start-up failures raise :class:`TritonStartupError` quoting the end of Triton's log.
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import os
import resource
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gateway.files import write_atomically
from gateway.netaddr import family, free_ports, join_host_port
from gateway.netaddr import free_port as free_port  # (tests and tools pick ports here too)

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


# the default of TritonSettings.stub_nice (0: stubs start at the server's priority)
STUB_NICE = 10
# read by every `bash -c` the server runs: the Python backend starts its stubs so
STUB_NICE_SCRIPT = Path(__file__).with_name("stub_nice.sh")
_CAP_SYS_NICE = 23


class TritonStartupError(RuntimeError):
    """tritonserver could not be started or did not become ready."""


def may_raise_priority(status: str | None = None) -> bool:
    """Whether a process started by this one may lower its nice value back to this
    one's: CAP_SYS_NICE in its effective set (root in a container often lacks it), or a
    ``RLIMIT_NICE`` that allows it. ``status``: ``/proc/self/status`` (tests)."""
    if status is None:
        try:
            status = Path("/proc/self/status").read_text()
        except OSError:
            return False
    for line in status.splitlines():
        if line.startswith("CapEff:") and int(line.split()[1], 16) >> _CAP_SYS_NICE & 1:
            return True
    soft, _ = resource.getrlimit(resource.RLIMIT_NICE)
    return soft == resource.RLIM_INFINITY or 20 - os.getpriority(os.PRIO_PROCESS, 0) <= soft


def stub_nice_env(stub_nice: int, permitted: bool) -> dict[str, str]:
    """The server's environment that starts its Python-backend stubs ``stub_nice`` below
    it (``stub_nice.sh``, as its ``BASH_ENV``): their start (the interpreter, numpy, ONNX
    Runtime: about 0.2 CPU-s a load, measured) and their model's build then take only
    what inference leaves of the cores, and each model raises its threads back to the
    server's priority once built (``python_backend_onnx.py``). Nothing where that raise
    is not ``permitted``: the stub would serve below the server."""
    if stub_nice <= 0 or not permitted:
        return {}
    return {"BASH_ENV": str(STUB_NICE_SCRIPT), "INFERGATE_STUB_NICE": str(stub_nice)}


@dataclass(frozen=True)
class TritonSettings:
    """How to start one local Triton server. Ports of 0 are replaced by free ones."""

    model_repository: Path
    runtime_env: Path
    log_file: Path
    models: Sequence[str] = ()
    host: str = "127.0.0.1"
    http_port: int = 0
    grpc_port: int = 0
    metrics_port: int = 0
    startup_timeout_s: float = 180.0
    stop_timeout_s: float = 20.0
    extra_args: Sequence[str] = field(default_factory=tuple)
    # how far below the server each Python-backend stub starts (its start, imports and
    # model build), where the stub may raise itself back to serve (:func:`stub_nice_env`)
    stub_nice: int = STUB_NICE


@dataclass(frozen=True)
class TritonEndpoints:
    host: str
    http_port: int
    grpc_port: int
    metrics_port: int

    @property
    def http_url(self) -> str:
        return join_host_port(self.host, self.http_port)

    @property
    def grpc_url(self) -> str:
        return join_host_port(self.host, self.grpc_port)

    @property
    def metrics_url(self) -> str:
        return f"http://{join_host_port(self.host, self.metrics_port)}/metrics"


def _http_address(host: str) -> str:
    """Triton's HTTP and metrics servers (libevhtp) take an IPv6 address as ``ipv6:ADDR``
    (a bare one is read as IPv4 and binds nothing)."""
    return f"ipv6:{host}" if ":" in host else host




def runtime_site_packages(runtime_env: Path) -> Path:
    matches = sorted(runtime_env.glob("lib/python3*/site-packages"))
    if not matches:
        raise TritonStartupError(
            f"no Python runtime environment at {runtime_env}: run 'make runtime' "
            "(creates it from infergate/triton/runtime-requirements.txt)"
        )
    return matches[0]


def locate_tritonserver(runtime_env: Path) -> tuple[Path, Path]:
    """Return (binary, backends directory) inside the runtime env's pytriton wheel."""
    root = runtime_site_packages(runtime_env) / "pytriton" / "tritonserver"
    binary = root / "bin" / "tritonserver"
    if not binary.is_file():
        raise TritonStartupError(
            f"tritonserver binary not found at {binary}: install nvidia-pytriton into "
            f"{runtime_env} ('make runtime')"
        )
    return binary, root / "backends"


def install_python_stub(runtime_env: Path) -> None:
    """Put the Python-backend stub for the runtime's Python next to libtriton_python.so."""
    root = runtime_site_packages(runtime_env) / "pytriton" / "tritonserver"
    python_dir = root / "backends" / "python"
    target = python_dir / "triton_python_backend_stub"
    py_tag = runtime_site_packages(runtime_env).parent.name.removeprefix("python")
    source = root / "python_backend_stubs" / py_tag / "triton_python_backend_stub"
    if not source.is_file():
        raise TritonStartupError(f"no Python-backend stub for Python {py_tag} at {source}")
    if target.is_file() and target.stat().st_size == source.stat().st_size:
        return
    # (Tritons starting at once each copy it through a temporary file of their own)
    write_atomically(target, source.read_bytes(), mode=source.stat().st_mode & 0o777)


def _die_with_parent() -> None:
    """preexec_fn: the server gets SIGTERM when the process that started it dies.

    SIGTERM, not SIGKILL: on SIGTERM tritonserver unloads its models and so stops its
    Python-backend stubs; a SIGKILLed server leaves its stubs running as orphans.
    """
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _become_subreaper() -> None:
    """Orphaned Python-backend stubs get reparented to us (not init), so we can reap them."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1)


def process_group_members(pgid: int) -> list[int]:
    """PIDs whose process group is ``pgid`` (read from /proc)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:
                pids.append(int(stat.parent.name))
    return pids


def _reap(pids: list[int], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    pending = set(pids)
    while pending and time.monotonic() < deadline:
        for pid in list(pending):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pending.discard(pid)  # not ours to reap (or already reaped)
                continue
            if done:
                pending.discard(pid)
        if pending:
            time.sleep(0.05)


# Triton's words when a port it was given is taken ("failed to start HTTP service:
# Unavailable - Socket '127.0.0.1:14425' already in use"), and starts on picked ports
START_TRIES, PORT_IN_USE = 3, "already in use"
EMPTY_LOG = "(log empty)"  # what a log tail says when nothing in the log explains


def _log_tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log written)"
    interesting = [ln for ln in text if not _is_gpu_noise(ln)]
    # Triton prints a big options table at exit; its E-lines say what actually failed.
    errors = [ln for ln in interesting if ln.startswith("E") or "failed to load" in ln]
    return "\n".join((errors or interesting)[-lines:]) or EMPTY_LOG


def _is_gpu_noise(line: str) -> bool:
    """CPU-only hosts log CUDA/NVML/DCGM warnings that never explain a failure."""
    return any(s in line for s in ("CUDA", "cuda", "NVML", "DCGM", "libnvidia"))


class LocalTriton:
    """A tritonserver child process. Use as a context manager, or call start()/stop()."""

    def __init__(self, settings: TritonSettings) -> None:
        self.settings = settings
        self._proc: subprocess.Popen[bytes] | None = None
        self.endpoints: TritonEndpoints | None = None

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> TritonEndpoints:
        """Start Triton and wait until it is ready. Ports given as 0 are picked free; when
        another process takes one of them before Triton binds it (Triton exits saying the
        socket is in use), Triton is started again on other ones, up to
        :data:`START_TRIES` starts in all."""
        s = self.settings
        binary, backends = locate_tritonserver(s.runtime_env)
        install_python_stub(s.runtime_env)
        if not s.model_repository.is_dir():
            raise TritonStartupError(f"model repository {s.model_repository} does not exist")
        given = (s.http_port, s.grpc_port, s.metrics_port)
        for tries_left in reversed(range(START_TRIES)):
            picked = iter(free_ports(given.count(0), s.host, taken=given))
            ports = [p or next(picked) for p in given]
            try:
                return self._start_on(binary, backends, ports)
            except TritonStartupError as exc:
                message = str(exc)
                mine = any(join_host_port(s.host, p) in message for p in given if p)
                if not tries_left or mine or PORT_IN_USE not in message:
                    raise  # (a port the caller gave: theirs to choose again)
        raise AssertionError("unreachable: the last start raises")

    def _start_on(self, binary: Path, backends: Path, ports: list[int]) -> TritonEndpoints:
        s = self.settings
        self._check_ports_free(ports)
        self.endpoints = TritonEndpoints(s.host, *ports)
        s.log_file.parent.mkdir(parents=True, exist_ok=True)
        s.log_file.write_text("")
        cmd = [
            str(binary),
            f"--model-repository={s.model_repository.resolve()}",
            f"--backend-directory={backends}",
            "--model-control-mode=explicit",
            # Our configs are complete (converters/triton_config.py), and the Python backend
            # asks a stub of its own to auto-complete each model it loads: 1.3 s a load on
            # 2 cores (a Triton ready with 3 models: 2.5 s -> 1 s), the same config served
            "--disable-auto-complete-config",
            *[f"--load-model={m}" for m in s.models],
            f"--http-address={_http_address(s.host)}",
            f"--http-port={ports[0]}",
            # Triton writes "{address}:{port}" for gRPC: an IPv6 address in brackets
            f"--grpc-address={'[' + s.host + ']' if ':' in s.host else s.host}",
            f"--grpc-port={ports[1]}",
            f"--metrics-address={_http_address(s.host)}",
            f"--metrics-port={ports[2]}",
            "--allow-cpu-metrics=true",
            "--exit-on-error=true",
            "--exit-timeout-secs=10",
            "--strict-readiness=true",
            f"--log-file={s.log_file.resolve()}",
            *s.extra_args,
        ]
        env = dict(os.environ)
        # The stub runs as the first python3 on PATH: make that the runtime env's.
        env["PATH"] = f"{s.runtime_env.resolve() / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(s.runtime_env.resolve())
        env.pop("PYTHONPATH", None)
        env.pop("PYTHONHOME", None)
        # Each Python-backend stub imports numpy, whose OpenBLAS starts a thread per core
        # that spins at start-up; the stubs compute in ONNX Runtime's own threads, never in
        # numpy's BLAS. One thread: a stub's start costs 0.11 CPU-s instead of 0.21, a
        # load 0.53-0.56 instead of 0.68-0.69 (bench_member_loads, one load at a time, 2
        # runs each; docs/residency.md). An operator's setting is kept.
        env.setdefault("OPENBLAS_NUM_THREADS", "1")
        env.update(stub_nice_env(s.stub_nice, may_raise_priority()))
        _become_subreaper()
        # what Triton prints before its log is open (a bad option, a library that does
        # not load) goes to stderr: kept beside the log for a start-up error to say
        with self.stderr_file.open("wb") as stderr:
            self._proc = subprocess.Popen(
                cmd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self.endpoints

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        pgid = proc.pid
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=self.settings.stop_timeout_s)
        # Whatever is left of the group (the server if it hung, Python-backend stubs).
        leftovers = process_group_members(pgid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        _reap(leftovers)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> LocalTriton:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- helpers -----------------------------------------------------------------------
    @property
    def stderr_file(self) -> Path:
        return self.settings.log_file.with_name(self.settings.log_file.name + ".stderr")

    def log_tail(self, lines: int = 25) -> str:
        tail = _log_tail(self.settings.log_file, lines)
        if tail != EMPTY_LOG:
            return tail
        with contextlib.suppress(OSError):
            stderr = self.stderr_file.read_text(errors="replace").strip().splitlines()
            # a refused option is followed by the whole usage: the line before it says why
            usage = next((i for i, ln in enumerate(stderr) if ln.startswith("Usage:")), None)
            stderr = stderr[:usage][-lines:]
            if stderr:
                return "(log empty; its stderr:)\n" + "\n".join(stderr)
        return tail

    def _check_ports_free(self, ports: list[int]) -> None:
        for port in ports:
            with socket.socket(family(self.settings.host), socket.SOCK_STREAM) as sock:
                if sock.connect_ex((self.settings.host, port)) == 0:
                    raise TritonStartupError(
                        f"port {self.settings.host}:{port} is already in use; choose another "
                        "port or pass 0 for a free one"
                    )

    def _wait_ready(self) -> None:
        assert self._proc is not None and self.endpoints is not None
        deadline = time.monotonic() + self.settings.startup_timeout_s
        url = f"http://{self.endpoints.http_url}/v2/health/ready"
        while time.monotonic() < deadline:
            code = self._proc.poll()
            if code is not None:
                raise TritonStartupError(
                    f"tritonserver exited with status {code} during start-up "
                    f"(log {self.settings.log_file}):\n{self.log_tail()}"
                )
            with (
                # (HTTPException: another process's server answered on the port, not
                # Triton's HTTP/1: it took the port, and Triton exits, seen above)
                contextlib.suppress(urllib.error.URLError, OSError, http.client.HTTPException),
                urllib.request.urlopen(url, timeout=1) as resp,  # loopback only
            ):
                if resp.status == 200:
                    return
            time.sleep(0.2)
        raise TritonStartupError(
            f"tritonserver not ready after {self.settings.startup_timeout_s:.0f} s "
            f"(log {self.settings.log_file}):\n{self.log_tail()}"
        )
