"""A data plane nobody programs any more neither burns a core nor runs beside the next
one: an HAProxy whose control plane is gone waits quietly for it (its ring retries the
telemetry port once a second), and a start on its run folder ends what it cannot adopt,
a master that never answers or workers whose master is gone, before it starts another
on the same ports (real HAProxy, free loopback ports)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.haproxy.process import HAProxyProcess, group_members, write_files
from gateway.haproxy.render import render
from gateway.haproxy.snapshot import Layout, Snapshot
from gateway.haproxy.telemetry import tcp_peer_uid
from gateway.netaddr import free_port
from tests.procs import wait_until

pytestmark = pytest.mark.integration  # starts the real HAProxy: make test installs it

TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def _layout(run_dir: Path) -> Layout:
    """This start's ports: the data plane's, and a control plane's (nothing listens on
    them unless a test says so)."""
    return Layout(f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}",
                  f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}", run_dir,
                  f"127.0.0.1:{free_port()}")


def _started(layout: Layout) -> HAProxyProcess:
    write_files(render(Snapshot(pools=()), layout), layout)
    process = HAProxyProcess(layout, detached=True)
    process.start()
    return process


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def _workers(process: HAProxyProcess) -> list[int]:
    assert process.pid is not None
    return [p for p in group_members(process.pid, process.layout.config_path)
            if p != process.pid]


def _haproxies(config: Path) -> set[int]:
    """Every process group running ``config``."""
    groups = set()
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and str(config).encode() in \
                    (entry / "cmdline").read_bytes().split(b"\0"):
                groups.add(os.getpgid(int(entry.name)))
    return {g for g in groups if group_members(g, config)}


@contextlib.contextmanager
def _ended(*processes: HAProxyProcess) -> Iterator[None]:
    """Every HAProxy a test started is gone when it ends, stopped or frozen."""
    try:
        yield
    finally:
        for process in processes:
            if process.pid is not None:
                for pid in group_members(process.pid, process.layout.config_path):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGCONT)
                process.stop(0.5)
            if process._proc is not None:  # noqa: SLF001 - reap our own child
                process._proc.wait(10)  # noqa: SLF001


def test_haproxy_stays_idle_when_its_control_plane_is_gone_and_reconnects_when_back(
    tmp_path: Path,
) -> None:
    """HAProxy 2.6 retries a ring server whose connect() fails at once (a unix socket
    nobody listens on) without a pause: before the telemetry went over TCP a worker left
    without its control plane spun a whole core."""
    process = _started(_layout(tmp_path))
    with _ended(process):
        (worker,) = _workers(process)
        start, first = time.monotonic(), _cpu_ticks(worker)
        budget = 0.15 * TICKS_PER_S  # seconds of CPU in the 1.5 s below; spinning: ~1.5
        over = wait_until(lambda: _cpu_ticks(worker) - first > budget
                          or time.monotonic() - start > 1.5, 10.0, 0.05)
        used = (_cpu_ticks(worker) - first) / TICKS_PER_S
        assert over and used <= 0.15, f"the worker used {used:.2f} s of CPU in 1.5 s"
        # the control plane back on the same port: the ring connects again
        host, port = process.layout.log_address.split(":")
        with socket.create_server((host, int(port))) as control:
            control.settimeout(10.0)
            connection, _ = control.accept()
            connection.close()


def test_a_start_ends_a_master_that_never_answers_instead_of_running_beside_it(
    tmp_path: Path,
) -> None:
    earlier = _started(_layout(tmp_path))
    later = HAProxyProcess(_layout(tmp_path), detached=True)
    with _ended(earlier, later):
        assert earlier.pid is not None
        (worker,) = _workers(earlier)
        os.kill(earlier.pid, signal.SIGSTOP)  # alive, silent on master.sock
        write_files(render(Snapshot(pools=()), later.layout), later.layout)
        later.start(timeout_s=1.0)
        assert later.pid != earlier.pid
        assert wait_until(lambda: not group_members(earlier.pid or 0,
                                                    earlier.layout.config_path), 10.0)
        assert _haproxies(later.layout.config_path) == {later.pid}, \
            f"the earlier HAProxy ({earlier.pid}, worker {worker}) runs beside the new one"
        host, port = later.layout.http_bind.split(":")
        socket.create_connection((host, int(port)), timeout=5).close()


def test_a_start_ends_workers_whose_master_is_gone(tmp_path: Path) -> None:
    earlier = _started(_layout(tmp_path))
    later = HAProxyProcess(_layout(tmp_path), detached=True)
    with _ended(earlier, later):
        assert earlier.pid is not None and earlier._proc is not None  # noqa: SLF001
        (worker,) = _workers(earlier)
        # frozen, the worker cannot read the master's end of their socket pair, where it
        # would see the master exit: it outlives its master
        os.kill(worker, signal.SIGSTOP)
        earlier._proc.kill()  # noqa: SLF001
        earlier._proc.wait(10)  # noqa: SLF001
        assert group_members(earlier.pid, earlier.layout.config_path) == [worker]
        write_files(render(Snapshot(pools=()), later.layout), later.layout)
        later.start(timeout_s=2.0)
        assert wait_until(lambda: not group_members(earlier.pid or 0,
                                                    earlier.layout.config_path), 10.0), \
            f"the worker ({worker}) whose master is gone outlived the next start"
        assert _haproxies(later.layout.config_path) == {later.pid}


PROC_NET_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F92 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 7
   1: 0100007F:9C40 0100007F:1F92 01 00000000:00000000 00:00000000 00000000  4242        0 8
   2: 0100007F:1F92 0100007F:9C40 01 00000000:00000000 00:00000000 00000000  1000        0 9
"""


def test_the_telemetry_port_tells_its_own_users_connections_from_others(
    tmp_path: Path,
) -> None:
    """Over TCP, what a unix socket's mode kept private: who owns a connection."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        local = server.getsockname()
        with socket.create_connection(local, timeout=5) as client:
            accepted, _ = server.accept()
            accepted.close()
            assert tcp_peer_uid(client.getsockname(), local) == os.getuid()
    table = tmp_path / "tcp"
    table.write_text(PROC_NET_TCP)  # 127.0.0.1:40000 -> 127.0.0.1:8082, another user's
    if sys.byteorder == "little":
        assert tcp_peer_uid(("127.0.0.1", 40000), ("127.0.0.1", 8082), table) == 4242
    assert tcp_peer_uid(("127.0.0.1", 40001), ("127.0.0.1", 8082), table) is None
