"""Run the gateway as a real subprocess on free loopback ports (tests, benchmarks,
load tests), and wait for it to be ready. Always stopped with SIGTERM on exit."""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from gateway.haproxy.snapshot import sockets_fit
from gateway.netaddr import free_ports
from infergate.triton.local import TritonEndpoints

ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 90.0
STARTED_LINE = "infergate gateway ("  # what gateway.server logs once it serves
# run_gateway's default for ``replica``: the layout `gateway serve` runs (the test suite
# sets it False for the gateways that test everything else: one process fewer to start)
REPLICA_PROCESS = True


# a start that failed because another process took a port between free_ports() and the
# bind (uvicorn's, HAProxy's or gRPC's words, lower case): started again on other ports
PORT_TAKEN = ("address already in use", "failed to bind", "cannot bind socket")
START_TRIES = 3


class GatewayNotStarted(RuntimeError):
    """A gateway process that exited, or did not answer, before it served (the message
    is its last words; ``log``: the whole of them)."""

    def __init__(self, message: str, log: Path) -> None:
        super().__init__(message)
        self.log = log


def port_taken(log_text: str) -> bool:
    """Whether a gateway's log says a port it was given was taken before it bound it."""
    text = log_text.lower()
    return any(words in text for words in PORT_TAKEN)


