"""Goodput under open-loop overload: answers delivered within their deadline per second,
with deadline shedding on vs off (docs/request-policy.md: "Deadlines: hopeless work is shed").

One local Triton, one gateway (``--data-plane haproxy`` unless told otherwise) over one
pool of one member. For the model (EfficientNet-Lite0; ``--model tiny``: the tiny model
with a 1200 x 1200 matrix product per request, ``max_batch_size`` 1, a ~20 ms
sequential stand-in) and each protocol (HTTP binary tensors; gRPC ``ModelInfer``):

1. **Alone p50**: closed loop, 1 in flight, no deadline. The deadline *D* is 5x that p50
   and at least 50 ms: an SLO a client would set, a few service times of slack.
2. **Capacity**: closed loop at twice the pool's ``capacity_per_member`` in flight (at
   least 4: the member never idles), successes per second.
3. **1x, 2x, 4x capacity offered, open loop**, two arms back to back on the same gateway:
   **shedding on** (every request says *D*: ``X-Request-Timeout-Ms`` / ``grpc-timeout``)
   and **shedding off** (the same requests without it: no deadline to shed by; the
   client would have given up at *D*). The arms swap order every run, so that drift
   favours neither; figures are medians over rounds.

Why open loop: a closed-loop client sends its next request when the last one answers,
so it slows down with the server and never offers more than the server serves; users
who do not know about each other keep arriving at their own rate. Every request here
is a user of its own: h2load opens one connection per request (``-c`` = ``-n``) at a
fixed rate (``-r`` connections every ``--rate-period`` ms), whatever the answers do.
Paced connections carrying many requests each (``--rps``) would not do: an HTTP/1.1
connection carries one request at a time, so h2load holds a connection's next request
until its answer arrived (the wait behind a slow answer never timed), h2load 1.52 with
``-D`` and ``--rps`` fires every connection at once and never ends, and when the
gateway closes a connection after refusing a request whose body it did not read (it
answers at once, ``connection: close``), h2load fails every request that connection had
left. A run lasts until every request is answered: the arm without shedding works off
its backlog at the member's pace after its schedule ended. Clients that gave up at *D*
would change none of its figures: only answers within *D* count, and Triton executes
an abandoned request all the same (counted as wasted).

Figures per load and arm:

- **goodput**: answers with HTTP status 200 within *D* (h2load's per-request
  ``--log-file``) over the schedule's seconds; **goodput_ratio**: over the 1x
  shedding-on goodput of the same round (headline: goal >= 0.9 at 4x on
  EfficientNet-Lite0);
- **shed/s**: the gateway's ``infergate_rejected_requests_total{reason="deadline"}``;
  refused/s: its other refusals (``outcome="rejected"``: the model's bound, below; the
  arm without shedding meets it at 2x and 4x); **no answer/s**: requests h2load logged
  no answer for (the connection closed before the answer could be read);
- **p50/p99 of the successes** (late ones included);
- **wasted**: Triton's executed requests (``nv_inference_request_success`` on its
  metrics page, after the run settled) not answered within *D*, over those executed
  (goal < 1 % with shedding on): work done for an answer nobody could use.

gRPC: h2load logs HTTP 200 for every gRPC answer, errors included (trailers-only), so
the successes are the gateway's ``infergate_requests_total{outcome="success"}`` over
the run, and the answers within *D* are those logged within *D* less the shed requests
(answered at once), at most the successes: an upper bound (exact when nothing failed
but those shed), marked ``<=``, and the wasted share it gives a lower bound (``>=``).
p50/p99 are over the slowest HTTP-200 answers, as many as succeeded: upper bounds.

The model's bound (the requests the gateway holds at once: ``capacity_per_member`` +
the model policy's ``max_queue``) is about 2 s of work at the capacity measured on this
machine (tiny: 1 + 120, EfficientNet-Lite0: 4 + 300), 20 times *D*: the arm without
deadlines is refused (refused/s) only beyond a queue no client would wait out, and the
arm with them is shed by the deadline rule alone. Without a bound, the backlog of the
arm without shedding would grow for the whole schedule and take Triton as long again
to work off (far longer once its batcher degrades, below). (With the default
``queue_factor`` 2, the bound holds the wait of a sequential member to about 3 service
times, which by itself meets a 5x-p50 deadline.) The models have no queue policy (the
converter writes one only when asked, docs/request-policy.md "Deadlines"), so Triton drops
nothing, and
the HAProxy plane cannot pass a deadline on to Triton: a request admitted with shedding
on that misses *D* ends as HAProxy's 504 while Triton still executes it, which is what
"wasted" counts.

A model whose queue policy has a non-zero timeout loses throughput once many requests
are pending, its instance idle, and stays slow until it is reloaded
(triton-inference-server/server#8870): the arm without shedding builds such queues, so
capacity is measured again after the runs and printed beside the first figure, and a
table taken on a model that came out slower says so.

About 4 minutes on 2 cores with the defaults (EfficientNet-Lite0, both protocols, 3
rounds of 2 s schedules); ``--quick`` (tiny model, HTTP, one round) about a minute.

    python -m loadtests.bench_overload [--quick] [--model tiny|sample]
        [--protocol http|grpc|both] [--seconds S] [--rounds N]
        [--data-plane haproxy|python] [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from converters.samples import SAMPLE_MODEL_NAME, cat_input
from converters.tiny import TINY_WIDTH, build_tiny_model
from infergate.processes import GatewayProcess
from infergate.triton.local import TritonEndpoints
from loadtests import harness
from loadtests.h2load import Workload, h2load_command, run_h2load, write_workload
from loadtests.harness import (
    copy_model,
    figure,
    finite_median,
    gateway_yaml,
    median,
    num,
    page,
    percentile,
    publish,
    reporter,
    sample_model_dir,
    settle,
    table,
    total,
    totals,
    with_range,
)

POOL = "p"
PROTOCOLS = ("http", "grpc")
LOADS = (1, 2, 4)  # offered, in multiples of the measured capacity
ON, OFF = "on", "off"  # deadline shedding: every request carries D / none does
DEADLINE_X_P50, DEADLINE_FLOOR_MS = 5, 50
RATE_TOLERANCE = 0.02  # the paced rate may differ this much from the one asked for
RUN_LIMIT_SLACK_S = 60.0  # h2load is interrupted this long after its backlog should end
SETTLE_QUIET_S = 0.6  # a little more than one probe round (run_gateway: 0.5 s)
GOODPUT_GOAL_RATIO, WASTE_GOAL = 0.9, 0.01
TINY_WORK, TINY_WORK_NAME = 1200, "tiny_work"
EXACT, UPPER_BOUND = "exact", "upper bound"


@dataclass(frozen=True)
class ModelSetup:
    """A model the bench serves: Triton's name for it, the pool's
    ``capacity_per_member`` (what the member executes at once, as the deadline rule
    assumes) and the model policy's ``max_queue`` (docstring)."""

    name: str
    capacity_per_member: int
    max_queue: int
    note: str

    @property
    def saturating_in_flight(self) -> int:
        return max(4, 2 * self.capacity_per_member)


