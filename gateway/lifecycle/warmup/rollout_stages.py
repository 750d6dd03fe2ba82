"""A rollout's judging: the stages in which a candidate loaded beside stable earns its
traffic or is rolled back (:class:`RolloutStages`, one a rollout, which
:meth:`gateway.lifecycle.warmup.rollout.Rollouts.run` drives between loading both versions
and the end; the verdicts: :mod:`gateway.policy.rollout`). Each stage returns an
:class:`Outcome` when it ends the rollout:

1. **The gate.** Still at 0 %, before any user request: the replayed sample of the
   owner's evaluation set (of the synthetic inputs the converter verified on, when the
   upload had none) is sent to both versions as deployed, one sample a request,
   interleaved between the versions, for rounds until the candidate has
   ``P99_MIN_ANSWERS`` answers or ``min(step_seconds, GATE_PROBE_MAX_S)`` have passed
   (:meth:`Replay.probe`): the outputs' agreement, both versions' errors and latency on
   the same requests (:func:`judge_side_by_side`). Failing it rolls the candidate back
   having answered no user.
2. **The shadow step** (``shadow:``, on by default). The split stays at 0 %; a
   :class:`Shadow` on the state has ``percent`` of the model's unversioned requests
   mirrored to the candidate (the Python forwarder sends the copies, fire-and-forget;
   HAProxy sends that share to the forwarder) and each mirrored answer compared with
   stable's answer to the user. At ``seconds`` the pairs are judged: promote to the first
   step, hold (too few mirrored requests: ``seconds`` more, at most ``SHADOW_MAX_HOLDS``
   times, then promoted for the steps to judge) or roll back; a rollback does not wait
   once ``min_requests`` pairs condemn it.
3. **Steps.** For each step the split gives the candidate its percent of unversioned
   requests. Every ``TICK_S`` the tally's windows (:class:`VersionTally`, both data
   planes record the answers of the requests they pinned) are judged; at the step's end
   the replayed sample gives the outputs' agreement (:meth:`Replay.agreement`). Promote
   moves on, hold keeps the step running (too few requests), rollback ends it.

An operator's asks reach the running stage through its :class:`Control`: a pause holds
it (no verdict meanwhile; on resuming, a fresh window), an abort ends it.

Every verdict (the gate's and the shadow step's: ``step`` "gate" / "shadow", ``stage``
beside it) is recorded on the rollout (SQLite, with its figures), on the job as a
step detail, in the log and as ``infergate_rollout_decisions_total``
(:func:`record_decision`).

**The lease.** While the candidate has a share (the shadow step, the steps), every tick
(each verdict, and each tick of a pause: an operator's hold) renews the split's lease
(:meth:`GatewayState.note_verdict`); the snapshot publishes it, and a data-plane replica
that sees no fresh one within ``LEASE_S`` sends the model's traffic to stable by itself
(:func:`gateway.haproxy.snapshot.fail_safe`): a control plane that died mid-rollout leaves
no canary serving without a judge. The lease comes before the share: never a share
without one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gateway.config.rollout import RolloutSpec
from gateway.lifecycle.records.store import RecordStore, RolloutRecord
from gateway.lifecycle.warmup.deploy import StepCallback
from gateway.lifecycle.warmup.rollout_replay import Replay, agreement_metric
from gateway.metrics import GatewayMetrics
from gateway.policy.rollout import Shadow, Split, Verdict, judge, judge_side_by_side
from gateway.state import GatewayState

log = logging.getLogger(__name__)
TICK_S = 0.25
SHADOW_MAX_HOLDS = 3  # a shadow step short of mirrored requests runs on at most this often


@dataclass
class Control:
    """What an operator asked of a running rollout."""

    paused: bool = False
    abort: str | None = None  # why, when asked to stop
    changed: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class Outcome:
    promoted: bool
    reason: str


@dataclass
class RolloutStages:
    """One rollout's gate, shadow step and steps, over the record in ``store``."""

    model: str
    spec: RolloutSpec
    samples: Path | None  # the replay sample; None: the gate judges nothing
    store: RecordStore
    state: GatewayState
    metrics: GatewayMetrics
    replay: Replay
    wall_clock: Callable[[], float]  # the lease's clock (epoch seconds)
    gauge: Any  # the candidate's percent, as a metric
    on_step: StepCallback
    control: Control = field(default_factory=Control)
    step_started: float | None = None  # the running window's start (monotonic)

    # -- before any user: the gate and the shadow step --------------------------------------
    async def gate(self) -> Outcome | None:
        """The candidate judged on the replayed samples before any user request: an
        Outcome when rolled back, None when it passes."""
        model, spec, on_step = self.model, self.spec, self.on_step
        record = self.store.rollout(model)
        assert record is not None
        figures: dict[str, Any] = {"step": "gate", "stage": "gate", "percent": 0}
        if self.samples is None:
            self._record(record, Verdict.PROMOTE.value, "no samples to replay "
                         "(agreement_samples: 0): the gate judged nothing", figures)
            return None
        on_step("rollout", "running", f"gate: version {record.candidate} against "
                f"{record.stable} on the replayed samples, before any user request")
        started = time.monotonic()
        probe = await self.replay.probe(model, record.stable, record.candidate,
                                        self.samples, spec)
        decision = judge_side_by_side(spec, probe.stable, probe.candidate, probe.agreement,
                                      min_requests=probe.samples, over=True, final=True)
        assert decision is not None  # over and final: always a verdict
        decision.figures.update(figures, samples=probe.samples,
                                seconds=round(time.monotonic() - started, 1))
        self._record(record, decision.verdict.value, decision.reason, decision.figures)
        on_step("rollout", "running", f"gate: {decision.verdict.value}: {decision.reason}")
        if decision.verdict is Verdict.ROLLBACK:
            return Outcome(False, f"rejected at the gate, before any user request: "
                           f"{decision.reason}")
        return None

    async def shadow_step(self) -> Outcome | None:
        """Live requests answered by stable and mirrored to the candidate, compared
        pair by pair: an Outcome when rolled back (or aborted), None when promoted to
        the first step."""
        model, spec, control, on_step = self.model, self.spec, self.control, self.on_step
        record = self.store.rollout(model)
        assert record is not None and spec.shadow is not None
        shadow = Shadow(record.stable, record.candidate, spec.shadow.percent,
                        agreement_metric(self.store, model), spec.shadow.max_in_flight)
        seconds, need = spec.shadow_seconds, spec.shadow_min_requests
        detail = (f"shadow step: {shadow.percent}% of live requests mirrored to version "
                  f"{shadow.candidate}, users answered by {shadow.stable}")
        record = self.store.put_rollout(replace(record, detail=detail))
        self._renew()  # the lease before the share: never a share without one
        self.state.set_shadow(model, shadow)
        await self.state.settle()  # both planes mirror from now on
        on_step("rollout", "running", detail)
        try:
            started = self.step_started = time.monotonic()
            verdict_at, holds = seconds, 0
            while True:
                if control.abort is not None:
                    self._record(record, "abort", control.abort, {})
                    return Outcome(False, control.abort)
                if control.paused:
                    await self._paused()
                    shadow.tally.clear()  # a fresh window
                    started = self.step_started = time.monotonic()
                    verdict_at, holds = seconds, 0
                    record = self.store.rollout(model) or record
                    continue
                elapsed = time.monotonic() - started
                stable_w, candidate_w, agreement = shadow.tally.windows()
                decision = judge_side_by_side(
                    spec, stable_w, candidate_w, agreement, min_requests=need,
                    over=elapsed >= verdict_at, final=holds >= SHADOW_MAX_HOLDS)
                self._renew()
                if decision is not None:
                    decision.figures.update(step="shadow", stage="shadow", percent=0,
                                            mirror_percent=shadow.percent,
                                            skipped=shadow.tally.skipped,
                                            seconds=round(elapsed, 1))
                    record = self._record(record, decision.verdict.value, decision.reason,
                                          decision.figures)
                    on_step("rollout", "running",
                            f"shadow step: {decision.verdict.value}: {decision.reason}")
                    if decision.verdict is Verdict.ROLLBACK:
                        return Outcome(False, "rolled back in the shadow step, before any "
                                       f"user answer: {decision.reason}")
                    if decision.verdict is Verdict.PROMOTE:
                        return None
                    holds += 1
                    verdict_at = elapsed + seconds  # hold: the window keeps going
                await self._wait(TICK_S)
        finally:
            self.state.set_shadow(model, None)

    # -- on a share of user requests: the steps ------------------------------------------
    async def steps(self, record: RolloutRecord) -> Outcome:
        """Each step's percent to the candidate, judged every tick until promoted (the
        next step; after the last, the rollout's promotion), rolled back or aborted."""
        spec, control, on_step, samples = self.spec, self.control, self.on_step, self.samples
        model, stable, candidate = record.model, record.stable, record.candidate
        tally, baseline = self.state.tally, None
        for index, percent in enumerate(spec.steps):
            record = await self._set_percent(record, index, percent)
            on_step("rollout", "running", f"step {index + 1} of {len(spec.steps)}: "
                    f"{percent}% to version {candidate}")
            started = time.monotonic()
            self.step_started = started
            verdict_at = spec.step_seconds  # a hold moves it on by one more step's length
            while True:
                if control.abort is not None:
                    self._record(record, "abort", control.abort, {})
                    return Outcome(False, control.abort)
                if control.paused:
                    await self._paused()
                    started = self.step_started = time.monotonic()  # a fresh window
                    verdict_at = spec.step_seconds
                    record = self.store.rollout(model) or record
                    continue
                elapsed = time.monotonic() - started
                candidate_w = tally.window(model, candidate, started)
                stable_w = tally.window(model, stable, started)
                if stable_w.requests >= max(1, spec.min_requests // 2):
                    baseline = stable_w  # enough to compare with; else the last step's
                step_over = elapsed >= verdict_at
                agreement = None
                if step_over and samples is not None:
                    agreement = await self.replay.agreement(model, stable, candidate,
                                                            samples, spec)
                decision = judge(spec, baseline, candidate_w, agreement, step_over)
                self._renew()
                if decision is not None:
                    decision.figures.update(step=index + 1, stage="step", percent=percent,
                                            seconds=round(elapsed, 1))
                    record = self._record(record, decision.verdict.value, decision.reason,
                                          decision.figures)
                    on_step("rollout", "running", f"step {index + 1}: "
                            f"{decision.verdict.value}: {decision.reason}")
                    if decision.verdict is Verdict.ROLLBACK:
                        return Outcome(False, f"rolled back at step {index + 1} ({percent}%):"
                                       f" {decision.reason}")
                    if decision.verdict is Verdict.PROMOTE:
                        break
                    verdict_at = elapsed + spec.step_seconds  # hold: the window keeps going
                await self._wait(TICK_S)
        return Outcome(True, f"version {candidate} promoted through steps "
                       f"{list(spec.steps)}")

    # -- ticks, pauses and the lease ------------------------------------------------------
    async def _wait(self, timeout_s: float | None = None) -> None:
        self.control.changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.control.changed.wait(), timeout_s)

    async def _paused(self) -> None:
        """Until resumed or aborted. No verdict meanwhile, but the lease is renewed
        every tick all the same: the operator's hold is the verdict, and the control
        plane is there to lift it; were it gone, the replicas fail safe."""
        while self.control.paused and self.control.abort is None:
            self._renew()
            await self._wait(TICK_S)

    def _renew(self) -> None:
        """The split's lease runs from now (:meth:`GatewayState.note_verdict`)."""
        self.state.note_verdict(self.model, self.wall_clock())

    async def _set_percent(self, record: RolloutRecord, index: int,
                           percent: int) -> RolloutRecord:
        self._renew()  # the lease before the share: never a share without one
        self.state.set_split(record.model, Split(record.stable, record.candidate, percent))
        await self.state.settle()  # the step is on record once both planes route by it
        self.gauge.set(percent)
        return self.store.put_rollout(replace(record, step=index, percent=percent))

    def _record(self, record: RolloutRecord, decision: str, reason: str,
                figures: dict[str, Any]) -> RolloutRecord:
        return record_decision(self.store, self.metrics, record, decision, reason, figures)


def record_decision(store: RecordStore, metrics: GatewayMetrics, record: RolloutRecord,
                    decision: str, reason: str, figures: dict[str, Any]) -> RolloutRecord:
    """A verdict (or an operator's stop) on the rollout, in the log and as a metric."""
    entry = {"at": time.time(), "decision": decision, "reason": reason, **figures}
    log.info("rollout of %s (%d -> %d): %s: %s %s", record.model, record.stable,
             record.candidate, decision, reason, figures)
    metrics.rollout_decisions.labels(record.model, decision).inc()
    state = {"rollback": "rolled_back", "abort": "aborted"}.get(decision, record.state)
    return store.put_rollout(replace(record, decisions=(*record.decisions, entry),
                                     state=state, detail=reason))