def wait_until(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()


def pools_yaml(path: Path, pools: dict[str, list[TritonEndpoints]], **extra: object) -> Path:
    data = {
        "pools": [
            {
                "name": name,
                "members": [
                    {"host": e.host, "http_port": e.http_port, "grpc_port": e.grpc_port,
                     "metrics_port": e.metrics_port}
                    for e in members
                ],
                **extra,
            }
            for name, members in pools.items()
        ]
    }
    path.write_text(yaml.safe_dump(data))
    return path


@dataclass
class FrontDoor:
    """A process serving the gateway's two ports on loopback."""

    proc: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"


@dataclass
class GatewayProcess(FrontDoor):
    log: Path
    data_plane: str = "auto"

    def terminate(self, timeout_s: float = 30.0) -> int:
        return stop_process(self.proc, timeout_s)


def stop_process(proc: subprocess.Popen[Any], timeout_s: float = 15.0,
                 sig: int = signal.SIGTERM) -> int:
    """End a child this code started: ``sig`` (SIGTERM), SIGKILL after ``timeout_s``;
    its status."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait(timeout=10)


# the gateways' log level in tests (INFERGATE_TEST_LOG_LEVEL=info to see every call)
LOG_LEVEL = os.environ.get("INFERGATE_TEST_LOG_LEVEL", "warning")


_SHORT_RUN_DIRS: set[Path] = set()  # made by haproxy_beside, removed as this process exits


def haproxy_beside(log_dir: Path, http_port: int) -> Path:
    """HAProxy's run folder for a gateway a test or a benchmark starts: beside its log,
    ``log_dir/haproxy-PORT``, so that a leftover process is traceable to its run. Where
    that path is too long for HAProxy's unix sockets (a deep temporary folder: the
    gateway would use its default folder instead, and a test reading this one would
    find nothing there), ``log_dir/haproxy-PORT`` is a link to a short folder of the
    temporary directory, named after it: a gateway started again on the same ports (a
    restart that adopts the HAProxy left serving) finds the same one. Those folders are
    removed as this process exits, once its tests have stopped what they started."""
    beside = log_dir.resolve() / f"haproxy-{http_port}"
    if beside.is_symlink() or sockets_fit(beside):
        return beside
    digest = hashlib.sha256(str(beside).encode()).hexdigest()[:16]
    short = Path(tempfile.gettempdir()) / f"ig-haproxy-{digest}"
    short.mkdir(mode=0o700, exist_ok=True)
    beside.symlink_to(short, target_is_directory=True)
    if not _SHORT_RUN_DIRS:
        atexit.register(_remove_short_run_dirs)
    _SHORT_RUN_DIRS.add(short)
    return beside


def _remove_short_run_dirs() -> None:
    for short in _SHORT_RUN_DIRS:
        shutil.rmtree(short, ignore_errors=True)


@contextlib.contextmanager
def run_gateway(pools_file: Path, log_dir: Path, *args: str,
                data_plane: str | None = None,
                ports: tuple[int, int] | None = None,
                until: str = "ready", source: Path | None = None,
                replica: bool | None = None) -> Iterator[GatewayProcess]:
    """``data_plane``: ``haproxy``, ``python`` or ``none`` (None: the gateway's default,
    auto); ``ports``: (HTTP, gRPC), default free ones; ``until``: the health endpoint to
    wait for, ``ready`` (the process's own start: not a data plane a previous one left
    serving the ports) or ``live`` (a gateway whose preloading cannot finish, a
    standby control plane); ``replica``: with HAProxy, the data-plane replica in a
    process of its own (``gateway serve``'s default) or inside the gateway's
    (``--no-replica-process``); None: :data:`REPLICA_PROCESS`; ``source``:
    the checkout whose gateway runs (another commit's, for a benchmark of before and
    after in one run; default this one)."""
    # (absolute: another checkout's gateway runs in that checkout)
    pools_file, log_dir = pools_file.resolve(), log_dir.resolve()
    if data_plane is not None:
        args = ("--data-plane", data_plane, *args)
    if not (REPLICA_PROCESS if replica is None else replica):
        args = ("--no-replica-process", *args)
    with started_on_free_ports(lambda picked: _start_gateway(
            pools_file, log_dir, picked, args, until, source, data_plane),
            ports) as gateway:
        yield gateway


@contextlib.contextmanager
def started_on_free_ports(start: Callable[[tuple[int, int]], GatewayProcess],
                          ports: tuple[int, int] | None = None) -> Iterator[GatewayProcess]:
    """``start((HTTP, gRPC) ports)`` on free ports, again on other ones (up to
    :data:`START_TRIES` starts in all) when another process took one of them before the
    gateway bound it; ``ports`` given: on those, once. Stopped with SIGTERM on exit."""
    for attempt in range(1, START_TRIES + 1):
        picked = ports
        if picked is None:
            http_port, grpc_port = free_ports(2)
            picked = (http_port, grpc_port)
        try:
            gateway = start(picked)
        except GatewayNotStarted as err:
            if ports is not None or attempt == START_TRIES or \
                    not port_taken(err.log.read_text(errors="replace")):
                raise
            continue
        try:
            yield gateway
        finally:
            gateway.terminate()
        return


def _start_gateway(pools_file: Path, log_dir: Path, ports: tuple[int, int],
                   args: tuple[str, ...], until: str, source: Path | None,
                   data_plane: str | None) -> GatewayProcess:
    """:func:`run_gateway`'s process, once ``until`` answers 200;
    :class:`GatewayNotStarted` when it exits first or does not answer in time (then it
    is stopped)."""
    http_port, grpc_port = ports
    # HAProxy's files beside the log, so that a leftover process is traceable to its test
    args = ("--haproxy-run-dir", str(haproxy_beside(log_dir, http_port)), *args)
    log = log_dir / f"gateway-{http_port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--pools", str(pools_file),
             "--http-port", str(http_port), "--grpc-port", str(grpc_port),
             "--probe-interval", "0.5", "--log-level", LOG_LEVEL, *args],
            cwd=source or ROOT, stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    gateway = GatewayProcess(proc, http_port, grpc_port, log, data_plane or "auto")
    try:
        def ready() -> bool:
            if proc.poll() is not None:
                raise GatewayNotStarted(f"gateway exited: {log.read_text()[-2000:]}", log)
            # (its own start, not the data plane a previous one left serving the ports)
            if until == "ready" and LOG_LEVEL.lower() in ("debug", "info", "warning") and \
                    STARTED_LINE not in log.read_text(errors="replace"):
                return False
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"http://{gateway.http_url}/v2/health/{until}").status_code == 200
            return False

        # a deadline, not a timing: readiness waits for preloading, which on a loaded
        # 2-core machine can take Triton tens of seconds
        if not wait_until(ready, READY_TIMEOUT_S):
            raise GatewayNotStarted(f"gateway not {until} after {READY_TIMEOUT_S:g} s: "
                                    f"{log.read_text()[-2000:]}", log)
    except BaseException:
        gateway.terminate()
        raise
    return gateway


@dataclass
class AgentProcess(FrontDoor):
    status_port: int
    log: Path

    def status(self) -> dict[str, object]:
        return dict(httpx.get(f"http://127.0.0.1:{self.status_port}/status").json())


@contextlib.contextmanager
def run_agent(control: GatewayProcess, state_dir: Path, token: str | None = None,
              source: Path | None = None, *args: str) -> Iterator[AgentProcess]:
    """A data-plane replica (HAProxy + agent) following ``control``'s snapshots;
    ``source``: another checkout's agent (default this one); ``args``: more of the
    agent's options."""
    http_port, grpc_port, status_port = free_ports(3)
    state_dir.mkdir(parents=True, exist_ok=True)
    log = state_dir / "agent.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if token is not None:
        env["INFERGATE_AGENT_TOKEN"] = token
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "agent", "--control-plane", control.http_url,
             "--control-grpc", control.grpc_url, "--state-dir", str(state_dir),
             "--http-port", str(http_port), "--grpc-port", str(grpc_port),
             "--status-port", str(status_port), "--log-level", "warning", *args],
            cwd=source or ROOT, stdout=out, stderr=subprocess.STDOUT, env=env,
        )
    agent = AgentProcess(proc, http_port, grpc_port, status_port, log)
    try:
        def up() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"agent exited: {log.read_text()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                return bool(agent.status()["version"])
            return False

        if not wait_until(up, 30):
            raise RuntimeError(f"agent not up: {log.read_text()[-2000:]}")
        yield agent
    finally:
        stop_process(proc, 30)