MODELS = {
    "sample": ModelSetup(SAMPLE_MODEL_NAME, 4, 300,
                         "EfficientNet-Lite0, dynamic batching up to 32"),
    "tiny": ModelSetup(TINY_WORK_NAME, 1, 120, f"tiny model, {TINY_WORK}x{TINY_WORK} matrix "
                       "product per request, max_batch_size 1"),
}


say = reporter("bench_overload")


# -- pure arithmetic ------------------------------------------------------------------

def deadline_ms(alone_p50_ms: float) -> int:
    """The deadline every request of the shedding-on arm carries."""
    return max(DEADLINE_FLOOR_MS, math.ceil(DEADLINE_X_P50 * alone_p50_ms))


def answered_within(log: Sequence[tuple[int, float]], deadline: int) -> int:
    """HTTP-200 answers of an h2load log that arrived within ``deadline`` ms."""
    return sum(1 for status, us in log if status == 200 and us <= deadline * 1e3)


def grpc_within_bound(latencies_us: Sequence[float], deadline: int, successes: int,
                      shed: int, unanswered: int = 0) -> int:
    """gRPC answers within ``deadline`` ms that succeeded, at most: those h2load logged
    within it (every gRPC answer is HTTP 200) less the shed ones it logged (answered at
    once, so within it; a shed request whose answer h2load never read, ``unanswered``,
    is not among them), never more than the successes the gateway counted."""
    within = sum(1 for us in latencies_us if us <= deadline * 1e3)
    return max(0, min(successes, within - max(0, shed - unanswered)))


