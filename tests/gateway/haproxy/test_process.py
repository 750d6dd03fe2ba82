"""HAProxy as the gateway's child: it ends with the process that started it, however
that process ends, and it is started without running Python between fork and exec (the
gateway's gRPC threads make such a fork unsafe). Detached (``gateway serve``), it
outlives its starter's crash, and the next start on its folder adopts it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import grpc
import pytest

from gateway.haproxy.process import (
    HAProxyError,
    HAProxyProcess,
    _die_with_parent_command,
    write_files,
)
from gateway.haproxy.render import render
from gateway.haproxy.snapshot import Layout, Snapshot
from gateway.netaddr import free_port
from tests.procs import ROOT, wait_until

STARTER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import grpc  # gRPC's threads running, as in the gateway
    from concurrent import futures
    from gateway.haproxy.process import HAProxyProcess, write_files
    from gateway.netaddr import free_port
    from gateway.haproxy.render import render
    from gateway.haproxy.snapshot import Layout, Snapshot
    server = grpc.server(futures.ThreadPoolExecutor(2))
    server.add_insecure_port("127.0.0.1:0")
    server.start()
    run = Path(sys.argv[1])
    layout = Layout(f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}",
                    f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}", run,
                    f"127.0.0.1:{free_port()}")
    write_files(render(Snapshot(pools=()), layout), layout)
    process = HAProxyProcess(layout, detached=sys.argv[2] == "detached")
    process.start()
    print(process.pid, flush=True)
    time.sleep(600)
""")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.integration  # starts the real HAProxy: make test installs it
def test_haproxy_ends_with_its_starter_when_the_starter_is_killed(tmp_path: Path) -> None:
    assert grpc is not None
    starter = subprocess.Popen([sys.executable, "-c", STARTER, str(tmp_path), "attached"],
                               cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert starter.stdout is not None
        pid = int(starter.stdout.readline())
        assert _alive(pid) and "haproxy" in Path(f"/proc/{pid}/cmdline").read_text()
        os.kill(starter.pid, signal.SIGKILL)
        starter.wait(10)
        assert wait_until(lambda: not _alive(pid), 30), "HAProxy outlived its starter"
    finally:
        starter.kill()
        starter.wait(10)


@pytest.mark.integration
def test_detached_haproxy_outlives_its_starter_and_is_adopted_when_started_again(
    tmp_path: Path,
) -> None:
    starter = subprocess.Popen([sys.executable, "-c", STARTER, str(tmp_path), "detached"],
                               cwd=ROOT, stdout=subprocess.PIPE, text=True)
    master = None
    try:
        assert starter.stdout is not None
        master = int(starter.stdout.readline())
        os.kill(starter.pid, signal.SIGKILL)
        starter.wait(10)
        time.sleep(0.5)
        assert _alive(master), "a detached HAProxy died with its starter"
        # the next start on the same folder: new control ports, the same master
        layout = Layout(f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}",
                        f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}", tmp_path,
                        f"127.0.0.1:{free_port()}")
        write_files(render(Snapshot(pools=()), layout), layout)
        process = HAProxyProcess(layout, detached=True)
        assert process.live_master() == master
        process.start()
        assert process.pid == master
        host, port = layout.http_bind.split(":")
        socket.create_connection((host, int(port)), timeout=5).close()  # reloaded onto it
        process.stop(1.0)
        assert not _alive(master) and process.live_master() is None
    finally:
        starter.kill()
        starter.wait(10)
        if master is not None and _alive(master):
            os.killpg(master, signal.SIGKILL)


GET_PDEATHSIG = ("import ctypes; libc = ctypes.CDLL('libc.so.6'); sig = ctypes.c_int(); "
                 "libc.prctl(2, ctypes.byref(sig)); print(sig.value)")  # PR_GET_PDEATHSIG


@pytest.mark.skipif(not _die_with_parent_command(), reason="util-linux setpriv not here")
def test_the_child_gets_sigterm_as_its_parent_death_signal_when_started_by_setpriv() -> None:
    """What HAProxy's start relies on instead of a ``preexec_fn``."""
    prefix = _die_with_parent_command()
    child = subprocess.run([*prefix, sys.executable, "-c", GET_PDEATHSIG],
                           capture_output=True, text=True, check=True)
    plain = subprocess.run([sys.executable, "-c", GET_PDEATHSIG],
                           capture_output=True, text=True, check=True)
    assert int(child.stdout) == signal.SIGTERM and int(plain.stdout) == 0


@pytest.mark.integration
def test_a_refused_configuration_is_told_by_its_alert_however_many_warnings_follow(
        tmp_path: Path) -> None:
    """``haproxy -c`` on a configuration with one error and many warnings after it: the
    error's message names the error (it once kept only the last 2,000 characters, all
    warnings, and a replica's failed start said nothing of why)."""
    layout = Layout(*(f"127.0.0.1:{free_port()}" for _ in range(4)), tmp_path,
                    f"127.0.0.1:{free_port()}")
    write_files(render(Snapshot(pools=()), layout), layout)
    warnings = "".join(f"backend warned{n}\n    timeout client 5s\n" for n in range(60))
    with layout.config_path.open("a") as config:
        config.write("backend broken\n    no-such-keyword here\n" + warnings)
    with pytest.raises(HAProxyError) as refused:
        HAProxyProcess(layout).check()
    message = str(refused.value)
    assert "no-such-keyword" in message and "[ALERT]" in message
    assert "[WARNING]" in message and len(message) < 2100  # warnings while room is left
