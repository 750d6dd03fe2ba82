"""What a member reports of the memory a loaded model takes.

Which source applies where:

- **A member on this host** (a loopback ``host``: ``127.0.0.1``, ``::1``, ``localhost``;
  the embedded and test deployments): :func:`measured_footprints`. The tritonserver is
  the process listening on the member's HTTP port; a Python-backend model (the ``cpu``
  target) runs in ``triton_python_backend_stub`` children of it, one per model instance,
  whose command line names the model's file::

      triton_python_backend_stub <repo>/<model>/<version>/model.py <shm region>
          <shm default bytes> <shm growth bytes> <tritonserver pid> <backend dir>
          <ipc handle> <model>_<group>_<instance> DEFAULT

  (tritonserver 2.51). A model's footprint is the sum over its stubs (every instance,
  and both versions while a new one replaces the old) of their unique set size (USS:
  what ending them frees; the shared libraries' pages are counted by no one), or of their
  resident set size where USS cannot be read. A model served inside tritonserver itself
  (ONNX Runtime or TensorRT backends) has no stub and is left out.
- **A remote member** (any other host, a Kubernetes pod): its processes are not ours to
  read, so :func:`measured_footprints` answers ``{}``; the control plane takes the change
  of :func:`gpu_memory_used` (``nv_gpu_memory_used_bytes`` off the member's metrics page,
  summed over its GPUs) across a load it alone runs on that member.
- Neither: the converter's measurement (:func:`converters.model_dir.read_footprint`) or
  the configured ``footprint_bytes``.

Triton is asked through :class:`gateway.upstream.triton.MemberAdmin` (its repository
index, its metrics page), the one client toward members.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path

import psutil

from gateway.errors import GatewayError
from gateway.pools import PoolMember
from gateway.upstream.triton import MemberAdmin

STUB_NAME = "triton_python_backend_stub"
GPU_MEMORY_USED = "nv_gpu_memory_used_bytes"
# the process listening on a port of this host (None: none, or not ours to see)
Listener = Callable[[int], "psutil.Process | None"]


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a DNS name: another machine as far as we can tell


async def measured_footprints(member: PoolMember, admin: MemberAdmin,
                              models: Collection[str],
                              started_after: float | None = None,
                              listener: Listener | None = None,
                              sizes: StubSizes | None = None) -> dict[str, int]:
    """Bytes each of ``models`` takes on a member on this host, for those the member
    reports loaded and ready and that run in stubs of their own, read in one scan of
    its processes; ``{}`` for a remote member or one that cannot be asked.
    ``listener``: how the member's tritonserver is found (:class:`Listeners`; default a
    scan of the host's sockets). ``sizes``: each stub's size as last read, read again
    only once it may have changed (:class:`StubSizes`; default: read now)."""
    if not models or not is_loopback(member.spec.host):
        return {}
    wanted = set(models) & await _ready_models(member, admin)
    if not wanted:
        return {}
    return await asyncio.to_thread(_stub_memory, member.spec.http_port, wanted,
                                   started_after, listener or listening_process,
                                   sizes or _process_bytes)


async def _ready_models(member: PoolMember, admin: MemberAdmin) -> set[str]:
    """The member's READY models (any version), from its repository index."""
    try:
        entries = await admin.repository_index(member, ready=True)
    except GatewayError:
        return set()
    return {str(e["name"]) for e in entries if e.get("state") == "READY" and "name" in e}


def _stub_memory(http_port: int, models: set[str], started_after: float | None,
                 listener: Listener, size: Callable[[psutil.Process], int]
                 ) -> dict[str, int]:
    """Per model, its stubs' memory (``size`` of each); ``started_after`` (epoch
    seconds): only stubs started since (a stub of an earlier load of the model may still
    be exiting)."""
    totals: dict[str, int] = {}
    for model, stub in _stubs(http_port, models, started_after, listener):
        with contextlib.suppress(psutil.Error):
            totals[model] = totals.get(model, 0) + size(stub)
    return totals


