"""``gateway serve``'s data-plane replica, a process in a session of its own
(gateway/local_replica.py): a start that fails leaves none behind."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from infergate.triton.local import free_port

pytestmark = pytest.mark.integration
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
