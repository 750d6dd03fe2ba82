"""HAProxy's request rules, what they cost: HAProxy's CPU per gRPC request through the
configuration the gateway renders, with and without tenancy, interleaved rounds in one
run, each checkout (``--source``) side by side.

Nothing runs but HAProxy and h2load, so the rules' cost is not lost in a model's: the
gateway's own renderer (``gateway.haproxy.render``, run in each checkout) writes the
configuration of one pool with one member and one model (``tiny``), and

- ``rules``: the gRPC frontend answers every request itself right after its request
  rules (``http-request return``, grpc-status 0), before any backend: the rules alone;
- ``member``: the request goes on to the member, a second HAProxy standing in for
  Triton that answers at once, over one shared HTTP/2 connection (the member reports
  Triton 2.57.0, as production members should: ``gateway.upstream.triton_version``).

Each arm: ``none`` (no ``tenancy:``), ``tenant`` (one standard tenant with its own API
key beside the default one, its class and share, no limits: an admitted request meets
every rule), ``queued`` (the same tenant, its pool queueing in the gateway: the member
taking 32 requests at once, more than are ever in flight here, so none waits, and a lane
of 2: ``gateway.policy.queueing``). h2load sends open loop at ``--rate`` requests a
second over 4 HTTP/2 connections of 4 streams, so every arm does the same work per second
whatever it costs; HAProxy's utime + stime from ``/proc`` over the requests answered,
medians over rounds. Every answer must be HTTP 200 with the rules' own header saying the
tenant was read (``x-bench-tenant``), or the run stops.

    python -m loadtests.bench_rules [--rounds 7] [--seconds 3] [--rate 8000] \
        [--source before=DIR] [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.netaddr import free_ports
from infergate.processes import stop_process
from loadtests.h2load import INFER, run_h2load
from loadtests.harness import median, parse_source, publish, reporter, table
from loadtests.proc_cpu import parse_proc_stat

HERE = Path(__file__).resolve().parent.parent
say = reporter("bench_rules")
MODEL = "tiny"
KEY = "bench-rules-key-0123456789"
TENANT = "solo"
ARMS = ("none", "tenant", "queued")
PATHS = ("rules", "member")
STREAMS = (4, 4)  # h2load connections, streams each

# Run in each checkout with only ``gateway`` imported from it (argv: arm, path, run dir,
# HTTP, gRPC, control ports..., member's gRPC port): writes its files, prints the config.
RENDER = r'''
import sys
from dataclasses import replace
from pathlib import Path
from gateway.haproxy.process import write_files
from gateway.haproxy.render import render
from gateway.haproxy.snapshot import (Layout, MemberState, PoolState, RouteState, Snapshot,
                                      TenancyState, TenantState, server_name)
from gateway.policy.access import key_digest
arm, path, run, http, grpc, c1, c2, c3, member, health = sys.argv[1:11]
layout = Layout(f"127.0.0.1:{http}", f"127.0.0.1:{grpc}", f"127.0.0.1:{c1}",
                f"127.0.0.1:{c2}", Path(run), f"127.0.0.1:{c3}")
port, health_port = int(member), int(health)
queue = {"member_slots": 32, "max_wait_ms": 5000, "lane_slots": 2} if arm == "queued" else {}
pool = PoolState("main", (MemberState(server_name(f"127.0.0.1:{health_port}"), "127.0.0.1",
                                      health_port, port, True, triton_version="2.57.0"),),
                 capacity=8, **queue)
tenancy = None if arm == "none" else TenancyState(
    tenants=(TenantState("default", "standard"), TenantState(TENANT, "standard")),
    keys=((key_digest(KEY), TENANT),),
    ceilings=(("main", "sheddable", 12), ("main", "standard", 16), ("main", "critical", 24)),
    shares=(("main", "default", 16), ("main", TENANT, 16)),
    bounds=(("sheddable", 334), ("standard", 667), ("critical", 1000)),
    pool_bounds=(("main", "sheddable", 500), ("main", "standard", 667),
                 ("main", "critical", 1000)))
rendered = render(Snapshot(pools=(pool,), routes=(RouteState(MODEL, (("main", 1.0),), 64),),
                           tenancy=tenancy), layout)
config = rendered.config
head, frontend = config.split("\nfrontend grpc\n", 1)
rules, rest = frontend.split("\n  http-response ", 1)
if path == "rules":
    rules += "\n  http-request return status 200 hdr grpc-status 0"
rules += "\n  http-after-response set-header x-bench-tenant %[var(txn.tn)]"
config = head + "\nfrontend grpc\n" + rules + "\n  http-response " + rest
write_files(replace(rendered, config=config), layout)
print(layout.config_path)
'''

MEMBER = """global
  nbthread 1