def _stubs(http_port: int, models: set[str], started_after: float | None,
           listener: Listener) -> list[tuple[str, psutil.Process]]:
    """(model, stub) of each of ``models``'s stubs under the member's tritonserver
    (``listener``: the process listening on its port), started since ``started_after``
    when given."""
    server = listener(http_port)
    if server is None:
        return []
    try:
        children = server.children()
    except psutil.Error:  # it ended meanwhile
        return []
    found = []
    for child in children:
        with contextlib.suppress(psutil.Error):
            model = stub_model(child.cmdline())
            if model in models and (started_after is None
                                    or child.create_time() >= started_after):
                found.append((model, child))
    return found


async def measured_surges(member: PoolMember, models: Collection[str],
                          started_after: float | None = None,
                          listener: Listener | None = None) -> dict[str, int]:
    """How much more than now each of ``models``'s stubs on a member on this host held at
    their peak (the kernel's high-water mark, ``VmHWM``, less their resident set now,
    summed over the model's stubs): what loading it took beyond what it keeps. A
    131 MB model of the benchmark's peaked 91 MB above its resident set while ONNX
    Runtime built its session. ``{}`` for a remote member."""
    if not models or not is_loopback(member.spec.host):
        return {}
    return await asyncio.to_thread(_stub_surges, member.spec.http_port, set(models),
                                   started_after, listener or listening_process)


def _stub_surges(http_port: int, models: set[str], started_after: float | None,
                 listener: Listener) -> dict[str, int]:
    surges: dict[str, int] = {}
    for model, stub in _stubs(http_port, models, started_after, listener):
        with contextlib.suppress(OSError, ValueError, KeyError):
            surges[model] = surges.get(model, 0) + _surge(stub.pid)
    return surges


def _surge(pid: int) -> int:
    """``VmHWM`` less ``VmRSS`` of a process, in bytes (``/proc/<pid>/status``: kB)."""
    status = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            status[key] = int(value.split()[0]) * 1024
    return max(0, status["VmHWM"] - status["VmRSS"])


EXIT_POLL_S = 0.05  # how often an unloaded model's stubs are looked at until they exit


async def released(member: PoolMember, model: str, timeout_s: float,
                   listener: Listener | None = None) -> bool:
    """Wait until the stubs of ``model`` on a member on this host have exited (Triton's
    unload returns before they do, and their memory is freed only then), at most
    ``timeout_s``; True at once for a remote member (nothing of it to watch). The stubs
    are found in one scan (in a thread), then watched from the event loop: no thread is
    held while they exit (the default executor's few threads serve the data plane's
    runtime calls too)."""
    if not is_loopback(member.spec.host) or timeout_s <= 0:
        return True
    loop = asyncio.get_running_loop()
    give_up = loop.time() + timeout_s
    stubs = await asyncio.to_thread(_stubs_of, member.spec.http_port, model,
                                    listener or listening_process)
    while True:
        stubs = [stub for stub in stubs if _running(stub)]
        if not stubs:
            return True
        if loop.time() >= give_up:
            return False
        await asyncio.sleep(min(EXIT_POLL_S, max(0.0, give_up - loop.time())))


def _stubs_of(http_port: int, model: str, listener: Listener) -> list[psutil.Process]:
    return [stub for _, stub in _stubs(http_port, {model}, None, listener)]


