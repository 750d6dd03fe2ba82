"""``gateway serve``'s data-plane replica, a process in a session of its own
(gateway/local_replica.py): a start that fails leaves none behind; one that exits is
started again, waiting longer while it keeps exiting."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from gateway.local_replica import (
    PID_FILE,
    RESTART_FIRST_S,
    RESTART_MAX_S,
    STABLE_S,
    RestartBackoff,
)
from infergate.processes import GatewayProcess, pools_yaml, run_gateway, wait_until
from infergate.triton.local import TritonEndpoints, free_port, free_ports

ROOT = Path(__file__).resolve().parents[2]


def _processes_of(folder: Path) -> list[int]:
    """The processes whose command line names ``folder`` (the replica's state folder is
    inside it)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            try:
                if str(folder).encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


@pytest.mark.integration
def test_a_start_whose_haproxy_cannot_bind_leaves_no_replica_behind(tmp_path: Path) -> None:
    """HAProxy could not bind the gRPC port (another process listens there): the start
    fails, and the replica it had begun (a session of its own, deaf to SIGTERM while it
    waited for its configuration) is stopped with it. Found: one such replica left by a
    test, asking a control plane gone for 50 minutes, once a second."""
    pools = tmp_path / "pools.yaml"
    pools.write_text(yaml.safe_dump({"pools": [{"name": "p", "members": [
        {"host": "127.0.0.1", "http_port": free_port(), "grpc_port": free_port()}]}]}))
    run_dir = tmp_path / "haproxy"
    with socket.socket() as taken:  # (no SO_REUSEPORT: HAProxy cannot share it)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        answer = subprocess.run(
            [sys.executable, "-m", "gateway", "serve", "--pools", str(pools),
             "--http-port", str(free_port()), "--grpc-port", str(taken.getsockname()[1]),
             "--data-plane", "haproxy", "--haproxy-run-dir", str(run_dir),
             "--log-level", "warning"],
            cwd=ROOT, capture_output=True, text=True, timeout=120)
    left = _processes_of(run_dir)
    for pid in left:  # (this test's own, by id: none is left behind even when it fails)
        os.kill(pid, signal.SIGKILL)
    assert answer.returncode != 0, answer.stderr[-2000:]
    assert (run_dir / "replica.log").exists()  # the replica had been started
    assert left == [], answer.stderr[-2000:]


def test_a_replica_that_keeps_exiting_waits_longer_each_time_and_one_that_ran_waits_little(
) -> None:
    backoff = RestartBackoff()
    now = backoff.start_at(100.0)  # (one adopted: this process never started it)
    waits = [backoff.wait_s]
    for _ in range(8):  # each start exits at once (a port another process holds)
        backoff.started(now)
        now = backoff.start_at(now)
        waits.append(backoff.wait_s)
    assert waits[:4] == [RESTART_FIRST_S, 2 * RESTART_FIRST_S, 4 * RESTART_FIRST_S,
                         8 * RESTART_FIRST_S]
    assert waits[-1] == RESTART_MAX_S and sorted(waits) == waits
    backoff.started(now)
    assert backoff.start_at(now + STABLE_S) == now + STABLE_S + RESTART_FIRST_S
    backoff.started(now + STABLE_S + 1)
    assert backoff.start_at(now + STABLE_S + 2) == now + STABLE_S + 2 + 2 * RESTART_FIRST_S


def _replica_pid(run_dir: Path) -> int | None:
    try:
        return int((run_dir / PID_FILE).read_text())
    except (OSError, ValueError):
        return None


def _live_through(gateway: GatewayProcess) -> bool:
    """The gateway's health call, which HAProxy hands to the replica."""
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(f"http://{gateway.http_url}/v2/health/live").status_code == 200
    return False


@pytest.mark.integration
def test_a_replica_that_exits_is_started_again_and_serves(tmp_path: Path) -> None:
    """Before, nothing watched it: a replica killed (or one whose port another process
    took) left HAProxy sending health calls, streams and misses nowhere, for good."""
    nobody = TritonEndpoints("127.0.0.1", *free_ports(3))  # (health needs no member)
    pools = pools_yaml(tmp_path / "pools.yaml", {"p": [nobody]})
    with run_gateway(pools, tmp_path, data_plane="haproxy", replica=True, until="live") as gw:
        run_dir = tmp_path / f"haproxy-{gw.http_port}"
        first = _replica_pid(run_dir)
        assert first is not None and wait_until(lambda: _live_through(gw), 30)
        os.kill(first, signal.SIGKILL)
        assert wait_until(lambda: _replica_pid(run_dir) not in (None, first)
                          and _live_through(gw), 60), gw.log.read_text()[-2000:]
        assert f"the data-plane replica (pid {first}) exited" in gw.log.read_text()