def slowest(latencies_us: Sequence[float], count: int) -> list[float]:
    """The ``count`` slowest latencies: the successes' at worst, when the others
    cannot be told apart from them."""
    ordered = sorted(latencies_us)
    return ordered[len(ordered) - max(0, min(count, len(ordered))):]


def wasted_share(executed: int, in_time: int) -> float | None:
    """Triton's executions that answered nobody in time, over its executions (None when
    it executed nothing)."""
    if executed <= 0:
        return None
    return min(1.0, max(0, executed - in_time) / executed)


@dataclass(frozen=True)
class Schedule:
    """One open-loop run: ``requests`` requests, each on a connection of its own,
    ``burst`` of them every ``period_ms``."""

    requests: int
    burst: int
    period_ms: int

    @property
    def offered_per_s(self) -> float:
        return self.burst * 1e3 / self.period_ms

    @property
    def seconds(self) -> float:
        return self.requests / self.offered_per_s


def schedule(offered_per_s: float, seconds: float) -> Schedule:
    """The smallest bursts, a whole number of milliseconds apart, that offer
    ``offered_per_s`` within :data:`RATE_TOLERANCE` (h2load's ``--rate-period`` takes
    whole milliseconds), for about ``seconds``."""
    if offered_per_s <= 0 or seconds <= 0:
        raise ValueError(f"nothing to offer: {offered_per_s} req/s for {seconds} s")
    burst = 1
    while True:
        period = max(1, round(burst * 1e3 / offered_per_s))
        if abs(burst * 1e3 / period / offered_per_s - 1) <= RATE_TOLERANCE:
            break
        burst += 1
    rate = burst * 1e3 / period
    return Schedule(max(burst, round(rate * seconds)), burst, period)


def open_loop_command(work: Workload, protocol: str, target: Any, plan: Schedule,
                      log_file: Path, headers: Sequence[str]) -> list[str]:
    """h2load's command for ``protocol`` (:func:`h2load_command`) with one connection
    per request, opened ``plan.burst`` every ``plan.period_ms``, instead of a duration."""
    cmd = h2load_command(work, protocol, target, 1, "1s", log_file, headers)
    cmd[cmd.index("-c") + 1] = str(plan.requests)
    at = cmd.index("-D")
    cmd[at:at + 2] = ["-n", str(plan.requests), "-r", str(plan.burst),
                      "--rate-period", f"{plan.period_ms}ms"]
    return cmd


def deadline_headers(protocol: str, deadline: int | None) -> tuple[str, ...]:
    if deadline is None:
        return ()
    return (f"grpc-timeout: {deadline}m",) if protocol == "grpc" else (
        f"X-Request-Timeout-Ms: {deadline}",)


# -- what Triton and the gateway counted ----------------------------------------------

@dataclass(frozen=True)
class Counts:
    """Triton's and the gateway's counters for the model, and their in-flight gauges."""

    executed: float = 0.0  # Triton: nv_inference_request_success
    failed: float = 0.0  # Triton: nv_inference_request_failure
    pending: float = 0.0  # Triton: nv_inference_pending_request_count (a gauge)
    outcomes: Mapping[tuple[str, str], float] = field(default_factory=dict)  # (proto, outcome)
    shed: float = 0.0  # gateway: infergate_rejected_requests_total{reason="deadline"}
    in_flight: float = 0.0  # gateway: infergate_in_flight_requests (a gauge)

    def minus(self, before: Counts) -> Counts:
        keys = set(self.outcomes) | set(before.outcomes)
        return Counts(self.executed - before.executed, self.failed - before.failed,
                      self.pending,
                      {k: self.outcomes.get(k, 0.0) - before.outcomes.get(k, 0.0) for k in keys},
                      self.shed - before.shed, self.in_flight)

    def counters(self) -> tuple[object, ...]:
        """The counters (not the gauges), to tell whether any moved."""
        return self.executed, self.failed, self.shed, tuple(sorted(self.outcomes.items()))

    def outcome(self, protocol: str, outcome: str) -> int:
        return round(self.outcomes.get((protocol, outcome), 0.0))


