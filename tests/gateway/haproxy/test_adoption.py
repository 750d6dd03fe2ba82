"""``gateway serve --data-plane haproxy`` on one node survives its control plane: HAProxy
outlives a crash (SIGKILL) of the Python process and keeps routing inference on its last
configuration, the same command started again adopts that HAProxy through its master
socket (same master, reloaded onto the new process's ports), and a graceful stop ends it.
Real processes: Triton, the gateway as a subprocess, HAProxy, real clients under load."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from converters.tiny import TINY_MODEL_NAME, TINY_WIDTH
from gateway.server import GatewaySettings, haproxy_run_dir
from infergate.triton.local import free_port
from tests.conftest import triton_settings
from tests.procs import pools_yaml, run_gateway, started_triton, wait_until

pytestmark = pytest.mark.integration
OUTAGE_ANSWERS = 100  # answers while the Python process is dead, and after the restart


def _haproxy_parents(run_dir: Path) -> dict[int, int]:
    """Live HAProxy processes on ``run_dir``'s configuration: pid -> parent pid."""
    found = {}
    config = str(run_dir / "haproxy.cfg").encode()
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] != "Z" and b"haproxy" in cmdline[0] and config in cmdline:
                found[int(proc.name)] = int(fields[1])
    return found


def _master(run_dir: Path) -> int:
    parents = _haproxy_parents(run_dir)
    (master,) = [pid for pid, parent in parents.items() if parent not in parents]
    return master


class Load(threading.Thread):
    """Unary inference through the gateway's two ports, back to back, on one client per
    protocol kept for the whole test (its connections are what a reload must keep):
    the time and protocol of each success and failure."""

    def __init__(self, http_url: str, grpc_url: str) -> None:
        super().__init__(daemon=True)
        self.urls = {"http": http_url, "grpc": grpc_url}
        self.stop = threading.Event()
        self.ok: list[tuple[float, str]] = []
        self.failed: list[tuple[float, str, str]] = []

    def run(self) -> None:
        x = np.ones((1, TINY_WIDTH), np.float32)
        clients = {name: module.InferenceServerClient(self.urls[name])
                   for name, module in (("http", httpclient), ("grpc", grpcclient))}
        modules = {"http": httpclient, "grpc": grpcclient}
        while not self.stop.is_set():
            for name, client in clients.items():
                inp = modules[name].InferInput("x", list(x.shape), "FP32")
                inp.set_data_from_numpy(x)
                try:
                    y = client.infer(TINY_MODEL_NAME, [inp]).as_numpy("y")
                    assert y is not None and float(y[0][0]) == 3.0
                    self.ok.append((time.monotonic(), name))
                except Exception as exc:  # noqa: BLE001 - every failure is counted
                    self.failed.append((time.monotonic(), name, repr(exc)[:200]))
            time.sleep(0.01)
        for client in clients.values():
            client.close()

    def between(self, start: float, end: float) -> tuple[int, int]:
        """(successes, failures) in [start, end)."""
        return (sum(start <= t < end for t, _ in self.ok),
                sum(start <= t < end for t, _, _ in self.failed))

    def longest_gap(self, name: str) -> float:
        times = [t for t, n in self.ok if n == name]
        return max(b - a for a, b in zip(times, times[1:], strict=False))


def test_serve_haproxy_outlives_a_crash_and_the_restart_adopts_it(
    tiny_repo: Path, tmp_path: Path,
) -> None:
    ports = (free_port(), free_port())
    run_dir = haproxy_run_dir(GatewaySettings(
        http_port=ports[0], grpc_port=ports[1],
        haproxy_run_dir=tmp_path / f"haproxy-{ports[0]}"))  # run_gateway's folder
    with started_triton(triton_settings(tiny_repo, tmp_path, TINY_MODEL_NAME)) as triton:
        assert triton.endpoints is not None
        pools = pools_yaml(tmp_path / "pools.yaml", {"local": [triton.endpoints]})
        with run_gateway(pools, tmp_path, data_plane="haproxy", ports=ports) as gw:
            master = _master(run_dir)
            load = Load(gw.http_url, gw.grpc_url)
            load.start()
            assert wait_until(lambda: len(load.ok) >= 20, 30)
            gw.proc.kill()  # a crash: no drain, no clean-up
            gw.proc.wait(10)
            killed = time.monotonic()
            served = len(load.ok)  # the outage: requests go on being answered
            assert wait_until(lambda: len(load.ok) >= served + OUTAGE_ANSWERS, 30)
        assert _master(run_dir) == master, "HAProxy died with the Python process"
        restarted = time.monotonic()
        with run_gateway(pools, tmp_path, data_plane="haproxy", ports=ports) as again:
            ready = time.monotonic()
            assert _master(run_dir) == master  # adopted, not started anew
            assert "adopting the running master" in again.log.read_text()
            served = len(load.ok)  # served by the reloaded HAProxy
            assert wait_until(lambda: len(load.ok) >= served + OUTAGE_ANSWERS, 30)
            load.stop.set()
            load.join(30)
            after = time.monotonic()
            again.terminate()
            assert again.proc.returncode == 0
        gone = wait_until(lambda: not _haproxy_parents(run_dir), 10)
    dead, restart, served = (load.between(killed, restarted), load.between(restarted, ready),
                             load.between(ready, after))
    print(f"\nwhile dead ({restarted - killed:.1f} s): {dead[0]} ok, {dead[1]} failed; "
          f"restart ({ready - restarted:.1f} s): {restart[0]} ok, {restart[1]} failed; "
          f"after ({after - ready:.1f} s): {served[0]} ok, {served[1]} failed; longest gap "
          f"http {load.longest_gap('http'):.2f} s, grpc {load.longest_gap('grpc'):.2f} s; "
          f"failures: {load.failed[:3]}")
    assert gone, f"HAProxy left behind: {_haproxy_parents(run_dir)}"
    assert dead[0] > 0 and restart[0] > 0 and served[0] > 0
    assert not load.failed, load.failed[:5]
