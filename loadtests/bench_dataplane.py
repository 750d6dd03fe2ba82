"""Data plane benchmark: direct Triton vs the gateway with each data plane (HAProxy,
Python), driven by a C load generator (h2load), interleaved rounds in one run.

For the tiny ``y = 2x + 1`` model (per-request overhead dominates) and EfficientNet-Lite0
(600 KB requests), for gRPC ModelInfer and HTTP binary tensors, at 1 and 16 in flight:

- throughput ratio gateway / direct (median req/s over rounds);
- added latency: gateway p50 - direct p50 (per-request log of h2load, medians over rounds);
- gateway CPU per request: utime+stime+cutime+cstime of the gateway process and every
  descendant (HAProxy master and workers are its children, and a live child's CPU is not
  in its parent's cutime), after minus before, over the requests Triton served; split by
  process: ``haproxy`` (the data plane) and ``python`` (the control plane, which reads
  HAProxy's per-request telemetry lines).

By default three gateways: ``haproxy`` (default settings: gRPC connections decided per
member from its Triton version, so one request per connection to this machine's 2.51),
``haproxy-shared`` (``--grpc-upstream-reuse shared``, the production mode for Triton
2.57.0 and later) and ``python``.

h2load counts any HTTP 200 as a success, gRPC errors included (they travel as HTTP 200
with ``grpc-status`` in the trailers), so each run is checked against Triton's own
``/v2/models/NAME/stats`` success count: every h2load success must be an inference
Triton served, and no request may fail, or the row says it is unverified. (Triton
serving more than was sent is reported, not failed: the other gateways' warm-up
requests reach the same Triton.)

    python -m loadtests.bench_dataplane [--rounds 3] [--seconds 3] [--out DIR] \
        [--plane haproxy --plane python --plane 'plain='] [--source NAME=DIR] \
        [--model tiny] [--protocol grpc] [--in-flight 16]

``--plane NAME`` starts ``gateway serve --data-plane NAME``; ``NAME=ARGS`` passes ARGS
instead (none after ``=``: the gateway's default); ``replica`` (or ``NAME=replica``)
measures through a data-plane replica (``gateway agent``) over a control plane, as in
Kubernetes. ``--source NAME=DIR`` runs that
plane's gateway from another checkout (``git worktree add DIR REV``): before and after a
change, side by side in one run. A data plane whose gateway does not
start is skipped with a printed line; a run it fails counts as 0 req/s.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from converters.samples import SAMPLE_MODEL_NAME, build_sample_model, cat_input
from converters.tiny import TINY_MODEL_NAME, TINY_WIDTH, build_tiny_model
from infergate.processes import ROOT, AgentProcess, GatewayProcess, run_agent
from infergate.triton.local import TritonEndpoints
from loadtests.h2load import (
    H2loadSummary,
    Workload,
    h2load_command,
    run_h2load,
    status_counts,
    write_workload,
)
from loadtests.harness import (
    GatewayFailed,
    figure,
    finite_median,
    gateway,
    gateway_yaml,
    log_tail,
    num,
    parse_source,
    publish,
    reporter,
    settle,
    spread,
    table,
    triton,
    with_range,
)
from loadtests.proc_cpu import (
    cpu_us_per_request,
    process_tree,
    read_proc_stats,
    ticks_by_name,
)

IN_FLIGHT = (1, 16)
PROTOCOLS = ("grpc", "http")
# (throughput ratio at 16 in flight, added p50 ms at 1 in flight, CPU us per request)
GOALS: dict[str, tuple[float, float, float | None]] = {
    TINY_MODEL_NAME: (0.85, 0.25, 100.0),
    SAMPLE_MODEL_NAME: (0.98, 0.5, None),
}


say = reporter("bench_dataplane")


# -- Triton's count of what it served -------------------------------------------------

def success_count(stats: Mapping[str, Any]) -> int:
    """Successful inferences over every version in a ``/v2/models/NAME/stats`` answer."""
    return sum(int(m["inference_stats"]["success"]["count"]) for m in stats["model_stats"])


def served_by_triton(http_url: str, model: str) -> int:
    answer = httpx.get(f"http://{http_url}/v2/models/{model}/stats", timeout=10)
    answer.raise_for_status()
    return success_count(answer.json())


def settled_count(http_url: str, model: str, quiet_s: float, timeout_s: float = 20.0) -> int:
    """Triton's count once it has not moved for ``quiet_s``: requests a client gave up on
    at the end of a run still finish, and statistics land just after each answer."""
    count, _ = settle(lambda: served_by_triton(http_url, model), quiet_s, timeout_s, 0.05)
    return count


def served_check(h2: H2loadSummary, served: int, statuses: Mapping[int, int]) -> str:
    """'' when every request h2load counted as a success was one Triton served, else why
    not. (Triton serving more than was sent is not checked: the other gateways' warm-up
    requests reach the same Triton; :func:`extra_served` counts them.)"""
    problems = []
    if h2.failed or h2.errored or h2.timeout:
        problems.append(f"h2load: {h2.failed} failed, {h2.errored} errored, {h2.timeout} "
                        f"timeout; HTTP statuses {dict(statuses)}")
    if served < h2.succeeded:
        problems.append(f"Triton served {served} < {h2.succeeded} h2load successes")
    return "; ".join(problems)


def extra_served(h2: H2loadSummary, served: int) -> int:
    """Inferences Triton served beyond every request h2load started (someone else's)."""
    return max(0, served - h2.started)


# -- one measured run -----------------------------------------------------------------

class RunFailed(RuntimeError):
    """No request of one h2load run succeeded."""

    def __init__(self, message: str, command: Sequence[str]) -> None:
        super().__init__(message)
        self.command = " ".join(command)


@dataclass(frozen=True)
class Target:
    name: str  # "direct" or a data plane's name
    endpoints: Any  # TritonEndpoints or GatewayProcess: .grpc_url, .http_url
    pid: int | None = None  # the gateway process, whose tree's CPU is counted
    log: Path | None = None  # the gateway's log

    def alive(self) -> bool:
        return self.pid is None or Path(f"/proc/{self.pid}").exists()


@dataclass(frozen=True)
class Sample:
    req_per_s: float
    p50_ms: float  # of the requests that succeeded
    p99_ms: float
    requests: int  # served by Triton during the run
    cpu_us_per_request: float | None
    problem: str
    cpu_split_us: Mapping[str, float] = field(default_factory=dict)  # by process name
    extra_served: int = 0
    seconds: float = 0.0  # wall time of the h2load run

    @classmethod
    def failed(cls, problem: str) -> Sample:
        nan = float("nan")
        return cls(0.0, nan, nan, 0, None, problem)


def measure(target: Target, work: Workload, protocol: str, in_flight: int, seconds: float,
            triton_http: str, scratch: Path) -> Sample:
    cmd = h2load_command(work, protocol, target.endpoints, in_flight,
                         f"{round(seconds * 1000)}ms", scratch / "h2load.tsv")
    before = served_by_triton(triton_http, work.model)
    ticks0 = ticks_by_name(target.pid, read_proc_stats()) if target.pid else Counter()
    began = time.monotonic()
    done = run_h2load(cmd, seconds + 120)
    wall = time.monotonic() - began
    ticks1 = ticks_by_name(target.pid, read_proc_stats()) if target.pid else Counter()
    if done.cut_off or done.returncode != 0:
        raise RunFailed(("h2load cut off" if done.cut_off else
                         f"h2load exited {done.returncode}") + f": {done.gist()}", cmd)
    h2 = done.summary()
    log = done.log
    latencies = done.ok_us()
    if not latencies:
        raise RunFailed(f"no request succeeded: HTTP statuses {status_counts(log)} (-1: no "
                        f"answer); {done.gist()}", cmd)
    # a batch Triton is still computing can take as long as the slowest answer did
    served = settled_count(triton_http, work.model,
                           max(0.3, 2e-6 * max(us for _, us in log))) - before
    clock = os.sysconf("SC_CLK_TCK")
    split = {name: cpu_us_per_request(ticks1[name] - ticks0[name], served, clock)
             for name in sorted(ticks1)}
    return Sample(h2.req_per_s, statistics.median(latencies) / 1e3,
                  float(np.percentile(latencies, 99)) / 1e3, served,
                  sum(split.values()) if target.pid else None,
                  served_check(h2, served, status_counts(log)), split,
                  extra_served(h2, served), wall)


def attempt(target: Target, work: Workload, protocol: str, in_flight: int, seconds: float,
            triton_http: str, scratch: Path, failed_before: set[str]) -> Sample:
    """One run; a gateway's failed run becomes a failed sample (the first one with the
    end of that gateway's log printed). Direct Triton failing ends the benchmark."""
    try:
        return measure(target, work, protocol, in_flight, seconds, triton_http, scratch)
    except (RunFailed, ValueError) as err:
        if target.pid is None:
            raise
        if target.name not in failed_before:
            failed_before.add(target.name)
            command = f"\n    $ {err.command}" if isinstance(err, RunFailed) else ""
            say(f"data plane {target.name} failed on {work.model} {protocol} x{in_flight}: "
                f"{str(err)[:400]}{command}\n{log_tail(target.log)}")
        return Sample.failed(f"{work.model} {protocol} x{in_flight}: {str(err)[:200]}")


@dataclass(frozen=True)
class Cells:
    """Which (model, protocol, in flight) cells a run measures (default: all)."""

    models: tuple[str, ...] = (TINY_MODEL_NAME, SAMPLE_MODEL_NAME)
    protocols: tuple[str, ...] = PROTOCOLS
    in_flight: tuple[int, ...] = IN_FLIGHT


def warm_up(targets: Sequence[Target], works: Sequence[Workload], triton_http: str,
            scratch: Path, protocols: Sequence[str] = PROTOCOLS) -> None:
    failed: set[str] = set()
    for work in works:
        for protocol in protocols:
            for target in targets:
                attempt(target, work, protocol, 4, 0.5, triton_http, scratch, failed)


def idle_cpu_percent(targets: Sequence[Target], seconds: float = 2.0
                     ) -> dict[str, dict[str, float]]:
    """Each gateway's CPU while nobody sends it anything (probes, telemetry, timers), in
    % of one core, by process name: the floor under its CPU per request at low rates."""
    gateways = [t for t in targets if t.pid is not None]
    before = {t.name: ticks_by_name(t.pid, read_proc_stats()) for t in gateways if t.pid}
    time.sleep(seconds)
    stats, clock = read_proc_stats(), os.sysconf("SC_CLK_TCK")
    return {t.name: {name: 100.0 * (ticks - before[t.name][name]) / clock / seconds
                     for name, ticks in ticks_by_name(t.pid, stats).items()}
            for t in gateways if t.pid}


def above_floor(sample: Sample, idle_pct: Mapping[str, float]) -> dict[str, float]:
    """CPU per request by process beyond what the process burns idle over the same
    seconds (``idle_pct``): what the requests themselves cost it (e.g. the control
    plane's reading of HAProxy's telemetry lines, without its probe rounds)."""
    if not sample.requests:
        return {}
    return {name: us - idle_pct.get(name, 0.0) / 100 * sample.seconds * 1e6 / sample.requests
            for name, us in sample.cpu_split_us.items()}


def interleaved(targets: Sequence[Target], works: Sequence[Workload], rounds: int,
                seconds: float, triton_http: str, scratch: Path,
                cells: Cells = Cells()) -> dict[tuple[str, str, int, str], list[Sample]]:
    """Every cell (model, protocol, in flight) against every target once per round, the
    targets' order rotated each round so that none always runs first. A gateway whose
    process exited is dropped from the rest of the run (with a line saying so)."""
    samples: dict[tuple[str, str, int, str], list[Sample]] = {}
    failed: set[str] = set()
    dropped: set[str] = set()
    for r in range(rounds):
        order = [*targets[r % len(targets):], *targets[:r % len(targets)]]
        for work in works:
            for protocol in cells.protocols:
                for in_flight in cells.in_flight:
                    for target in (t for t in order if t.name not in dropped):
                        s = attempt(target, work, protocol, in_flight, seconds, triton_http,
                                    scratch, failed)
                        samples.setdefault((work.model, protocol, in_flight, target.name),
                                           []).append(s)
                        say(f"round {r + 1}/{rounds} {work.model} {protocol} x{in_flight} "
                            f"{target.name}: {s.req_per_s:.0f} req/s, p50 {s.p50_ms:.3f} ms"
                            + (f", {s.extra_served} more served by Triton than sent"
                               if s.extra_served else "")
                            + (f" UNVERIFIED: {s.problem}" if s.problem else ""))
                        if not target.alive():
                            dropped.add(target.name)
                            say(f"dropped data plane {target.name}: its gateway exited\n"
                                f"{log_tail(target.log)}")
    return samples


# -- figures --------------------------------------------------------------------------

def goal_verdicts(model: str, in_flight: int, ratio: float | None, added_ms: float | None,
                  cpu_us: float | None) -> dict[str, str]:
    """The issue's goals beside the figures they judge, where a goal applies."""
    ratio_goal, latency_goal, cpu_goal = GOALS.get(model, (None, None, None))
    verdicts = {}
    if ratio_goal is not None and in_flight == 16:
        verdicts["throughput_goal"] = judged(f">={ratio_goal:g}x", ratio,
                                             ratio is not None and ratio >= ratio_goal)
    if latency_goal is not None and in_flight == 1:
        verdicts["latency_goal"] = judged(f"<={latency_goal:g} ms", added_ms,
                                          added_ms is not None and added_ms <= latency_goal)
    if cpu_goal is not None:
        verdicts["cpu_goal"] = judged(f"<={cpu_goal:g} us", cpu_us,
                                      cpu_us is not None and cpu_us <= cpu_goal)
    return verdicts


def judged(goal: str, value: float | None, met: bool) -> str:
    return f"{goal} {'n/a' if value is None else 'met' if met else 'MISSED'}"


def summarise(samples: Mapping[tuple[str, str, int, str], Sequence[Sample]],
              planes: Sequence[str],
              idle_cpu_pct: Mapping[str, Mapping[str, float]] | None = None
              ) -> list[dict[str, Any]]:
    """One row per (model, protocol, in flight, data plane): medians over rounds."""
    rows = []
    for model, protocol, in_flight in dict.fromkeys(k[:3] for k in samples):
        direct = samples[(model, protocol, in_flight, "direct")]
        for plane in planes:
            gateway = samples.get((model, protocol, in_flight, plane))
            if gateway:
                idle = (idle_cpu_pct or {}).get(plane)
                row = cell_row(model, protocol, in_flight, plane, direct, gateway, idle)
                row["gateway_idle_cpu_pct"] = sum(idle.values()) if idle else None
                rows.append(row)
    return rows


def cell_row(model: str, protocol: str, in_flight: int, plane: str,
             direct: Sequence[Sample], gateway: Sequence[Sample],
             idle_pct: Mapping[str, float] | None = None) -> dict[str, Any]:
    # Ratios and differences pair each gateway run with the direct run of the same round
    # (seconds apart, so under the same load from the machine's other work). A run where
    # nothing succeeded served 0 req/s; its latency was not measured.
    pairs = list(zip(direct, gateway, strict=False))  # a dropped plane has fewer rounds
    ratios = [g.req_per_s / d.req_per_s for d, g in pairs if d.req_per_s]
    added_each = [g.p50_ms - d.p50_ms for d, g in pairs]
    ratio = statistics.median(ratios) if ratios else None
    added = finite_median(added_each)
    cpu = finite_median(s.cpu_us_per_request for s in gateway)
    names = sorted({n for s in gateway for n in s.cpu_split_us})
    split = {n: finite_median(s.cpu_split_us.get(n) for s in gateway) for n in names}
    beyond = [above_floor(s, idle_pct) for s in gateway] if idle_pct is not None else []
    split_above = {n: finite_median(b.get(n) for b in beyond) for n in names} if beyond else {}
    problems = ([f"direct: {s.problem}" for s in direct if s.problem]
                + [f"{plane}: {s.problem}" for s in gateway if s.problem])
    return {
        "model": model, "protocol": protocol, "in_flight": in_flight, "data_plane": plane,
        "direct_rps": statistics.median(s.req_per_s for s in direct),
        "gateway_rps": statistics.median(s.req_per_s for s in gateway),
        "throughput_ratio": ratio, "throughput_ratio_range": spread(ratios),
        "direct_p50_ms": finite_median(s.p50_ms for s in direct),
        "gateway_p50_ms": finite_median(s.p50_ms for s in gateway),
        "added_p50_ms": added, "added_p50_ms_range": spread(added_each),
        "direct_p99_ms": finite_median(s.p99_ms for s in direct),
        "gateway_p99_ms": finite_median(s.p99_ms for s in gateway),
        "direct_rps_each": [s.req_per_s for s in direct],
        "gateway_rps_each": [s.req_per_s for s in gateway],
        "gateway_cpu_us_per_request": cpu, "gateway_cpu_split_us": split,
        "gateway_cpu_split_above_idle_us": split_above,
        "gateway_requests": sum(s.requests for s in gateway),
        "triton_extra_served": sum(s.extra_served for s in (*direct, *gateway)),
        "rounds": len(gateway), "verified": not problems,
        **({"problems": problems} if problems else {}),
        **goal_verdicts(model, in_flight, ratio, added, cpu),
    }


def cpu_cell(row: Mapping[str, Any]) -> str:
    above = row.get("gateway_cpu_split_above_idle_us") or {}
    split = ", ".join(f"{name} {num(us, '.0f')}"
                      + (f" [{num(above[name], '.0f')}]" if name in above else "")
                      for name, us in row["gateway_cpu_split_us"].items())
    text = num(row["gateway_cpu_us_per_request"], ".0f")
    return f"{text} ({split}) {row.get('cpu_goal', '')}" if split else text


def served_cell(r: Mapping[str, Any]) -> str:
    problems = r.get("problems", [])
    checked = "yes" if r["verified"] else "NO: " + problems[0][:160] + (
        f" (+{len(problems) - 1} more in the JSON)" if len(problems) > 1 else "")
    if r["triton_extra_served"]:
        checked += f" (Triton served {r['triton_extra_served']} more than sent)"
    return str(checked)


def markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    if not rows:
        return "(no gateway data plane started: nothing to compare)"
    lines = [table(
        ("model", "protocol", "in flight", "data plane", "direct req/s", "gateway req/s",
         "gateway/direct", "direct p50 ms", "gateway p50 ms", "added p50 ms",
         "gateway CPU us/req (by process)", "served checked"),
        ((r["model"], r["protocol"], r["in_flight"], r["data_plane"],
          num(r["direct_rps"], ".0f"), num(r["gateway_rps"], ".0f"),
          f"{with_range(r, 'throughput_ratio', '.2f', 'x')} {r.get('throughput_goal', '')}",
          num(r["direct_p50_ms"], ".3f"), num(r["gateway_p50_ms"], ".3f"),
          f"{with_range(r, 'added_p50_ms', '+.3f')} {r.get('latency_goal', '')}",
          cpu_cell(r), served_cell(r)) for r in rows))]
    lines.append("\ngRPC at 16 in flight: 4 HTTP/2 connections x 4 streams; HTTP: one HTTP/1.1 "
                 "connection per request in flight. p50: h2load's per-request log, successes "
                 "only; medians over rounds. Ratio and added p50: median over rounds of each "
                 "gateway run against the direct run of the same round (lowest..highest). "
                 "CPU: the gateway process and all its descendants (HAProxy included), per "
                 "request Triton served, by process; [in brackets] what remains once the "
                 "process's idle burn (probes, timers) over the run's seconds is taken "
                 "out. 'served checked': no request "
                 "failed and every h2load success was an inference Triton counted (h2load "
                 "takes any HTTP 200, a gRPC error included, as a success).")
    idle = dict.fromkeys((r["data_plane"], r.get("gateway_idle_cpu_pct")) for r in rows)
    if any(pct is not None for _, pct in idle):
        lines.append("Idle CPU of each gateway, % of one core (the floor under CPU per "
                     "request at low rates): " + ", ".join(f"{plane} {num(pct, '.1f')}"
                                                          for plane, pct in idle) + ".")
    return "\n".join(lines)


def plot(rows: Sequence[Mapping[str, Any]], out: Path) -> list[Path]:
    if not rows:
        return []
    planes = list(dict.fromkeys(str(r["data_plane"]) for r in rows))
    groups = list(dict.fromkeys((str(r["model"]), str(r["protocol"])) for r in rows))
    positions = np.arange(len(groups))
    width = 0.8 / len(planes)
    path = out / "bench_dataplane.png"
    with figure(path, 1, 2, figsize=(11, 4)) as (fig, (ax1, ax2)):
        panels = ((ax1, 16, "throughput_ratio", 0, "gateway / direct throughput, 16 in flight"),
                  (ax2, 1, "added_p50_ms", 1, "added p50 latency (ms), 1 in flight"))
        for ax, in_flight, key, goal_index, title in panels:
            for i, plane in enumerate(planes):
                by_group = {(r["model"], r["protocol"]): np.nan if r[key] is None
                            else float(r[key]) for r in rows
                            if r["data_plane"] == plane and r["in_flight"] == in_flight}
                ax.bar(positions + (i - (len(planes) - 1) / 2) * width,
                       [by_group.get(g, np.nan) for g in groups], width, label=plane)
            for x, (model, _) in zip(positions, groups, strict=True):
                goal = GOALS.get(model, (None, None, None))[goal_index]
                if goal is not None:
                    ax.hlines(goal, x - 0.45, x + 0.45, colors="k", linestyles="dashed")
            ax.set_xticks(positions, [f"{m.replace('efficientnet_', 'effnet-')}\n{p}"
                                      for m, p in groups])
            ax.set_title(title)
            ax.legend()
        fig.suptitle("Gateway data planes vs direct Triton (h2load; dashed: the goals)")
    return [path]


# -- the stack and the run ------------------------------------------------------------

Plane = tuple[str, tuple[str, ...]]


# plane "replica": a data-plane replica (``gateway agent``: HAProxy and the replica's own
# forwarder) over a control plane (``gateway serve --data-plane python``), measured through
# the replica, as in Kubernetes
REPLICA_ARGS = ("replica",)  # (a marker, never a gateway's arguments)
CONTROL_ARGS = ("--data-plane", "python")  # the control plane a replica follows


def parse_plane(spec: str) -> Plane:
    """'haproxy' -> --data-plane haproxy; 'replica' -> a replica over a control plane
    (:data:`REPLICA_ARGS`); 'name=ARGS' -> ARGS (shell words; may be empty)."""
    if spec.strip() == "replica" or spec.partition("=")[2].strip() == "replica":
        return spec.partition("=")[0].strip(), REPLICA_ARGS
    name, sep, args = spec.partition("=")
    if not name.strip():
        raise ValueError(f"a data plane needs a name: {spec!r}")
    return name.strip(), tuple(shlex.split(args)) if sep else ("--data-plane", name.strip())


# both gRPC connection modes of the HAProxy data plane (the default decides per member
# from its Triton version: one request per connection before 2.57.0), and Python
SHARED_PLANE = "haproxy-shared=--data-plane haproxy --grpc-upstream-reuse shared"


def default_planes(serve_help: str) -> list[Plane]:
    if "--grpc-upstream-reuse" in serve_help and "per-request" in serve_help:
        return [parse_plane("haproxy"), parse_plane(SHARED_PLANE), parse_plane("python")]
    if "--data-plane" in serve_help:
        return [parse_plane("haproxy"), parse_plane("python")]
    say("this gateway has no --data-plane option yet: measuring its only (Python) "
        "data plane, started without the flag")
    return [("python", ())]


def serve_help() -> str:
    done = subprocess.run([sys.executable, "-m", "gateway", "serve", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "COLUMNS": "200"})
    return done.stdout + done.stderr


def describe_tree(plane: str, pid: int) -> None:
    """Say whose CPU is counted: a process outside the gateway's tree would be missed."""
    members = process_tree(pid, read_proc_stats())
    say(f"data plane {plane}: CPU counted over {', '.join(f'{m.name}({m.pid})' for m in members)}")
    if plane == "haproxy" and not any(m.name.startswith("haproxy") for m in members):
        say("WARNING: no haproxy process below this gateway: its CPU would not be counted")


@contextlib.contextmanager
def stack(workdir: Path, planes: Sequence[Plane], sources: Mapping[str, Path] | None = None
          ) -> Iterator[tuple[TritonEndpoints, list[Target]]]:
    """A local Triton with both models, and one gateway per data plane in front of it."""
    repo = workdir / "model_repo"
    build_sample_model(repo)
    build_tiny_model(repo)
    with triton(repo, workdir, (SAMPLE_MODEL_NAME, TINY_MODEL_NAME)) as ep, \
            contextlib.ExitStack() as gateways:
        pools = gateway_yaml(workdir / "pools.yaml", {"local": [ep]})
        targets = [Target("direct", ep, None)]
        for name, args in planes:
            source = (sources or {}).get(name)
            try:
                replica = args == REPLICA_ARGS
                gw = gateways.enter_context(gateway(
                    pools, workdir / f"gateway-{name}", *(CONTROL_ARGS if replica else args),
                    source=source))
                front: GatewayProcess | AgentProcess = gw
                if replica:  # measured through a replica of it: its tree's CPU is counted
                    front = gateways.enter_context(run_agent(gw, workdir / f"agent-{name}",
                                                             source=source))
            except (GatewayFailed, RuntimeError) as err:
                say(f"skipped data plane {name}: the gateway with {list(args)} did not start "
                    f"({err})")
                continue
            targets.append(Target(name, front, front.proc.pid, front.log))
            describe_tree(name, front.proc.pid)
        yield ep, targets


def run(rounds: int = 3, seconds: float = 3.0, planes: Sequence[Plane] | None = None,
        cells: Cells = Cells(), sources: Mapping[str, Path] | None = None
        ) -> list[dict[str, Any]]:
    if shutil.which("h2load") is None:
        raise RuntimeError("h2load not found: install Debian's nghttp2-client (make system-deps)")
    chosen = list(planes) if planes is not None else default_planes(serve_help())
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp, \
            stack(Path(tmp), chosen, sources) as (triton, targets):
        scratch = Path(tmp)
        works = [work for work in (
            write_workload(scratch, TINY_MODEL_NAME, np.ones((1, TINY_WIDTH), np.float32),
                           "x", "y"),
            write_workload(scratch, SAMPLE_MODEL_NAME, cat_input(), "input", "logits"),
        ) if work.model in cells.models]
        if len(targets) == 1:
            say("no gateway started: nothing to compare")
            return []
        warm_up(targets, works, triton.http_url, scratch, cells.protocols)
        idle = idle_cpu_percent(targets)
        say("idle CPU, % of one core: " + ", ".join(
            f"{k} {sum(v.values()):.1f} ({', '.join(f'{n} {pct:.1f}' for n, pct in v.items())})"
            for k, v in idle.items()))
        samples = interleaved(targets, works, rounds, seconds, triton.http_url, scratch,
                              cells)
    say(f"measured in {time.monotonic() - started:.0f} s")
    return summarise(samples, [t.name for t in targets[1:]], idle)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--plane", action="append", type=parse_plane, default=None,
                        help="NAME (runs 'gateway serve --data-plane NAME') or NAME=ARGS "
                             "(extra gateway arguments, may be empty); repeatable. Default: "
                             "haproxy and python, or the plain gateway if it has no "
                             "--data-plane option")
    parser.add_argument("--source", action="append", type=parse_source, default=[],
                        help="NAME=DIR: the data plane NAME runs the gateway of the checkout "
                             "DIR (e.g. 'git worktree add DIR REV'), for before and after "
                             "in one run; repeatable")
    parser.add_argument("--out", type=Path, default=None,
                        help="also write bench_dataplane.json/.md/.png into this folder")
    parser.add_argument("--model", action="append", choices=Cells().models,
                        help="only this model (repeatable; default: both)")
    parser.add_argument("--protocol", action="append", choices=PROTOCOLS,
                        help="only this protocol (repeatable; default: both)")
    parser.add_argument("--in-flight", action="append", type=int,
                        help=f"only this many in flight (repeatable; default: {IN_FLIGHT})")
    args = parser.parse_args()
    cells = Cells(tuple(args.model or Cells().models), tuple(args.protocol or PROTOCOLS),
                  tuple(args.in_flight or IN_FLIGHT))
    rows = run(args.rounds, args.seconds, args.plane, cells, dict(args.source))
    publish(rows, markdown, plot, args.out, "bench_dataplane", say)


if __name__ == "__main__":
    main()