def parse_counts(triton_text: str, gateway_text: str, model: str) -> Counts:
    """The model's counters in Triton's and the gateway's Prometheus pages."""
    def triton(name: str) -> float:
        return total(triton_text, name, model=model)

    outcomes = {(protocol, outcome): n for protocol in PROTOCOLS
                for outcome, n in totals(gateway_text, "infergate_requests_total", "outcome",
                                         model=model, protocol=protocol,
                                         traffic="user").items()}
    return Counts(triton("nv_inference_request_success"),
                  triton("nv_inference_request_failure"),
                  triton("nv_inference_pending_request_count"), outcomes,
                  total(gateway_text, "infergate_rejected_requests_total", model=model,
                        reason="deadline"),
                  total(gateway_text, "infergate_in_flight_requests", model=model))


# -- one run and its figures ----------------------------------------------------------

@dataclass(frozen=True)
class ArmRun:
    """One open-loop run of one arm."""

    protocol: str
    load_x: int
    arm: str
    round: int
    deadline_ms: int
    plan: Schedule
    log: tuple[tuple[int, float], ...]  # (HTTP status, us) per answer h2load logged
    counted: Counts  # after minus before, once settled
    cut_off: bool = False  # interrupted: it had not ended long after it should have
    problem: str = ""


@dataclass(frozen=True)
class ArmFigures:
    goodput_per_s: float
    in_time: int
    successes: int
    exact: bool
    shed_per_s: float
    refused_per_s: float
    unanswered_per_s: float
    p50_ms: float
    p99_ms: float
    wasted_share: float | None
    executed_per_s: float


def figures(run: ArmRun) -> ArmFigures:
    """What one run says (the module docstring says from where)."""
    seconds = run.plan.seconds
    ok = [us for status, us in run.log if status == 200]
    shed = round(run.counted.shed)
    if run.protocol == "grpc":
        successes = run.counted.outcome("grpc", "success")
        unanswered = sum(1 for status, _ in run.log if status != 200)
        in_time = grpc_within_bound(ok, run.deadline_ms, successes, shed, unanswered)
        latencies = slowest(ok, successes)
        exact = len(ok) == successes
    else:
        successes, latencies, exact = len(ok), ok, True
        in_time = answered_within(run.log, run.deadline_ms)
    executed = round(run.counted.executed)
    return ArmFigures(
        in_time / seconds, in_time, successes, exact, shed / seconds,
        run.counted.outcome(run.protocol, "rejected") / seconds,
        (run.plan.requests - sum(1 for status, _ in run.log if status > 0)) / seconds,
        percentile(latencies, 50) / 1e3 if latencies else math.nan,
        percentile(latencies, 99) / 1e3 if latencies else math.nan,
        wasted_share(executed, in_time), executed / seconds)


# -- the stack ------------------------------------------------------------------------

@dataclass
class Stack:
    gateway: GatewayProcess
    member: TritonEndpoints
    work: Workload
    scratch: Path
    quiet: Counts | None = None  # the last reading that settled (:meth:`settled`)

    def counts(self) -> Counts:
        return parse_counts(page(self.member.metrics_url),
                            page(f"http://{self.gateway.http_url}/metrics"), self.work.model)

    def settled(self) -> Counts:
        """:func:`settled`, after the last reading that settled: one run's counts after
        and the next one's before are read back to back."""
        counts, still = settled(self.counts, last=self.quiet)
        self.quiet = counts if still else None
        return counts


def _busy(counts: Counts) -> bool:
    return bool(counts.pending or counts.in_flight)


def settled(read: Callable[[], Counts], quiet_s: float = SETTLE_QUIET_S,
            timeout_s: float = 60.0, last: Counts | None = None) -> tuple[Counts, bool]:
    """The counts once nothing is in flight or queued and no counter moved for
    ``quiet_s``: requests a client gave up on still finish in Triton, and the HAProxy
    plane's counts arrive through its telemetry lines just after each answer; and
    whether they settled. ``last``: a reading that settled just before (the previous
    run's after): when the counters still read as in ``last`` and nothing is in flight,
    none moved since (counters only grow), so the quiet ``last`` waited for holds until
    now, and there is no second wait."""
    if last is not None:
        counts = read()
        if not _busy(counts) and counts.counters() == last.counters():
            return counts, True
    counts, still = settle(read, quiet_s, timeout_s, key=Counts.counters, busy=_busy)
    if not still:
        say(f"counts did not settle within {timeout_s:g} s (Triton pending "
            f"{counts.pending:g}, gateway in flight {counts.in_flight:g}): the next run may "
            "start behind a queue")
    return counts, still