defaults
  mode http
  timeout connect 2s
  timeout client 30s
  timeout server 30s
frontend member
  bind 127.0.0.1:{port} proto h2
  http-request return status 200 hdr grpc-status 0 hdr content-type application/grpc
frontend health
  bind 127.0.0.1:{health}
  http-request return status 200
"""


@dataclass(frozen=True)
class Cell:
    source: str
    arm: str
    path: str


def render(source: Path, arm: str, path: str, run_dir: Path, member: tuple[int, int]) -> Path:
    """The checkout ``source``'s configuration for ``arm`` and ``path`` (its files in
    ``run_dir``; ``member``: the stand-in's gRPC and health ports); the render runs
    there, in a Python of its own."""
    ports = [str(p) for p in free_ports(5)]
    script = f"MODEL, KEY, TENANT = {MODEL!r}, {KEY!r}, {TENANT!r}\n" + RENDER
    env = {**os.environ, "PYTHONPATH": str(source)}
    done = subprocess.run([sys.executable, "-c", script, arm, path, str(run_dir), *ports,
                           *(str(p) for p in member)], cwd=source, env=env, capture_output=True,
                          text=True, check=False, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"rendering in {source} failed: {done.stderr[-2000:]}")
    return Path(done.stdout.strip())


def grpc_port(config: Path) -> int:
    text = config.read_text()
    bind = text.split("\nfrontend grpc\n", 1)[1].split("\n", 2)[0].split()[1]
    return int(bind.rsplit(":", 1)[1])


@contextlib.contextmanager
def haproxy(config: Path, port: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """HAProxy in the foreground on ``config``, once ``port`` accepts; stopped by pid."""
    with log.open("wb") as out:
        proc = subprocess.Popen(["haproxy", "-db", "-f", str(config)], stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        ends = time.monotonic() + 10
        while not _listening(port):
            if proc.poll() is not None or time.monotonic() > ends:
                raise RuntimeError(f"haproxy on {config} did not start: "
                                   f"{log.read_text()[-1500:]}")
            time.sleep(0.05)
        yield proc
    finally:
        stop_process(proc, 5)


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def cpu_ticks(pid: int) -> int:
    return parse_proc_stat(Path(f"/proc/{pid}/stat").read_text()).ticks


def body_file(folder: Path) -> Path:
    """A gRPC-framed ModelInferRequest naming the model (field 1), nothing else."""
    message = b"\x0a" + bytes([len(MODEL)]) + MODEL.encode()
    path = folder / "request.grpc"
    path.write_bytes(b"\x00" + len(message).to_bytes(4, "big") + message)
    return path


def measure(config: Path, folder: Path, body: Path, seconds: float, rate: int,
            tenant: bool) -> float:
    """HAProxy's CPU per request (us) on ``config`` under h2load at ``rate`` a second.
    One request before and one after must be answered as :func:`check_answer` expects:
    h2load counts any HTTP 200 a success, and a member marked down is answered HTTP 200
    with grpc-status 14."""
    port = grpc_port(config)
    with haproxy(config, port, folder / "haproxy.log") as proc:
        check_answer(port, body, tenant)
        connections, streams = STREAMS
        command = ["h2load", "-D", f"{round(seconds * 1000)}ms",
                   "-c", str(connections), "-m", str(streams),
                   "--rps", f"{rate / connections:g}", "-d", str(body),
                   "-H", "content-type: application/grpc", "-H", "te: trailers",
                   "-H", f"x-api-key: {KEY}",
                   f"http://127.0.0.1:{port}{INFER}"]
        before = cpu_ticks(proc.pid)
        ran = run_h2load(command, seconds + 30)
        spent = cpu_ticks(proc.pid) - before
        check_answer(port, body, tenant)
    summary = ran.summary()
    if summary.succeeded != summary.done or summary.done == 0:
        raise RuntimeError(f"{config}: not every request answered 200: {ran.gist()}")
    return spent / os.sysconf("SC_CLK_TCK") * 1e6 / summary.done


def check_answer(port: int, body: Path, tenant: bool) -> None:
    """One request to the gateway's gRPC ``port``: HTTP 200, grpc-status 0, and with a
    ``tenant`` the tenant its rules read."""
    done = subprocess.run(["nghttp", "-v", "-H", "content-type: application/grpc",
                           "-H", f"x-api-key: {KEY}", "-d", str(body),
                           f"http://127.0.0.1:{port}{INFER}"],
                          capture_output=True, text=True, timeout=30, check=False)
    wants = [":status: 200", "grpc-status: 0", *([f"x-bench-tenant: {TENANT}"] * tenant)]
    if not all(want in done.stdout for want in wants):
        raise RuntimeError(f"unexpected answer on port {port} (wanted {wants}):\n"
                           f"{done.stdout[-1500:]}{done.stderr[-500:]}")


def run(rounds: int = 7, seconds: float = 3.0, rate: int = 8000,
        sources: Mapping[str, Path] | None = None) -> list[dict[str, Any]]:
    """Every cell of every checkout (``sources``: name -> checkout, default this one),
    interleaved ``rounds`` times: :func:`rows_of` their figures."""
    sources = sources or {"this": HERE}
    cells = [Cell(name, arm, path) for name in sources for path in PATHS for arm in ARMS]
    figures: dict[Cell, list[float]] = {cell: [] for cell in cells}
    with tempfile.TemporaryDirectory(prefix="bench_rules_") as tmp:
        folder = Path(tmp)
        body = body_file(folder)
        with member(folder) as ports:
            configs = {}
            for i, cell in enumerate(cells):
                configs[cell] = render(sources[cell.source], cell.arm, cell.path,
                                       folder / f"run{i}", ports)
            for r in range(rounds):
                for cell in cells:
                    us = measure(configs[cell], folder, body, seconds, rate,
                                 cell.arm != "none")
                    figures[cell].append(us)
                    say(f"round {r + 1}/{rounds}: {cell.source} {cell.path} {cell.arm}: "
                        f"{us:.1f} us/request")
    return rows_of(figures)


@contextlib.contextmanager
def member(folder: Path) -> Iterator[tuple[int, int]]:
    """The stand-in member (:data:`MEMBER`) running: its gRPC port, and the HTTP one
    the gateway's health checks call."""
    port, health = free_ports(2)
    config = folder / "member.cfg"
    config.write_text(MEMBER.format(port=port, health=health))
    with haproxy(config, port, folder / "member.log"):
        yield port, health


