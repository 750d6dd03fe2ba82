"""The conversion worker's sandbox: what an uploaded model's code could reach, bounded.

A conversion opens an uploaded file with torch, ONNX and their native code, so the
worker is treated as running the uploader's code. The gateway side computes a
:class:`SandboxPlan` (:func:`plan_for`) and the environment (:func:`child_environment`);
the worker applies the plan to itself (:func:`enter`) before it reads any upload:

- environment: an allow-list (``PATH``, locale, thread counts, ``HOME`` and ``TMPDIR``
  in the job's scratch folder); nothing else of the gateway's, so no
  ``INFERGATE_TOKENS`` and no cloud credentials;
- resource limits (``setrlimit``): address space, CPU seconds, file size, open files,
  and processes (counted per user by the kernel, so the limit is what the user already
  runs plus the allowance); capabilities dropped, so a worker running as root cannot
  raise them again;
- Landlock (Linux >= 5.19): reads only under the Python installation, the gateway's
  own Python files (not the rest of its checkout), system libraries, its own ``/proc``
  entries, ``/sys``, a few devices and the job's inputs; writes only in the job
  folder, the repository's staging area and the model's own folder; no TCP (ABI >= 4);
  no signals to or abstract sockets of processes outside the sandbox (ABI >= 6). A
  Landlock domain also keeps ``/proc/<pid>/environ`` and ``ptrace`` of the gateway out
  of reach. Not covered by Landlock (ABI 7): connecting to a named Unix socket, and UDP.
"""

from __future__ import annotations

import ctypes
import errno
import os
import resource
import sys
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gateway.config.lifecycle import SandboxSpec

SOURCE_ROOT = Path(__file__).resolve().parents[3]  # holds gateway/ and converters/
SOURCE_PACKAGES = ("gateway", "converters", "infergate")
PASSED_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES",
              "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
              "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "TORCH_NUM_THREADS")
SYSTEM_READ = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/sys",
               "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime",
               "/etc/timezone", "/etc/nsswitch.conf", "/etc/passwd", "/etc/group",
               "/etc/os-release", "/etc/alternatives", "/etc/fonts")
# /proc: the worker's own entries and the machine-wide figures libraries read, not
# other processes' (their command lines name sockets and folders: HAProxy's runtime
# socket among them, which Landlock cannot keep a connect() from); "self" is resolved
# by the worker itself
PROC_READ = ("/proc/self", "/proc/thread-self", "/proc/cpuinfo", "/proc/meminfo",
             "/proc/stat", "/proc/loadavg", "/proc/uptime", "/proc/version", "/proc/sys",
             "/proc/filesystems", "/proc/driver/nvidia", "/proc/pressure")
# /dev: no /dev/shm (other clients' shared-memory tensors), no disks
DEVICE_READ = ("/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/fd",
               "/dev/nvidia-caps")
DEVICE_WRITE = ("/dev/null", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
                "/dev/nvidia-modeset", *(f"/dev/nvidia{i}" for i in range(16)))


@dataclass(frozen=True)
class SandboxPlan:
    """What one worker may touch; JSON in the task file, applied by the worker."""

    writable: tuple[str, ...]
    readable: tuple[str, ...]
    listable: tuple[str, ...] = ()  # names visible, contents not (the source checkout)
    limits: dict[str, int | None] = field(default_factory=dict)
    filesystem: str = "required"
    network: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SandboxPlan:
        return cls(tuple(data["writable"]), tuple(data["readable"]), tuple(data["listable"]),
                   dict(data["limits"]), data["filesystem"], data["network"])


def plan_for(spec: SandboxSpec, work_dir: Path, writable: Iterable[Path],
             readable: Iterable[Path] = (), gpu: bool = False) -> SandboxPlan:
    python = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    # the interpreter's import path, but not the source checkout itself: a tokens file
    # or a config may sit there; its packages are listed one by one instead
    search = {Path(p).resolve() for p in sys.path if p and Path(p).is_dir()}
    search = {p for p in search if not SOURCE_ROOT.is_relative_to(p)}
    # the packages' Python files one by one: a checkout also holds configs and tokens
    # (gateway/examples/tokens.yaml), and Landlock cannot carve those out of a folder
    packages = {path for name in SOURCE_PACKAGES for pattern in ("*.py", "*.pyc")
                for path in (SOURCE_ROOT / name).rglob(pattern)}
    system = map(Path, (*SYSTEM_READ, *PROC_READ, *DEVICE_READ))
    reads = sorted({*system, *python, *search, *packages, work_dir, *map(Path, readable),
                    *spec.read_paths}, key=str)
    writes = sorted({work_dir, *writable}, key=str)
    return SandboxPlan(
        writable=tuple(map(str, writes)), readable=tuple(map(str, reads)),
        listable=(str(SOURCE_ROOT),),  # on PYTHONPATH: imports list it
        limits={"address_space_bytes": (spec.gpu_address_space_bytes if gpu
                                        else spec.address_space_bytes),
                "cpu_seconds": spec.cpu_seconds, "file_size_bytes": spec.file_size_bytes,
                "open_files": spec.open_files, "processes": spec.processes},
        filesystem=spec.filesystem, network=spec.network,
    )