def tiny_work_model(repo: Path) -> None:
    """The tiny model with a matrix product per request, one request per execution: a
    sequential member whose capacity is exactly one at a time."""
    build_tiny_model(repo, TINY_WORK_NAME, work=TINY_WORK)
    path = repo / TINY_WORK_NAME / "config.pbtxt"
    config = text_format.Parse(path.read_text(), mc.ModelConfig())
    config.max_batch_size = 1
    path.write_text(text_format.MessageToString(config))


def prepare(repo: Path, scratch: Path, setup: ModelSetup) -> Workload:
    if setup.name == TINY_WORK_NAME:
        tiny_work_model(repo)
        return write_workload(scratch, setup.name, np.ones((1, TINY_WIDTH), np.float32),
                              "x", "y")
    copy_model(sample_model_dir(), repo / setup.name)
    return write_workload(scratch, setup.name, cat_input(), "input", "logits")


def write_config(path: Path, member: TritonEndpoints, setup: ModelSetup) -> Path:
    return gateway_yaml(path, {POOL: [member]}, capacity_per_member=setup.capacity_per_member,
                        models={setup.name: {"max_queue": setup.max_queue}})


@contextlib.contextmanager
def stack(scratch: Path, setup: ModelSetup, data_plane: str) -> Iterator[Stack]:
    repo = scratch / "model_repo"
    repo.mkdir()
    work = prepare(repo, scratch, setup)
    with harness.stack(scratch, repo, (setup.name,), data_plane=data_plane,
                       config=lambda path, member: write_config(path, member, setup)) as st:
        yield Stack(st.gateway, st.member, work, scratch)


# -- measuring ------------------------------------------------------------------------

def closed_loop(stack: Stack, protocol: str, in_flight: int, seconds: float
                ) -> tuple[float, float]:
    """(successes per second, p50 ms of the HTTP-200 answers), no deadline."""
    before = stack.settled()
    cmd = h2load_command(stack.work, protocol, stack.gateway, in_flight,
                         f"{round(seconds * 1000)}ms", stack.scratch / "closed.tsv")
    done = run_h2load(cmd, seconds + 120)
    delta = stack.settled().minus(before)
    ok = [us for status, us in done.log if status == 200]
    if not ok:
        raise RuntimeError(f"{stack.work.model} {protocol} x{in_flight}: no answer: "
                           f"{done.gist()}")
    successes = delta.outcome(protocol, "success") if protocol == "grpc" else len(ok)
    return successes / done.summary().seconds, percentile(ok, 50) / 1e3


def open_loop(stack: Stack, protocol: str, load_x: int, arm: str, round_: int,
              plan: Schedule, deadline: int) -> ArmRun:
    before = stack.settled()
    cmd = open_loop_command(stack.work, protocol, stack.gateway, plan,
                            stack.scratch / "open.tsv",
                            deadline_headers(protocol, deadline if arm == ON else None))
    # the arm without shedding works off up to (x - 1) x capacity x seconds afterwards
    limit = plan.seconds * (1 + load_x) + RUN_LIMIT_SLACK_S
    done = run_h2load(cmd, limit)
    delta = stack.settled().minus(before)
    problem = f"h2load interrupted after {limit:.0f} s" if done.cut_off else ""
    if not done.cut_off:
        try:
            done.summary()
        except ValueError:
            problem = f"h2load printed no summary: {done.gist()}"
    return ArmRun(protocol, load_x, arm, round_, deadline, plan, done.log, delta,
                  done.cut_off, problem)


@dataclass(frozen=True)
class Baseline:
    """Per protocol, measured before the open-loop runs."""

    alone_p50_ms: float
    capacity_per_s: float
    capacity_after_per_s: float | None = None  # measured again once the runs are over

    @property
    def deadline_ms(self) -> int:
        return deadline_ms(self.alone_p50_ms)


def baseline(stack: Stack, protocol: str, setup: ModelSetup, seconds: float,
             runs: int = 2) -> Baseline:
    closed_loop(stack, protocol, 2, 1.0)  # warm-up; the gateway measures the service time
    # the better of ``runs`` runs each: a stall of the shared machine only ever slows one
    # down
    alone_p50 = min(closed_loop(stack, protocol, 1, seconds)[1] for _ in range(runs))
    capacity = max(closed_loop(stack, protocol, setup.saturating_in_flight, seconds)[0]
                   for _ in range(runs))
    return Baseline(alone_p50, capacity)