def rows_of(figures: Mapping[Cell, Sequence[float]]) -> list[dict[str, Any]]:
    """A row per checkout and path: the medians of each arm's rounds, tenancy's cost
    (tenant less none), the queue's (queued less tenant) and both ratios to none; beside
    the first checkout, each arm's ratio to it."""
    sources = list(dict.fromkeys(cell.source for cell in figures))
    med = {cell: median(values) for cell, values in figures.items()}
    rows = []
    for source in sources:
        for path in PATHS:
            us = {arm: med[Cell(source, arm, path)] for arm in ARMS}
            row: dict[str, Any] = {
                "source": source, "path": path,
                "rounds": len(figures[Cell(source, "none", path)]),
                **{f"{arm}_us": us[arm] for arm in ARMS},
                "tenancy_cost_us": us["tenant"] - us["none"],
                "queue_cost_us": us["queued"] - us["tenant"],
                "tenant_none_ratio": us["tenant"] / us["none"],
                "queued_none_ratio": us["queued"] / us["none"]}
            if source != sources[0]:
                for arm in ARMS:
                    row[f"{arm}_vs_{sources[0]}_ratio"] = us[arm] / med[Cell(sources[0], arm,
                                                                             path)]
            rows.append(row)
    return rows


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    """HAProxy's CPU per request by checkout and path, then each checkout against the
    first."""
    text = table(("checkout", "path", *(f"{arm}, us/request" for arm in ARMS),
                  "tenancy's cost, us", "the queue's, us", "tenant / none", "queued / none"),
                 ((r["source"], r["path"], *(f"{r[f'{arm}_us']:.1f}" for arm in ARMS),
                   f"{r['tenancy_cost_us']:+.1f}", f"{r['queue_cost_us']:+.1f}",
                   f"{r['tenant_none_ratio']:.2f}x", f"{r['queued_none_ratio']:.2f}x")
                  for r in rows))
    first = rows[0]["source"] if rows else ""
    later = [r for r in rows if r["source"] != first]
    if later:
        text += "\n\n" + table(
            ("checkout", "path", *(f"{arm} vs {first}" for arm in ARMS)),
            ((r["source"], r["path"], *(f"{r[f'{arm}_vs_{first}_ratio']:.2f}x" for arm in ARMS))
             for r in later))
    rounds = rows[0]["rounds"] if rows else 0
    return text + f"\n\nHAProxy's utime + stime per request answered, medians of {rounds} rounds."


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rate", type=int, default=8000,
                        help="requests a second, open loop (default 8000)")
    parser.add_argument("--source", action="append", type=parse_source, default=[],
                        help="NAME=DIR: also measure the checkout DIR (e.g. 'git worktree "
                             "add DIR REV') under NAME; repeatable")
    parser.add_argument("--out", type=Path, help="also write bench_rules.json/.md here")
    args = parser.parse_args(argv)
    sources = {**dict(args.source), "this": HERE}
    rows = run(args.rounds, args.seconds, args.rate, sources)
    publish(rows, markdown, lambda _rows, _out: [], args.out, "bench_rules", say)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