def _running(process: psutil.Process) -> bool:
    """Whether ``process`` still runs (a zombie has exited: its memory is free)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class Listeners:
    """The process listening on each port asked of it, found by one scan of the host's
    sockets (:func:`listening_process`) and kept while it runs (a tritonserver keeps its
    ports: a member restarted is another process, and the one kept is gone). A scan
    reads every process's open files: 9 ms of CPU on an idle host of 64 processes, and
    about a third of the control plane's Python time in ``bench_residency`` at a quarter
    budget, where footprints, surges and released stubs ask for it several times a
    second. Called from worker threads (the scans run off the event loop)."""

    def __init__(self, scan: Listener | None = None) -> None:
        self._scan = scan or listening_process
        self._lock = threading.Lock()
        self._known: dict[int, psutil.Process] = {}

    def __call__(self, port: int) -> psutil.Process | None:
        with self._lock:
            known = self._known.get(port)
            if known is not None and _running(known):
                return known
            found = self._scan(port)
            if found is None:
                self._known.pop(port, None)
            else:
                self._known[port] = found
            return found


# a stub's unique set size is read again once its resident set moved this much since the
# last read, or that read is this old: its USS is a walk of its page tables
# (smaps_rollup), its resident set a counter the kernel keeps (statm). A round every 0.5 s
# read each stub ten times as often
RSS_MOVED_BYTES = 256 << 10
SIZE_KEPT_S = 5.0
SIZES_KEPT = 512  # stubs remembered before those that ended are forgotten


class StubSizes:
    """Each stub's size (:func:`_process_bytes`) as last read, with its resident set then:
    read again only once its resident set moved :data:`RSS_MOVED_BYTES` or the read is
    :data:`SIZE_KEPT_S` old. The residency measures every resident model each round;
    reading the USS of every stub each time was 8 % of the control plane's Python time
    under ``bench_residency`` at a quarter budget, most of it for stubs that had not
    changed. A stub's pages that others stop sharing (the last but one stub of a shared
    library ended) move its USS and not its resident set: the age bound reads those.
    Called from worker threads; ``clock``: monotonic seconds."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 size: Callable[[psutil.Process], int] | None = None) -> None:
        self._clock = clock
        self._size = size or _process_bytes
        self._lock = threading.Lock()
        # (pid, start time) -> (resident set, size, when read)
        self._read: dict[tuple[int, float], tuple[int, int, float]] = {}

    def __call__(self, process: psutil.Process) -> int:
        key, rss, now = (process.pid, process.create_time()), process.memory_info().rss, \
            self._clock()
        with self._lock:
            last = self._read.get(key)
        if last is not None and abs(rss - last[0]) < RSS_MOVED_BYTES and \
                now - last[2] < SIZE_KEPT_S:
            return last[1]
        size = self._size(process)
        with self._lock:
            self._read[key] = (rss, size, now)
            if len(self._read) > SIZES_KEPT:
                self._read = {k: v for k, v in self._read.items() if psutil.pid_exists(k[0])}
        return size


def listening_process(port: int) -> psutil.Process | None:
    """The process with a TCP socket listening on ``port`` (None: none, or not ours to
    see)."""
    with contextlib.suppress(psutil.Error):
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port \
                    and conn.pid is not None:
                return psutil.Process(conn.pid)
    return None


def stub_model(cmdline: list[str]) -> str | None:
    """The model a Python-backend stub serves: its first argument is
    ``<repo>/<model>/<version>/<file>`` (None: not a stub)."""
    if len(cmdline) < 2 or Path(cmdline[0]).name != STUB_NAME:
        return None
    parts = Path(cmdline[1]).parts
    return parts[-3] if len(parts) >= 3 else None


def _process_bytes(process: psutil.Process) -> int:
    try:
        return int(process.memory_full_info().uss)
    except (psutil.AccessDenied, AttributeError):
        return int(process.memory_info().rss)


def gpu_memory_used(metrics_text: str) -> int | None:
    """Bytes in use on the member's GPUs (``nv_gpu_memory_used_bytes`` summed over its
    ``gpu_uuid`` series); None when the page has none (a CPU-only Triton, GPU metrics
    off). Read off the text, as :func:`gateway.control.probes.pending_requests` does."""
    total, seen = 0.0, False
    for line in metrics_text.splitlines():
        if not line.startswith(GPU_MEMORY_USED):
            continue
        rest = line[len(GPU_MEMORY_USED):]
        if rest[:1] == "{":
            rest = rest[rest.rfind("}") + 1:]
        elif rest[:1] not in (" ", "\t"):
            continue  # another metric whose name starts alike
        with contextlib.suppress(IndexError, ValueError):
            total += float(rest.split()[0])
            seen = True
    return int(total) if seen else None