def measure(stack: Stack, protocol: str, base: Baseline, rounds: int, seconds: float,
            loads: Sequence[int] = LOADS) -> list[ArmRun]:
    runs = []
    plans = {x: schedule(x * base.capacity_per_s, seconds) for x in loads}
    for r in range(rounds):
        for i, x in enumerate(loads):
            for arm in ((ON, OFF) if (r + i) % 2 == 0 else (OFF, ON)):
                run = open_loop(stack, protocol, x, arm, r, plans[x], base.deadline_ms)
                runs.append(run)
                f = figures(run)
                say(f"round {r + 1}/{rounds} {protocol} {x}x shedding {arm}: offered "
                    f"{plans[x].offered_per_s:.0f}/s, goodput {f.goodput_per_s:.1f}/s, "
                    f"shed {f.shed_per_s:.1f}/s, p99 {f.p99_ms:.1f} ms, wasted "
                    f"{'n/a' if f.wasted_share is None else f'{100 * f.wasted_share:.1f}%'}"
                    + (" (cut off)" if run.cut_off else "")
                    + (f" [{run.problem}]" if run.problem else ""))
    return runs


# -- rows -----------------------------------------------------------------------------

def summarise(runs: Sequence[ArmRun], bases: Mapping[str, Baseline], model: str,
              data_plane: str, seconds: float) -> list[dict[str, Any]]:
    """One row per protocol, load and arm: medians over rounds; goodput_ratio pairs each
    run with the 1x shedding-on run of its round."""
    reference = {(r.protocol, r.round): figures(r).goodput_per_s for r in runs
                 if r.load_x == 1 and r.arm == ON}
    rows = []
    for protocol, x, arm in dict.fromkeys((r.protocol, r.load_x, r.arm) for r in runs):
        mine = [r for r in runs if (r.protocol, r.load_x, r.arm) == (protocol, x, arm)]
        each = [figures(r) for r in mine]
        ratios = [f.goodput_per_s / reference[(r.protocol, r.round)]
                  for r, f in zip(mine, each, strict=True)
                  if reference.get((r.protocol, r.round))]
        wasted = [f.wasted_share for f in each if f.wasted_share is not None]
        base = bases[protocol]
        row: dict[str, Any] = {
            "model": model, "protocol": protocol, "data_plane": data_plane,
            "offered_x": x, "arm": arm, "deadline_ms": base.deadline_ms,
            "alone_p50_ms": base.alone_p50_ms, "capacity_per_s": base.capacity_per_s,
            "capacity_after_per_s": base.capacity_after_per_s,
            "offered_per_s": mine[0].plan.offered_per_s,
            "goodput_per_s": median([f.goodput_per_s for f in each]),
            "goodput_ratio": median(ratios) if ratios else None,
            "goodput_ratio_range": [min(ratios), max(ratios)] if len(ratios) > 1 else None,
            "unanswered_per_s": median([f.unanswered_per_s for f in each]),
            "shed_per_s": median([f.shed_per_s for f in each]),
            "refused_per_s": median([f.refused_per_s for f in each]),
            "p50_ms": finite_median([f.p50_ms for f in each]),
            "p99_ms": finite_median([f.p99_ms for f in each]),
            "latency": EXACT if all(f.exact for f in each) else UPPER_BOUND,
            "wasted_share": median(wasted) if wasted else None,
            "triton_executed_per_s": median([f.executed_per_s for f in each]),
            "cut_off_runs": sum(r.cut_off for r in mine),
            "rounds": len(mine), "seconds": seconds,
        }
        notes = list(dict.fromkeys(r.problem for r in mine if r.problem))
        if notes:
            row["notes"] = notes
        row["goal"], row["met"] = verdict(row)
        rows.append(row)
    return rows