def child_environment(parent: Mapping[str, str], scratch: Path, spec: SandboxSpec,
                      allow_pickled_code: bool) -> dict[str, str]:
    env = {name: parent[name] for name in (*PASSED_ENV, *spec.pass_env) if name in parent}
    env.setdefault("LANG", "C.UTF-8")
    env.update(HOME=str(scratch), TMPDIR=str(scratch), PYTHONUNBUFFERED="1",
               PYTHONDONTWRITEBYTECODE="1", PYTHONNOUSERSITE="1",
               PYTHONPATH=str(SOURCE_ROOT), INFERGATE_PARENT_PID=str(os.getpid()))
    if not allow_pickled_code:
        env["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"  # torch.load(weights_only=False) too
    return env


class SandboxUnavailable(RuntimeError):
    """The kernel cannot confine file access and the configuration requires it."""


# -- applied in the worker ----------------------------------------------------------------
def enter(plan: SandboxPlan) -> list[str]:
    """Confine this process; returns notes for the job's log (what could not be had)."""
    notes = set_limits(plan.limits)
    notes += restrict_filesystem(plan)
    drop_capabilities()
    return notes


def set_limits(limits: Mapping[str, int | None]) -> list[str]:
    notes = []
    table = {"address_space_bytes": resource.RLIMIT_AS, "cpu_seconds": resource.RLIMIT_CPU,
             "file_size_bytes": resource.RLIMIT_FSIZE, "open_files": resource.RLIMIT_NOFILE}
    for name, which in table.items():
        value = limits.get(name)
        if value is not None:
            _lower(which, value)
    processes = limits.get("processes")
    if processes is not None:
        # RLIMIT_NPROC counts every task of the real user id, not this process tree
        _lower(resource.RLIMIT_NPROC, _tasks_of_user(os.getuid()) + processes)
        if os.getuid() == 0:
            notes.append("running as root: the kernel does not apply the process limit")
    return notes


def _lower(which: int, value: int) -> None:
    soft, hard = resource.getrlimit(which)
    value = value if hard == resource.RLIM_INFINITY else min(value, hard)
    resource.setrlimit(which, (value, value))


def _tasks_of_user(uid: int) -> int:
    count = 0
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if proc.stat().st_uid == uid:
                count += sum(1 for _ in (proc / "task").iterdir())
        except OSError:
            continue
    return count


_CAP_SETPCAP = 8
_CAP_LAST = 63
_PR_CAPBSET_DROP = 24
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def drop_capabilities() -> None:
    """No capabilities, now or after an exec: a root worker cannot raise its limits."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in range(_CAP_LAST + 1):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == errno.EPERM:
            break  # no CAP_SETPCAP: not privileged, nothing in the bounding set matters
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset: cannot drop capabilities")


# Landlock (include/uapi/linux/landlock.h)
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38
FS_READ_FILE, FS_READ_DIR = 1 << 2, 1 << 3
FS_WRITE_FILE = 1 << 1
_FS_WRITE_ABI1 = FS_WRITE_FILE | sum(1 << bit for bit in range(4, 13))  # remove/make *
FS_REFER, FS_TRUNCATE = 1 << 13, 1 << 14
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1
_FILE_RIGHTS = FS_READ_FILE | FS_WRITE_FILE | FS_TRUNCATE


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 where it has none (or it is disabled)."""
    libc = ctypes.CDLL(None, use_errno=True)
    version = libc.syscall(_SYS_CREATE_RULESET, None, 0, _CREATE_RULESET_VERSION)
    return max(int(version), 0)


def restrict_filesystem(plan: SandboxPlan) -> list[str]:
    if plan.filesystem == "off":
        return ["file-system sandbox off by configuration"]
    abi = landlock_abi()
    if abi < 2:  # ABI 1 cannot allow the rename that publishes a version
        message = (f"Landlock ABI {abi} on this kernel (needs >= 2, Linux 5.19): the "
                   "conversion worker cannot be confined to its folders")
        if plan.filesystem == "required":
            raise SandboxUnavailable(message + "; set lifecycle.sandbox.filesystem to "
                                     "'if_available' to run unconfined")
        return [message]
    write = _FS_WRITE_ABI1 | FS_REFER | (FS_TRUNCATE if abi >= 3 else 0)
    handled = FS_READ_FILE | FS_READ_DIR | write
    attr = _RulesetAttr(handled, 0, 0)
    size = 8
    if abi >= 4 and not plan.network:
        attr.handled_access_net, size = _NET_BIND_TCP | _NET_CONNECT_TCP, 16
    if abi >= 6:
        attr.scoped, size = _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL, 24
    libc = ctypes.CDLL(None, use_errno=True)
    ruleset = libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0)
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    try:
        for path in plan.listable:
            _allow(libc, ruleset, path, FS_READ_DIR, handled)
        for path in plan.readable:
            _allow(libc, ruleset, path, FS_READ_FILE | FS_READ_DIR, handled)
        for path in (*plan.writable, *DEVICE_WRITE):
            _allow(libc, ruleset, path, FS_READ_FILE | FS_READ_DIR | write, handled)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        if libc.syscall(_SYS_RESTRICT_SELF, ruleset, 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(ruleset)
    return []


def _allow(libc: ctypes.CDLL, ruleset: int, path: str, access: int, handled: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # not on this machine (e.g. /lib32, a GPU device): nothing to allow
    try:
        if not os.path.isdir(path):
            access &= _FILE_RIGHTS
        rule = _PathBeneathAttr(access & handled, fd)
        if libc.syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0):
            raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}")
    finally:
        os.close(fd)
