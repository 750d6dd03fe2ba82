"""Progressive delivery (rollouts) against one real Triton and one gateway (HAProxy data
plane): how a rollout steers the traffic of a good, an erroring, a slow and a differing
candidate, and throughput during a rollout against without, on both protocols.

**Scenarios.** Each on its own model, pre-published as the tiny model (version 1,
y = 2x + 1) and adopted at start-up (``preload``). A candidate is uploaded with
``rollout: {steps: [10, 50, 100], step_seconds: S, min_requests: 30}`` (S = 5 s, 3 with
``--quick``); from the moment its job is rolling out, one client thread sends unversioned
HTTP JSON requests back to back (x = 0.5, every 5th request x[0] = 0.9) and records
(time, ok, version) per answer, the version being the ``model_version`` Triton puts in
its answer:

- ``good``: y = 2.1x + 1 (agreement ~1);
- ``erroring``: y = 2x + 1 that fails when x[0] > 0.8, i.e. 20 % of the client's
  inputs (its evaluation set uniform in [0, 0.8), so that conversion passes): its client
  failures against the expectation first step share x 20 % x requests in that step;
- ``slow``: y = 2x + 1 plus ~10 ms of MatMuls per row;
- ``differing``: y = -2x + 1 (agreement far below 0.99);
- ``erroring_guarded``, ``slow_guarded``: the same candidates with the gate and the shadow
  step on (the defaults: the evaluation set replayed to both versions before any user,
  then 20 % of live requests mirrored for one step's length, users answered by stable);
- ``diverging``: y = 2x + 1 where x[0] <= 0.8, -2x + 1 beyond (its evaluation set in
  [0, 0.8): the gate cannot tell, the shadow step's live inputs can).

``erroring`` and ``slow`` keep the steps alone (``agreement_samples: 0``, ``shadow:
none``): what a user saw before the gate and the shadow step; ``good`` and
``differing`` have both (``differing`` meets the gate). Per scenario besides: what judged
it, the answers the client got from the candidate (goal 0 for a bad one), the time from
the rollout's start to its verdict, the agreement on the replayed samples (the gate's)
and on the mirrored live requests (the shadow step's).

Every scenario keeps the policy's defaults for the latency check (``max_p99_ratio`` 1.3,
``p99_tolerance_ms`` 5, the median guard). During a rollout both versions run under
stable's scheduling config (``gateway.lifecycle.warmup.rollout.side_by_side_config``):
the slow candidate's own dynamic-batching delay (~10 ms, its batch-1 p50) does not slow
stable down.

Per scenario: outcome and the verdict's reason, the step it ended at, wall time from
step 1's start to the final verdict against steps x step_seconds, client requests,
failures and the longest wait between two answers (a stall); the plot shows the
candidate's share of answers per 1 s bin, the step schedule (from the verdicts' times:
a step began at its first verdict's ``at - seconds``), the end, and failures per second.

**Throughput during a rollout.** HAProxy pins unversioned requests itself: HTTP by the
path, gRPC by the Lua filter of the pool's pin backend (``gateway/haproxy/grpc_fields.lua``;
before, every such gRPC request went through the control plane's Python gRPC server,
measured at 0.60x). h2load (closed loop, ``--in-flight`` requests)
measures throughput and median latency of a model with no rollout and of one held at
50 % (a 2.1x + 1 candidate, steps [50, 100], step_seconds 3600, paused with an admin
token, aborted afterwards), interleaved, ``rounds`` x ``seconds`` (5 x 3 s; ``--quick``
1 x 3 s), over gRPC ``ModelInfer`` and HTTP binary tensors: ratios rollout / no rollout,
medians of the per-round ratios (lowest..highest beside them). Failures the gateway
counted (``infergate_requests_total`` not ``success``: a gRPC error is HTTP 200 to
h2load) are taken out of the throughput. Part of a ratio can be Triton's rather than
the gateway's: two versions loaded are two model instances, and the requests in flight
are batched over both instead of one.

**The shadow step's cost.** HAProxy cannot copy a request: during a shadow step it
hands the sampled share (20 %) of a model's unversioned requests to the control plane's
forwarder, which answers them from stable and mirrors them. The same h2load rounds
measure a model held in its shadow step (paused) against one without rollout.

About 5 minutes on 2 cores (``--quick`` about 2).

    python -m loadtests.bench_rollout [--quick] [--out DIR] [--in-flight 4]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import numpy as np
import tritonclient.grpc as grpcclient

from converters.tiny import TINY_WIDTH, build_tiny_model
from gateway.lifecycle.client import LifecycleClient, LifecycleError
from infergate.processes import GatewayProcess, wait_until
from infergate.triton.local import TritonEndpoints
from loadtests.h2load import Workload, h2load_command, run_h2load, write_workload
from loadtests.harness import (
    Stack,
    figure,
    gateway_yaml,
    num,
    percentile,
    publish,
    reporter,
    settle,
    spread,
    stack,
    table,
    totals,
    with_range,
)
from loadtests.rollout_models import (
    affine_onnx,
    diverging_onnx,
    erroring_onnx,
    flipped_onnx,
    slow_onnx,
)
from loadtests.uploads import (
    JOB_TIMEOUT_S,
    TOKENS,
    evaluation_set,
    upload,
    wait_job,
)

STEPS = (10, 50, 100)
MIN_REQUESTS = 30
BAD_EVERY = 5  # every 5th request has x[0] = 0.9, which the erroring candidate fails on
BAD_SHARE = 1 / BAD_EVERY
GOOD_SLOPE = 2.1
BIN_S = 1.0
LEAD_S, TAIL_S = 3.0, 3.0  # plotted before step 1 and after the end
PROTOCOLS = ("grpc", "http")
DETOUR_PLAIN, DETOUR_SPLIT = "detour_plain", "detour_split"
SHADOW_HELD, SHADOW_PERCENT = "shadow_held", 20  # held in its shadow step (paused)

Answer = tuple[float, bool, int | None]  # (time.time(), ok, the version that answered)


say = reporter("bench_rollout")


@dataclass(frozen=True)
class Scenario:
    name: str
    build: Callable[[Path], Path]  # writes the candidate's ONNX
    spec: Mapping[str, Any]  # rollout fields beyond the common ones
    calm_evaluation: bool = False  # evaluation set uniform in [0, 0.8)
    upload: Mapping[str, Any] = field(default_factory=dict)  # upload spec fields beyond TINY_SPEC

    @property
    def model(self) -> str:
        return f"roll_{self.name}"


    @property
    def guard(self) -> str:
        """What judges it before users see it: the gate (with samples to replay), the
        shadow step (unless ``shadow: none``)."""
        gate = self.spec.get("agreement_samples", 32) != 0
        shadow = self.spec.get("shadow", {}) not in ("none", False, None)
        return " + ".join(n for n, on in (("gate", gate), ("shadow", shadow)) if on) or "none"


STEPS_ONLY = {"agreement_samples": 0, "shadow": "none"}  # no gate, no shadow: as before
SCENARIOS = (
    Scenario("good", lambda p: affine_onnx(p, GOOD_SLOPE), {}),
    Scenario("erroring", erroring_onnx, STEPS_ONLY, calm_evaluation=True),
    Scenario("slow", slow_onnx, STEPS_ONLY),
    Scenario("differing", flipped_onnx, {}),
    # the gate and the shadow step on (the defaults): no user answered by the candidate
    Scenario("erroring_guarded", erroring_onnx, {}, calm_evaluation=True),
    Scenario("slow_guarded", slow_onnx, {}),
    Scenario("diverging", diverging_onnx, {}, calm_evaluation=True),
)
SCENARIO_NAMES = tuple(s.name for s in SCENARIOS)


# -- pure: timelines ------------------------------------------------------------------

def step_starts(decisions: Sequence[Mapping[str, Any]]) -> list[tuple[float, int]]:
    """(time, percent) at which each step began, in order: its first verdict's
    ``at - seconds`` (a hold restarts the window, so the first one counts)."""
    starts: dict[int, tuple[float, int]] = {}
    for d in decisions:  # the gate's and the shadow step's verdicts are not steps
        if isinstance(d.get("step"), int) and "seconds" in d:
            began = float(d["at"]) - float(d["seconds"])
            if d["step"] not in starts or began < starts[d["step"]][0]:
                starts[d["step"]] = (began, int(d["percent"]))
    return [starts[s] for s in sorted(starts)]


@dataclass(frozen=True)
class Bin:
    start: float  # seconds since the origin
    answers: int  # successful answers
    candidate: int  # of which the candidate's
    failures: int

    @property
    def share(self) -> float | None:
        return self.candidate / self.answers if self.answers else None


def share_bins(answers: Sequence[Answer], candidate: int, origin: float, start: float,
               end: float, width: float = BIN_S) -> list[Bin]:
    """Answers with ``start <= t - origin < end`` in bins of ``width`` seconds (the
    last one may be partial): successes, the candidate's, failures."""
    count = max(0, math.ceil((end - start) / width - 1e-9))
    tallies = [[0, 0, 0] for _ in range(count)]
    for t, ok, version in answers:
        rel = t - origin
        if not start <= rel < end:
            continue
        tally = tallies[min(count - 1, int((rel - start) // width))]
        if ok:
            tally[0] += 1
            tally[1] += version == candidate
        else:
            tally[2] += 1
    return [Bin(round(start + i * width, 6), *t) for i, t in enumerate(tallies)]


def within(answers: Sequence[Answer], start: float, end: float) -> list[Answer]:
    return [a for a in answers if start <= a[0] <= end]


def longest_gap(answers: Sequence[Answer]) -> tuple[float, float]:
    """(seconds, when) of the longest wait between two consecutive answers (the client
    sends back to back: a stall); (0, nan) with fewer than two."""
    times = sorted(t for t, _, _ in answers)
    gaps = [(b - a, a) for a, b in zip(times, times[1:], strict=False)]
    return max(gaps) if gaps else (0.0, math.nan)


def scenario_row(name: str, job: Mapping[str, Any], answers: Sequence[Answer],
                 step_seconds: float) -> dict[str, Any]:
    """One scenario's figures from its finished job (with its ``rollout`` record) and
    the client's answers."""
    rollout = job["rollout"]
    decisions = rollout["decisions"]
    final = decisions[-1]
    promoted = job["state"] == "succeeded"
    steps = list(rollout["spec"]["steps"])
    starts = step_starts(decisions)
    origin = starts[0][0] if starts else float(rollout["started_at"])
    end = float(final["at"])
    failures = sum(1 for _, ok, _ in answers if not ok)
    gap, gap_at = longest_gap(answers)
    row: dict[str, Any] = {
        "part": "scenario", "scenario": name, "model": rollout["model"],
        "outcome": "promoted" if promoted else rollout["state"].replace("_", " "),
        "reason": final["reason"], "decision": final["decision"],
        "ended_step": final.get("step", len(starts)), "ended_percent": final.get("percent"),
        "steps": steps, "step_seconds": step_seconds,
        "wall_s": round(end - origin, 2), "planned_s": len(steps) * step_seconds,
        "with_loading_s": round(end - float(rollout["started_at"]), 2),
        "requests": len(answers), "failures": failures,
        "failures_after_verdict": sum(1 for t, ok, _ in answers if not ok and t > end),
        "candidate_answers": sum(1 for _, ok, v in answers if ok and v == rollout["candidate"]),
        "longest_gap_s": round(gap, 3), "longest_gap_at_s": round(gap_at - origin, 2),
        "agreement": final.get("agreement"), "p99_ratio": final.get("p99_ratio"),
        "candidate_window": final.get("candidate"), "stable_window": final.get("stable"),
        "verdict_s": round(end - float(rollout["started_at"]), 2),
    }
    # the gate judged something only with samples to replay (agreement_samples > 0)
    gate = next((d for d in decisions if d.get("step") == "gate" and d.get("samples")), None)
    shadow = next((d for d in reversed(decisions) if d.get("step") == "shadow"), None)
    row["guard"] = " + ".join(n for n, d in (("gate", gate), ("shadow", shadow)) if d) or "none"
    row["agreement_replayed"] = gate.get("agreement") if gate else None
    row["agreement_live"] = shadow.get("agreement") if shadow else None
    if shadow is not None:
        row.update(mirrored=(shadow.get("candidate") or {}).get("requests"),
                   mirror_skipped=shadow.get("skipped"), shadow_decision=shadow["decision"])
    if name == "erroring" and starts:
        step_end = starts[1][0] if len(starts) > 1 else end
        in_step = len(within(answers, origin, step_end))
        expected = starts[0][1] / 100 * BAD_SHARE * in_step
        row.update(step1_requests=in_step, expected_failures=round(expected, 1),
                   failure_bound=round(expected + 3 * math.sqrt(expected) + 2, 1))
    bins = share_bins(answers, rollout["candidate"], origin, -LEAD_S, end - origin + TAIL_S)
    row["timeline"] = {
        "t": [b.start for b in bins], "share": [b.share for b in bins],
        "failures_per_s": [b.failures / BIN_S for b in bins],
        "schedule": [[round(t - origin, 3), p] for t, p in starts],
        "end": round(end - origin, 3), "final_percent": 100 if promoted else 0}
    return row


# -- pure: the detour -----------------------------------------------------------------

@dataclass(frozen=True)
class DetourRun:
    round: int
    protocol: str
    rollout: bool  # the model held mid-rollout (else the one without)
    seconds: float
    succeeded: int  # h2load's 2xx less the failures the gateway counted
    failed: int
    p50_ms: float

    @property
    def per_s(self) -> float:
        return self.succeeded / self.seconds if self.seconds > 0 else math.nan


def paired(runs: Sequence[DetourRun], protocol: str, value: Callable[[DetourRun], float]
           ) -> tuple[float, float, list[float]]:
    """Median of ``value`` without and with the rollout, and the per-round ratios
    (with / without)."""
    mine = [r for r in runs if r.protocol == protocol]
    plain = {r.round: value(r) for r in mine if not r.rollout}
    split = {r.round: value(r) for r in mine if r.rollout}
    ratios = [split[k] / plain[k] for k in plain if k in split and plain[k] > 0]
    return median(plain.values()), median(split.values()), ratios


def median(values: Iterable[float]) -> float:
    kept = [v for v in values if math.isfinite(v)]
    return statistics.median(kept) if kept else math.nan


def detour_rows(runs: Sequence[DetourRun], in_flight: int,
                seen: Mapping[str, float | None] | None = None) -> list[dict[str, Any]]:
    rows = []
    for protocol in dict.fromkeys(r.protocol for r in runs):
        plain_s, split_s, tput = paired(runs, protocol, lambda r: r.per_s)
        plain_ms, split_ms, p50 = paired(runs, protocol, lambda r: r.p50_ms)
        mine = [r for r in runs if r.protocol == protocol]
        rows.append({
            "part": "detour", "protocol": protocol, "in_flight": in_flight,
            "rounds": len({r.round for r in mine}), "seconds": mine[0].seconds,
            "plain_per_s": plain_s, "rollout_per_s": split_s,
            "throughput_ratio": median(tput), "throughput_ratio_range": spread(tput),
            "plain_p50_ms": plain_ms, "rollout_p50_ms": split_ms,
            "p50_latency_ratio": median(p50), "p50_latency_ratio_range": spread(p50),
            "plain_failed": sum(r.failed for r in mine if not r.rollout),
            "rollout_failed": sum(r.failed for r in mine if r.rollout),
            "candidate_share_seen": (seen or {}).get(protocol)})
    return rows


def gateway_outcomes(metrics_text: str, model: str, protocol: str) -> dict[str, float]:
    """``infergate_requests_total`` of user traffic for ``model`` over ``protocol``, by
    outcome (summed over every other label)."""
    return totals(metrics_text, "infergate_requests_total", "outcome", model=model,
                  protocol=protocol, traffic="user")


# -- pure: the table ------------------------------------------------------------------

def scenario_cells(r: Mapping[str, Any]) -> list[object]:
    errors = ""
    if "expected_failures" in r:
        late = r.get("failures_after_verdict", 0)
        errors = (f"{r['failures']} vs ~{r['expected_failures']:g} expected "
                  f"(<= {r['failure_bound']:g}; {r['step1_requests']} requests in step 1"
                  + (f"; {late} after the verdict)" if late else ")"))
    reason = str(r["reason"]).replace("|", "/")
    ended = r["ended_step"] if isinstance(r["ended_step"], str) else \
        f"{r['ended_step']} ({num(r['ended_percent'], '.0f')}%)"
    mirrored = f" ({r['mirrored']} mirrored)" if r.get("mirrored") is not None else ""
    return [r["scenario"], r.get("guard", "-"), r["outcome"], reason, ended,
            f"{r['wall_s']:.1f} / {r['planned_s']:g}", num(r.get("verdict_s"), ".1f"),
            r["requests"], r["candidate_answers"], r["failures"],
            f"{num(r.get('agreement_replayed'), '.3f')} / "
            f"{num(r.get('agreement_live'), '.3f')}{mirrored}",
            f"{r['longest_gap_s']:.2f} (at {r['longest_gap_at_s']:+.1f} s)", errors]


def detour_cells(r: Mapping[str, Any]) -> list[object]:
    seen = r.get("candidate_share_seen")
    return [r["protocol"], r["in_flight"], num(r["plain_per_s"], ".0f"),
            num(r["rollout_per_s"], ".0f"), with_range(r, "throughput_ratio", ".2f", "x"),
            num(r["plain_p50_ms"], ".2f"), num(r["rollout_p50_ms"], ".2f"),
            with_range(r, "p50_latency_ratio", ".2f", "x"),
            f"{r['plain_failed']} / {r['rollout_failed']}",
            "n/a" if seen is None else f"{100 * seen:.0f}%"]


def markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    scenarios = [r for r in rows if r["part"] == "scenario"]
    detours = [r for r in rows if r["part"] == "detour"]
    shadows = [r for r in rows if r["part"] == "shadow"]
    lines: list[str] = []
    if scenarios:
        first = scenarios[0]
        lines += [
            f"Rollouts: steps {first['steps']}, {first['step_seconds']:g} s each, "
            f"min_requests {MIN_REQUESTS}; one client, unversioned HTTP, back to back.",
            "",
            table(("scenario", "judged by", "outcome", "final verdict", "ended at",
                   "wall s / planned s", "verdict s", "requests",
                   "answers by the candidate", "failures",
                   "agreement replayed / live", "longest wait s", "failures vs expected"),
                  (scenario_cells(r) for r in scenarios)),
            "",
            "Judged by: the gate (the owner's samples replayed to both versions, no user) "
            "and the shadow step (20 % of live requests mirrored, users answered by "
            "stable), before the steps; \"none\": the steps alone, as before the gate. "
            "Answers by the candidate: the client's answers whose model_version is the "
            "candidate's (goal 0 for a bad one judged by the gate and the shadow step). "
            "Verdict s: from the rollout's start (loading beside stable included) to the "
            "final verdict. Agreement: the gate's on the replayed samples / the shadow "
            "step's on the mirrored live requests. "
            "Wall: from step 1's start (the rollout's, when it never reached one) to the "
            "final verdict; planned: steps x step_seconds. Longest wait: the longest "
            "time between two answers (the client sends back to back), and when, from step "
            f"1's start. Expected failures: first step share x {BAD_SHARE:.0%} x requests "
            "answered in step 1 (bound: + 3 sigma + 2).",
        ]
    if detours:
        d = detours[0]
        lines += [
            *([""] if lines else []),
            f"During a rollout (pinned in HAProxy, gRPC by its Lua filter): h2load, "
            f"{d['in_flight']} in flight, median of {d['rounds']} "
            f"round(s) x {d['seconds']:g} s; a model without rollout vs one held at 50 % "
            "(paused).",
            "",
            table(("protocol", "in flight", "req/s no rollout", "req/s rollout",
                   "throughput ratio", "p50 ms no rollout", "p50 ms rollout", "p50 ratio",
                   "failed (no / rollout)", "candidate share seen"),
                  (detour_cells(r) for r in detours)),
        ]
    if shadows:
        d = shadows[0]
        lines += [
            *([""] if lines else []),
            f"Shadow step on the HAProxy plane: {d['percent']}% of a model's unversioned "
            f"requests take the control plane's forwarder, which mirrors them; h2load, "
            f"{d['in_flight']} in flight, median of {d['rounds']} round(s) x "
            f"{d['seconds']:g} s; a model without rollout vs one held in its shadow step "
            "(paused).",
            "",
            table(("protocol", "in flight", "req/s no rollout", "req/s shadow step",
                   "throughput ratio", "p50 ms no rollout", "p50 ms shadow step",
                   "p50 ratio", "failed (no / shadow)", "mirrored (skipped, errors)"),
                  ([*detour_cells(r)[:-1],
                    f"{r['mirrored']} ({r['skipped']}, {r['mirror_errors']})"]
                   for r in shadows)),
            "",
            "Mirrored: pairs of both protocols over the whole measurement (warm-up "
            "included); skipped: requests not mirrored, 8 mirrors already in flight.",
        ]
    return "\n".join(lines) if lines else "(nothing measured)"


# -- the stack ------------------------------------------------------------------------

def lifecycle(url: str, scope: str = "upload") -> LifecycleClient:
    return LifecycleClient(url, TOKENS[scope], timeout=120)


@contextlib.contextmanager
def rollout_stack(scratch: Path, models: Sequence[str]) -> Iterator[Stack]:
    """Triton (nothing loaded) and an HAProxy-plane gateway with a lifecycle section,
    tokens for upload and admin, inference open, adopting ``models`` at start-up, each
    the tiny model pre-published as version 1."""
    repo = scratch / "model_repo"
    for model in models:
        build_tiny_model(repo, model)

    def config(path: Path, member: TritonEndpoints) -> Path:
        return gateway_yaml(path, {"local": [member]}, lifecycle=repo, tokens=TOKENS,
                            models={m: {"preload": True} for m in models})

    with stack(scratch, repo, data_plane="haproxy", config=config) as st:
        yield st


def infer_body(n: int) -> dict[str, Any]:
    x = [0.5] * TINY_WIDTH
    if n % BAD_EVERY == 0:
        x[0] = 0.9
    return {"inputs": [{"name": "x", "shape": [1, TINY_WIDTH], "datatype": "FP32", "data": x}]}


@dataclass
class Client:
    """Unversioned HTTP requests back to back from a thread, while in its ``with``."""

    url: str
    model: str
    answers: list[Answer] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Client:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)

    def _loop(self) -> None:
        n = 0
        with httpx.Client(timeout=30, trust_env=False) as client:
            while not self._stop.is_set():
                n += 1
                version = None
                try:
                    resp = client.post(f"{self.url}/v2/models/{self.model}/infer",
                                       json=infer_body(n))
                    ok = resp.status_code == 200
                    if ok:
                        version = int(resp.json().get("model_version", 0)) or None
                except (httpx.HTTPError, ValueError):
                    ok = False
                self.answers.append((time.time(), ok, version))


def run_scenario(st: Stack, scenario: Scenario, step_seconds: float) -> dict[str, Any]:
    rollout = {"steps": list(STEPS), "step_seconds": step_seconds,
               "min_requests": MIN_REQUESTS, **scenario.spec}
    candidate = scenario.build(st.folder / f"{scenario.name}.onnx")
    with lifecycle(st.url) as api:
        job_id = upload(api, scenario.model, candidate, rollout,
                        evaluation_set(scenario.calm_evaluation), scenario.upload)
        say(f"{scenario.name}: uploaded (job {job_id}), converting")
        wait_job(api, job_id, ("rolling_out", "succeeded", "failed"))
        with Client(st.url, scenario.model) as client:
            done = wait_job(api, job_id, ("succeeded", "failed"))
            ended = time.time()
            if not wait_until(lambda: bool(client.answers) and client.answers[-1][0] >= ended
                              + TAIL_S, 60, 0.05):
                raise RuntimeError(f"{scenario.name}: the client got no answer after the end")
    if "rollout" not in done:
        raise RuntimeError(f"{scenario.name}: the job ended without a rollout: "
                           f"{json.dumps(done)[:1500]}")
    row = scenario_row(scenario.name, done, client.answers, step_seconds)
    say(f"{scenario.name}: {row['outcome']} at step {row['ended_step']}: {row['reason']} "
        f"({row['requests']} requests, {row['failures']} failed)")
    return row


def measure_shadow(st: Stack, rounds: int, seconds: float, in_flight: int
                   ) -> list[dict[str, Any]]:
    """The shadow step's cost on the HAProxy plane: ``SHADOW_PERCENT`` % of a model's
    unversioned requests take the control plane's forwarder (which mirrors them). h2load
    on a model held in its shadow step (a 2.1x + 1 candidate, paused) against
    ``DETOUR_PLAIN``, interleaved as the detour's rounds; the rows are the detour's
    (``part`` "shadow"), with the pairs mirrored and the mirrors skipped meanwhile."""
    gw, scratch = st.gateway, st.folder
    with lifecycle(st.url) as api, lifecycle(st.url, "admin") as admin:
        rollout = {"steps": [50, 100], "step_seconds": 3600, "min_requests": 10,
                   "shadow": {"percent": SHADOW_PERCENT, "seconds": 3600}}
        job_id = upload(api, SHADOW_HELD, affine_onnx(scratch / "shadow.onnx", GOOD_SLOPE),
                        rollout, evaluation_set(False))
        say(f"shadow: {SHADOW_HELD} uploaded (job {job_id}), waiting for its shadow step")

        def in_shadow() -> bool:
            try:
                return "shadow" in api.rollout(SHADOW_HELD)
            except LifecycleError:
                return False

        try:
            if not wait_until(in_shadow, JOB_TIMEOUT_S, 0.2):
                raise RuntimeError(f"{SHADOW_HELD} never reached its shadow step: "
                                   f"{json.dumps(api.job(job_id))[:1500]}")
            admin.rollout_action(SHADOW_HELD, "pause")  # the shadow stays, no verdict
            runs = interleaved(st, gw, scratch, (DETOUR_PLAIN, SHADOW_HELD), rounds,
                               seconds, in_flight, "shadow")
            figures = api.rollout(SHADOW_HELD).get("shadow") or {}
            rows = detour_rows(runs, in_flight)
            for row in rows:
                row.update(part="shadow", percent=SHADOW_PERCENT,
                           mirrored=(figures.get("candidate") or {}).get("requests"),
                           mirror_errors=(figures.get("candidate") or {}).get("errors"),
                           skipped=figures.get("skipped"), agreement=figures.get("agreement"))
            return rows
        finally:
            with contextlib.suppress(LifecycleError, httpx.HTTPError):
                admin.rollout_action(SHADOW_HELD, "abort")
            with contextlib.suppress(RuntimeError, httpx.HTTPError):
                wait_job(api, job_id, ("succeeded", "failed"))


# -- the detour -----------------------------------------------------------------------

def percent_now(client: LifecycleClient, model: str) -> int:
    try:
        return int(client.rollout(model)["percent"])
    except LifecycleError:
        return -1


def versions_seen(gw: GatewayProcess, model: str, protocol: str, n: int = 40) -> list[int]:
    """The versions answering ``n`` unversioned requests (model_version)."""
    if protocol == "http":
        with httpx.Client(timeout=30, trust_env=False) as client:
            return [int(client.post(f"http://{gw.http_url}/v2/models/{model}/infer",
                                    json=infer_body(1)).json()["model_version"])
                    for _ in range(n)]
    client = grpcclient.InferenceServerClient(gw.grpc_url)
    try:
        item = grpcclient.InferInput("x", [1, TINY_WIDTH], "FP32")
        item.set_data_from_numpy(np.full((1, TINY_WIDTH), 0.5, np.float32))
        return [int(client.infer(model, [item]).get_response().model_version)
                for _ in range(n)]
    finally:
        client.close()


def settled_failed(st: Stack, model: str, protocol: str) -> float:
    """Requests of ``model`` over ``protocol`` the gateway did not count a success, once
    its counts of them have stopped moving (HAProxy's telemetry arrives a little after
    each answer): two reads 0.5 s apart agree."""
    outcomes, _ = settle(lambda: gateway_outcomes(st.metrics(), model, protocol),
                         quiet_s=0.5, timeout_s=10, interval_s=0.5)
    return sum(v for k, v in outcomes.items() if k != "success")


def h2load_run(gw: GatewayProcess, work: Workload, protocol: str, in_flight: int,
               seconds: float, scratch: Path) -> tuple[float, int, float]:
    """(seconds, 2xx answers, p50 ms of the 2xx) of one closed-loop h2load run."""
    run = run_h2load(h2load_command(work, protocol, gw, in_flight, f"{round(seconds * 1000)}ms",
                                    scratch / "h2load.tsv"), seconds + 120)
    try:
        summary = run.summary()
    except ValueError as err:
        raise RuntimeError(f"h2load: {run.gist()}") from err
    ok_us = run.ok_us()
    return summary.seconds, len(ok_us), percentile(ok_us, 50) / 1e3 if ok_us else math.nan


def interleaved(st: Stack, gw: GatewayProcess, scratch: Path, pair: tuple[str, str], rounds: int,
                seconds: float, in_flight: int, label: str) -> list[DetourRun]:
    """h2load against a plain model and one held in a rollout state (``pair``), after a
    warm-up (connections, HAProxy, the gRPC server), interleaved round by round in
    alternating order, per protocol; failures from the gateway's own counts."""
    works = {m: write_workload(scratch, m, np.full((1, TINY_WIDTH), 0.5, np.float32),
                               "x", "y") for m in pair}
    for protocol in PROTOCOLS:
        for work in works.values():
            h2load_run(gw, work, protocol, in_flight, 1.0, scratch)
    runs = []
    for r in range(rounds):
        for protocol in PROTOCOLS:
            for model in pair if r % 2 == 0 else pair[::-1]:
                before = settled_failed(st, model, protocol)
                took, ok, p50 = h2load_run(gw, works[model], protocol, in_flight, seconds,
                                           scratch)
                failed = round(settled_failed(st, model, protocol) - before)
                run = DetourRun(r, protocol, model == pair[1], took, max(0, ok - failed),
                                failed, p50)
                runs.append(run)
                say(f"{label} round {r + 1}/{rounds} {protocol} {model}: "
                    f"{run.per_s:.0f} req/s, p50 {p50:.2f} ms, {failed} failed")
    return runs


def measure_detour(st: Stack, rounds: int, seconds: float, in_flight: int
                   ) -> tuple[list[DetourRun], dict[str, float | None]]:
    with lifecycle(st.url) as api, lifecycle(st.url, "admin") as admin:
        return detour(st, api, admin, rounds, seconds, in_flight)


def detour(st: Stack, api: LifecycleClient, admin: LifecycleClient, rounds: int,
           seconds: float, in_flight: int) -> tuple[list[DetourRun], dict[str, float | None]]:
    gw, scratch = st.gateway, st.folder
    rollout = {"steps": [50, 100], "step_seconds": 3600, "min_requests": 10,
               "shadow": "none"}
    job_id = upload(api, DETOUR_SPLIT, affine_onnx(scratch / "detour.onnx", GOOD_SLOPE),
                    rollout, evaluation_set(False))
    say(f"detour: {DETOUR_SPLIT} uploaded (job {job_id}), waiting for its 50 % step")
    try:
        if not wait_until(lambda: percent_now(api, DETOUR_SPLIT) == 50, JOB_TIMEOUT_S, 0.2):
            raise RuntimeError(f"{DETOUR_SPLIT} never reached 50 %: "
                               f"{json.dumps(api.job(job_id))[:1500]}")
        admin.rollout_action(DETOUR_SPLIT, "pause")
        seen: dict[str, float | None] = {}
        for protocol in PROTOCOLS:
            versions = versions_seen(gw, DETOUR_SPLIT, protocol)
            seen[protocol] = sum(v == 2 for v in versions) / len(versions)
        say("detour: candidate share seen at 50 %: "
            + ", ".join(f"{p} {100 * (s or 0):.0f}%" for p, s in seen.items()))
        runs = interleaved(st, gw, scratch, (DETOUR_PLAIN, DETOUR_SPLIT), rounds, seconds,
                           in_flight, "detour")
        return runs, seen
    finally:
        with contextlib.suppress(LifecycleError, httpx.HTTPError):
            admin.rollout_action(DETOUR_SPLIT, "abort")
        with contextlib.suppress(RuntimeError, httpx.HTTPError):
            done = wait_job(api, job_id, ("succeeded", "failed"))
            say(f"detour: rollout {done.get('rollout', {}).get('state')}")


# -- run, plot, main ------------------------------------------------------------------

def run(step_seconds: float = 5.0, rounds: int = 5, seconds: float = 3.0,
        in_flight: int = 4, scenarios: Sequence[str] = SCENARIO_NAMES
        ) -> list[dict[str, Any]]:
    if shutil.which("h2load") is None:
        raise RuntimeError("h2load not found: install Debian's nghttp2-client (make system-deps)")
    started = time.monotonic()
    chosen = [s for s in SCENARIOS if s.name in scenarios]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench_rollout-") as tmp:
        scratch = Path(tmp)
        with rollout_stack(scratch, [*(s.model for s in chosen), DETOUR_PLAIN,
                                     DETOUR_SPLIT, SHADOW_HELD]) as st:
            for scenario in chosen:
                rows.append(run_scenario(st, scenario, step_seconds))
            rows += measure_shadow(st, rounds, seconds, in_flight)
            runs, seen = measure_detour(st, rounds, seconds, in_flight)
            rows += detour_rows(runs, in_flight, seen)
    say(f"measured in {time.monotonic() - started:.0f} s")
    return rows


def plot(rows: Sequence[Mapping[str, Any]], out: Path) -> list[Path]:
    scenarios = [r for r in rows if r["part"] == "scenario"]
    if not scenarios:
        return []
    cols = 2 if len(scenarios) > 1 else 1
    lines = math.ceil(len(scenarios) / cols)
    path = out / "rollout_share.png"
    with figure(path, lines, cols, squeeze=False, figsize=(6 * cols, 3.4 * lines)) as (fig, axes):
        for ax, r in zip(axes.flat, scenarios, strict=False):
            share_panel(ax, r)
        for ax in list(axes.flat)[len(scenarios):]:
            ax.set_visible(False)
        fig.suptitle(f"Rollouts, steps {scenarios[0]['steps']} % x "
                     f"{scenarios[0]['step_seconds']:g} s: the candidate's share of one "
                     "client's unversioned requests")
    return [path]


def share_panel(ax: Any, r: Mapping[str, Any]) -> None:
    """One scenario: the candidate's share per bin, the step schedule, the end, and the
    client's failures per second."""
    tl = r["timeline"]
    share = [math.nan if s is None else s for s in tl["share"]]
    centres = [t + BIN_S / 2 for t in tl["t"]]
    ax.plot(centres, share, "o-", color="tab:blue", markersize=3,
            label="candidate share (1 s bins)")
    sched_t = [0.0 if not tl["schedule"] else tl["schedule"][0][0] - LEAD_S,
               *(t for t, _ in tl["schedule"]), tl["end"], tl["end"] + TAIL_S]
    sched_p = [0.0, *(p / 100 for _, p in tl["schedule"]), tl["final_percent"] / 100,
               tl["final_percent"] / 100]
    ax.step(sched_t, sched_p, where="post", color="k", linestyle="--", linewidth=1,
            label="step schedule")
    promoted = r["outcome"] == "promoted"
    colour = "tab:green" if promoted else "tab:red"
    ax.axvline(tl["end"], color=colour, linewidth=1)
    ax.plot([tl["end"]], [tl["final_percent"] / 100], marker="*", markersize=14,
            color=colour, label="promoted" if promoted else "rolled back")
    ax.set_ylim(-0.05, 1.1)
    ax.set_xlabel("seconds since step 1 began")
    ax.set_ylabel("candidate share")
    twin = ax.twinx()
    twin.plot(centres, tl["failures_per_s"], color="tab:orange", linewidth=1.2,
              label="client failures / s")
    twin.set_ylabel("failures / s", color="tab:orange")
    top = max(5.0, max(tl["failures_per_s"], default=0) * 1.2)
    twin.set_ylim(-top * 0.05 / 1.1, top)  # its 0 level with the share's
    ax.set_title(f"{r['scenario']}: {r['outcome']} at step {r['ended_step']} "
                 f"({r['wall_s']:.1f} s of {r['planned_s']:g} planned)", fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    more, more_labels = twin.get_legend_handles_labels()
    ax.legend(handles + more, labels + more_labels, fontsize=7, loc="center left")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="3 s steps, one 3 s round per detour measurement")
    parser.add_argument("--step-seconds", type=float, default=None, help="default 5 (--quick 3)")
    parser.add_argument("--rounds", type=int, default=None, help="detour rounds (default 5; "
                        "--quick 1)")
    parser.add_argument("--seconds", type=float, default=None,
                        help="each detour h2load run (default 3; --quick 3)")
    parser.add_argument("--in-flight", type=int, default=4, help="h2load's requests in flight")
    parser.add_argument("--scenario", action="append", choices=SCENARIO_NAMES,
                        help="only this scenario (repeatable; default: all)")
    parser.add_argument("--out", type=Path, default=Path("results/rollout"))
    args = parser.parse_args(argv)
    rows = run(args.step_seconds or (3.0 if args.quick else 5.0),
               args.rounds or (1 if args.quick else 5),
               args.seconds or 3.0, args.in_flight,
               args.scenario or SCENARIO_NAMES)
    publish(rows, markdown, plot, args.out, "rollout", say)
    say(f"wrote {args.out / 'rollout.md'}")


if __name__ == "__main__":
    main()