def verdict(row: Mapping[str, Any]) -> tuple[str, str]:
    """(goal, met?) for a shedding-on row; none for the arm without shedding."""
    if row["arm"] != ON:
        return "", ""
    goals = [(f"wasted < {WASTE_GOAL:.0%}", row["wasted_share"], lambda v: v < WASTE_GOAL)]
    if row["offered_x"] == max(LOADS):
        goals.insert(0, (f"ratio >= {GOODPUT_GOAL_RATIO:g}", row["goodput_ratio"],
                         lambda v: v >= GOODPUT_GOAL_RATIO))
    missed = [name for name, value, ok in goals if value is not None and not ok(value)]
    unknown = [name for name, value, _ in goals if value is None]
    met = ("NO (" + ", ".join(missed) + ")" if missed
           else f"n/a ({', '.join(unknown)})" if unknown else "yes")
    if row["latency"] != EXACT and not met.startswith("n/a"):
        met += " (bounds)"
    return ", ".join(name for name, _, _ in goals), met


# -- output ---------------------------------------------------------------------------

def cells(r: Mapping[str, Any]) -> list[object]:
    """One row of the table; '<=' (and '>=' on the wasted share) where figures are bounds."""
    bound = "" if r["latency"] == EXACT else "<="
    ratio = with_range(r, "goodput_ratio", ".2f")
    wasted = num(None if r["wasted_share"] is None else 100 * r["wasted_share"], ".1f")
    if wasted != "n/a":
        wasted = (">=" if bound else "") + wasted + "%"
    return [r["model"], r["protocol"], f"{r['offered_x']}x", r["arm"],
            f"{r['offered_per_s']:.0f}", bound + num(r["goodput_per_s"], ".1f"), bound + ratio,
            num(r["shed_per_s"], ".1f"), num(r["refused_per_s"], ".1f"),
            num(r["unanswered_per_s"], ".1f"), bound + num(r["p50_ms"], ".1f"),
            bound + num(r["p99_ms"], ".1f"), wasted, r["goal"], r["met"]]


def markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    if not rows:
        return "(nothing measured)"
    lines = [table(("model", "protocol", "offered", "shedding", "offered/s", "goodput/s",
                    "ratio vs 1x on", "shed/s", "refused/s", "no answer/s", "p50 ms", "p99 ms",
                    "wasted", "goal", "met?"), (cells(r) for r in rows))]
    first = rows[0]
    protocols = dict.fromkeys((r["protocol"], r["deadline_ms"], r["alone_p50_ms"],
                               r["capacity_per_s"], r.get("capacity_after_per_s"))
                              for r in rows)
    lines.append(
        f"\nData plane: {first['data_plane']}. Per protocol: "
        + "; ".join(f"{p} alone p50 {p50:.1f} ms, deadline D = {d} ms, capacity "
                    f"{cap:.1f}/s ({num(after, '.1f')}/s after the runs)"
                    for p, d, p50, cap, after in protocols)
        + f". D = {DEADLINE_X_P50}x the alone p50, at least {DEADLINE_FLOOR_MS} ms. Open "
        "loop (h2load, one connection per request, opened at the offered rate); medians "
        f"over {first['rounds']} round(s) of {first['seconds']:g} s schedules, the arms' "
        "order swapped every run; the model's bound: "
        f"{first.get('model_bound', 'n/a')} requests in the gateway (about 2 s of work: "
        "refused/s). Goodput: HTTP-200 answers within D per second of the "
        "schedule; ratio: over the 1x shedding-on goodput of the same round, "
        "(lowest..highest). shed/s: refused by the deadline rule; refused/s: by the "
        "model's bound; no answer/s: requests "
        "h2load logged no answer for (the connection closed before the answer could be "
        "read). p50/p99: successes, late ones "
        "included. Wasted: Triton's executions not answered within D, over its "
        "executions. gRPC: h2load logs every answer as HTTP 200, so '<=' marks upper "
        "bounds (the gateway's success count; the answers within D less the shed ones) "
        "and '>=' the wasted share they give.")
    notes = [f"{r['protocol']} {r['offered_x']}x {r['arm']}: {n}"
             for r in rows for n in r.get("notes", [])]
    if notes:
        lines.append("\nNotes:\n" + "\n".join(f"- {n}" for n in notes))
    return "\n".join(lines)


def plot(rows: Sequence[Mapping[str, Any]], out: Path) -> list[Path]:
    """Goodput against offered load, both arms, per protocol."""
    if not rows:
        return []
    path = out / "bench_overload.png"
    with figure(path, figsize=(7, 4.5)) as (_, ax):
        for protocol in dict.fromkeys(r["protocol"] for r in rows):
            for arm, style in ((ON, "-o"), (OFF, "--s")):
                mine = sorted((r for r in rows if r["protocol"] == protocol and r["arm"] == arm),
                              key=lambda r: r["offered_per_s"])
                if mine:
                    ax.plot([r["offered_per_s"] for r in mine],
                            [r["goodput_per_s"] for r in mine], style,
                            label=f"{protocol}, shedding {arm}")
            capacity = next(r["capacity_per_s"] for r in rows if r["protocol"] == protocol)
            ax.axhline(capacity, color="grey", linestyle="dotted", linewidth=1)
        ax.set_xlabel("offered load (req/s, open loop)")
        ax.set_ylabel("goodput (answers within D per s)")
        ax.set_title(f"{rows[0]['model']}: goodput under overload (dotted: capacity)")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    return [path]


# -- the run --------------------------------------------------------------------------

def run(model: str = "sample", protocols: Sequence[str] = PROTOCOLS, rounds: int = 3,
        seconds: float = 2.0, data_plane: str = "haproxy", loads: Sequence[int] = LOADS,
        baseline_runs: int = 2) -> list[dict[str, Any]]:
    """The benchmark's rows; ``loads``: the offered loads, in multiples of the measured
    capacity (a subset of :data:`LOADS`: the goals are judged at its highest);
    ``baseline_runs``: closed-loop runs per baseline figure, the best one kept."""
    if shutil.which("h2load") is None:
        raise RuntimeError("h2load not found: install Debian's nghttp2-client (make system-deps)")
    setup = MODELS[model]
    started = time.monotonic()
    runs: list[ArmRun] = []
    bases: dict[str, Baseline] = {}
    with tempfile.TemporaryDirectory(prefix="bench_overload-") as tmp, \
            stack(Path(tmp), setup, data_plane) as st:
        say(f"{setup.name} ({setup.note}); pool '{POOL}': 1 member x capacity_per_member "
            f"{setup.capacity_per_member}, max_queue {setup.max_queue}; data plane "
            f"{data_plane}")
        for protocol in protocols:
            base = bases[protocol] = baseline(st, protocol, setup, min(seconds, 2.0),
                                                baseline_runs)
            say(f"{protocol}: alone p50 {base.alone_p50_ms:.1f} ms -> deadline "
                f"{base.deadline_ms} ms; capacity {base.capacity_per_s:.1f}/s at "
                f"{setup.saturating_in_flight} in flight (closed loop)")
            runs += measure(st, protocol, base, rounds, seconds, loads)
            # a model that came out of overload slower than it went in (a Triton bug can
            # leave its batcher so: see the docstring) taints every run after the first
            after, _ = closed_loop(st, protocol, setup.saturating_in_flight, min(seconds, 2.0))
            bases[protocol] = dataclasses.replace(base, capacity_after_per_s=after)
            say(f"{protocol}: capacity {after:.1f}/s after the runs")
    say(f"measured in {time.monotonic() - started:.0f} s")
    rows = summarise(runs, bases, setup.name, data_plane, seconds)
    return [{**row, "model_bound": setup.capacity_per_member + setup.max_queue}
            for row in rows]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="tiny model, HTTP, one round: about a minute and a half")
    parser.add_argument("--model", choices=sorted(MODELS), default=None,
                        help="sample: EfficientNet-Lite0 (default); tiny: the quick stand-in")
    parser.add_argument("--protocol", choices=("http", "grpc", "both"), default=None,
                        help="default both (--quick: http)")
    parser.add_argument("--seconds", type=float, default=None,
                        help="each open-loop schedule (default 2)")
    parser.add_argument("--rounds", type=int, default=None, help="default 3 (--quick: 1)")
    parser.add_argument("--data-plane", choices=("haproxy", "python"), default="haproxy")
    parser.add_argument("--out", type=Path, default=None,
                        help="also write bench_overload.json/.md/.png into this folder")
    args = parser.parse_args(argv)
    protocol = args.protocol or ("http" if args.quick else "both")
    rows = run(args.model or ("tiny" if args.quick else "sample"),
               PROTOCOLS if protocol == "both" else (protocol,),
               args.rounds or (1 if args.quick else 3),
               args.seconds or 2.0, args.data_plane)
    publish(rows, markdown, plot, args.out, "bench_overload", say)


if __name__ == "__main__":
    main()
