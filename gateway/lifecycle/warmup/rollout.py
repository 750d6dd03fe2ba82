"""Progressive delivery: a new version earns its traffic step by step, and a bad one
rolls itself back (the policy and verdict: :mod:`gateway.policy.rollout`).

:meth:`Rollouts.run` is what an upload's job calls instead of the all-at-once
activation when its model has a rollout policy and a serving version:

1. **Side by side.** The split is set first, 0 % to the candidate (so unversioned
   requests stay pinned to stable, which Triton would not do by itself: it answers an
   unversioned request with the highest version loaded). Then every member loads the
   model with ``version_policy { specific { versions: [stable, candidate] } }``
   (:func:`side_by_side_config`), and the candidate is warmed explicitly by version.
2. **The gate.** Still at 0 %, before any user request: the replayed sample of the
   owner's evaluation set (of the synthetic inputs the converter verified on, when the
   upload had none) is sent to both versions as deployed, one sample a request,
   interleaved between the versions, for rounds until the candidate has
   ``P99_MIN_ANSWERS`` answers or ``min(step_seconds, GATE_PROBE_MAX_S)`` have passed:
   the outputs' agreement, both versions' errors and latency on the same requests
   (:func:`judge_side_by_side`). Failing it rolls the candidate back having answered
   no user.
3. **The shadow step** (``shadow:``, on by default). The split stays at 0 %; a
   :class:`Shadow` on the state has ``percent`` of the model's unversioned requests
   mirrored to the candidate (the Python forwarder sends the copies, fire-and-forget;
   HAProxy sends that share to the forwarder) and each mirrored answer compared with
   stable's answer to the user. At ``seconds`` the pairs are judged: promote to the first
   step, hold (too few mirrored requests: ``seconds`` more, at most ``SHADOW_MAX_HOLDS``
   times, then promoted for the steps to judge) or roll back; a rollback does not wait
   once ``min_requests`` pairs condemn it.
4. **Steps.** For each step the split gives the candidate its percent of unversioned
   requests. Every ``TICK_S`` the tally's windows (:class:`VersionTally`, both data
   planes record the answers of the requests they pinned) are judged; at the step's end
   the replayed sample gives the outputs' agreement. Promote
   moves on, hold keeps the step running (too few requests), rollback ends it.
5. **The end.** Promoted: the candidate is recorded serving (its pinned config written,
   so a restarted Triton loads it alone) and the members load it alone. Rolled back or
   aborted: the split pins everything to stable, the members load stable alone, and the
   job fails with the verdict (the job runner then removes the candidate version).

Every verdict (the gate's and the shadow step's: ``step`` "gate" / "shadow", ``stage``
beside it) is recorded on the rollout (SQLite, with its figures), on the job as a
step detail, in the log and as ``infergate_rollout_decisions_total``.

**The lease.** While the candidate has a share (the shadow step, the steps), every tick
(each verdict, and each tick of a pause: an operator's hold) renews the split's lease
(:meth:`GatewayState.note_verdict`); the snapshot publishes it, and a data-plane replica
that sees no fresh one within ``LEASE_S`` sends the model's traffic to stable by itself
(:func:`gateway.haproxy.snapshot.fail_safe`): a control plane that died mid-rollout leaves
no canary serving without a judge. The promotion drops the lease before it gives the
candidate 100 %: that share is the verdict, and stable is unloading under it.

A gateway that stops during a rollout ends it on the next start (:meth:`Rollouts.recover`):
recorded ``interrupted``, the split pins everything to stable, and only once every data
plane routes by that (:meth:`Rollouts.until_stable`: the local HAProxy and every replica
the feed knows, across the restart) does the start-up preload have the members serve
stable alone, unloading the candidate; the job runner's recovery removes its files.
Never a half state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import tritonclient.http as triton_http
from tritonclient.grpc import model_config_pb2 as mc

from converters.spec import TRITON_TO_NUMPY
from converters.triton_config import parse_model_config
from gateway.config.rollout import RolloutSpec
from gateway.errors import Conflict, DeployFailed, GatewayError, ModelNotFound
from gateway.lifecycle.records.store import RecordStore, RolloutRecord
from gateway.lifecycle.warmup.deploy import Deployer, StepCallback, load_on, warm_on
from gateway.policy.rollout import (
    P99_MIN_ANSWERS,
    Shadow,
    Split,
    Verdict,
    Window,
    agreement_of,
    judge,
    judge_side_by_side,
)
from gateway.pools import PoolMember
from gateway.state import GatewayState
from gateway.upstream.triton import override_for_version

log = logging.getLogger(__name__)
TICK_S = 0.25
GATE_PROBE_MAX_S = 30.0  # the gate's latency probe runs at most this long (and step_seconds)
SHADOW_MAX_HOLDS = 3  # a shadow step short of mirrored requests runs on at most this often
# the rollout's record and its job say so (not the conversion's "worker died")
INTERRUPTED = "interrupted: the control plane restarted"
INTERRUPTED_DETAIL = (INTERRUPTED + ": stable version {stable} serves, candidate "
                      "{candidate} was removed")


@dataclass
class _Control:
    """What an operator asked of a running rollout."""

    paused: bool = False
    abort: str | None = None  # why, when asked to stop
    changed: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class Outcome:
    promoted: bool
    reason: str


@dataclass
class Probe:
    """The gate's replay: both versions' windows over the same requests, and the
    agreement of their outputs (None: no sample both answered)."""

    samples: int
    stable: Window
    candidate: Window
    agreement: float | None


@dataclass
class Rollouts:
    deployer: Deployer
    store: RecordStore
    samples_dir: Path  # <state>/rollouts: each rollout's replay sample, while it runs
    wall_clock: Callable[[], float] = time.time  # the lease's clock (epoch seconds)
    _control: dict[str, _Control] = field(default_factory=dict)
    # models whose rollout recover() ended: pinned to stable until the preload serves it
    _interrupted: set[str] = field(default_factory=set)
    _step_started: dict[str, float] = field(default_factory=dict)  # model -> its window's start

    @property
    def state(self) -> GatewayState:
        return self.deployer.core.state

    # -- operators ---------------------------------------------------------------------
    def status(self, model: str) -> dict[str, Any]:
        record = self.store.rollout(model)
        if record is None:
            raise ModelNotFound(f"model {model!r} has had no rollout")
        data = record.to_json()
        if record.active:  # the running step's windows so far
            since = self._step_started.get(model, time.monotonic())
            data["window"] = {
                "stable": self.state.tally.window(model, record.stable, since).figures(),
                "candidate": self.state.tally.window(model, record.candidate,
                                                     since).figures()}
            shadow = self.state.shadow_of(model)
            if shadow is not None:  # the shadow step's pairs so far
                stable_w, candidate_w, agreement = shadow.tally.windows()
                data["shadow"] = {"percent": shadow.percent, "stable": stable_w.figures(),
                                  "candidate": candidate_w.figures(),
                                  "agreement": agreement, "skipped": shadow.tally.skipped}
        return data

    def active(self, model: str) -> RolloutRecord | None:
        record = self.store.rollout(model)
        return record if record is not None and record.active else None

    def pause(self, model: str) -> RolloutRecord:
        record = self._ask(model, lambda c: setattr(c, "paused", True), "paused")
        self.state.tally.forget(model)  # no verdict while paused: nothing to tally
        return record

    def resume(self, model: str) -> RolloutRecord:
        self.state.tally.watch(model)
        return self._ask(model, lambda c: setattr(c, "paused", False), "running")

    def abort(self, model: str, who: str) -> RolloutRecord:
        return self._ask(model, lambda c: setattr(c, "abort", f"aborted by {who}"), None)

    def _ask(self, model: str, change: Callable[[_Control], None],
             state: str | None) -> RolloutRecord:
        control, record = self._control.get(model), self.active(model)
        if control is None or record is None:
            raise Conflict(f"model {model!r} has no rollout in progress")
        change(control)
        control.changed.set()
        if state is not None and record.state != state:
            record = self.store.put_rollout(replace(record, state=state))
        return record

    # -- start-up ----------------------------------------------------------------------
    def recover(self) -> list[RolloutRecord]:
        """Rollouts a previous process left running end: recorded ``interrupted``, and
        the split pins the model to stable (no lease: nothing to fail safe from) until
        :meth:`settled`. Synchronous, before any request: the first snapshot any data
        plane gets from this process routes stable only. The candidate stays loaded
        until :meth:`until_stable` (the preload awaits it)."""
        ended = []
        for record in self.store.active_rollouts():
            reason = INTERRUPTED_DETAIL.format(stable=record.stable,
                                               candidate=record.candidate)
            ended.append(self._record(replace(record, state="interrupted", percent=0,
                                              detail=reason),
                                      "interrupted", reason, {}))
            self.state.set_split(record.model, Split(record.stable, record.candidate, 0))
            self._interrupted.add(record.model)
            log.warning("rollout of %s: %s", record.model, reason)
        return ended

    def interrupted(self, model: str) -> bool:
        """Whether :meth:`recover` ended a rollout of ``model`` that still pins it."""
        return model in self._interrupted

    async def until_stable(self, model: str) -> None:
        """For a model whose rollout :meth:`recover` ended: returns once every data
        plane routes it to stable alone (:meth:`GatewayState.settle`: the local HAProxy
        and every data-plane replica the feed knows, those that polled the previous
        process included), so that the candidate may be unloaded: a replica still on
        the old split would send its share to a version no longer there."""
        if model in self._interrupted:
            await self.state.settle()

    def settled(self, model: str) -> None:
        """The members serve one version of ``model`` again: no split needed."""
        self._interrupted.discard(model)
        if self.state.split_of(model) is not None and model not in self._control:
            self.state.set_split(model, None)

    # -- a rollout -----------------------------------------------------------------------
    async def run(self, job_id: str, model: str, stable: int, candidate: int,
                  spec: RolloutSpec, samples: Path | None, warm_batches: Sequence[int],
                  on_step: StepCallback) -> Outcome:
        """Roll ``candidate`` out against ``stable`` (both recorded in the store);
        returns whether it was promoted. A failure on the way (a member refusing to
        load) ends it with stable serving alone; cancelled (the gateway stops), it is
        left for :meth:`recover` at the next start."""
        if self.active(model) is not None:
            raise Conflict(f"model {model!r} already has a rollout in progress")
        now = time.time()
        record = self.store.put_rollout(RolloutRecord(
            job_id, model, stable, candidate, spec.model_dump(mode="json"), "running",
            now, now))
        control = self._control[model] = _Control()
        self.state.tally.watch(model)
        gauge = self.deployer.core.metrics.rollout_percent.labels(
            model, str(stable), str(candidate))
        try:
            on_step("rollout", "running", f"version {candidate} beside {stable}: loading")
            await self._side_by_side(model, stable, candidate, warm_batches)
            outcome = await self._gate(model, spec, samples, on_step)
            if outcome is None and spec.shadow is not None:
                outcome = await self._shadow_step(model, spec, control, on_step)
            if outcome is None:
                outcome = await self._steps(self.store.rollout(model) or record, spec,
                                            control, samples, gauge, on_step)
            if outcome.promoted:
                await self._promote(model, stable, candidate, warm_batches)
            else:
                await self._back_to_stable(model, stable, candidate, warm_batches)
            on_step("rollout", "done" if outcome.promoted else "failed", outcome.reason)
            return outcome
        except asyncio.CancelledError:
            raise  # the gateway stops: the record stays active, recover() ends it
        except Exception as exc:
            why = exc.message if isinstance(exc, GatewayError) else repr(exc)
            self._record(self.store.rollout(model) or record, "abort",
                         f"the rollout failed: {why}", {})
            await self._back_to_stable(model, stable, candidate, warm_batches)
            raise
        finally:
            gauge.set(0)
            self._control.pop(model, None)
            self._step_started.pop(model, None)
            self.state.tally.forget(model)
            if samples is not None:
                samples.unlink(missing_ok=True)

    async def _side_by_side(self, model: str, stable: int, candidate: int,
                            warm_batches: Sequence[int]) -> None:
        self.state.set_split(model, Split(stable, candidate, 0))
        await self.state.settle()
        config = side_by_side_config(self._config(model, stable),
                                     self._config(model, candidate))
        batches = tuple(b for b in warm_batches if b <= max(1, config.max_batch_size)) or (1,)
        members = self.deployer.members(model)
        async with self.deployer.lock(model):
            await load_on(self.deployer.admin, model,
                          override_for_version(config, candidate, batches, also=(stable,)),
                          members, [])
            await asyncio.gather(*(warm_on(self.deployer.core, self.deployer.admin, model,
                                           candidate, config, batches, m) for m in members))

    def _config(self, model: str, version: int) -> mc.ModelConfig:
        target = self.store.version(model, version)
        if target is None:
            raise ModelNotFound(f"model {model!r} has no version {version}")
        return parse_model_config(target.config)

    async def _steps(self, record: RolloutRecord, spec: RolloutSpec, control: _Control,
                     samples: Path | None, gauge: Any, on_step: StepCallback) -> Outcome:
        model, stable, candidate = record.model, record.stable, record.candidate
        tally, baseline = self.state.tally, None
        for index, percent in enumerate(spec.steps):
            record = await self._set_percent(record, index, percent, gauge)
            on_step("rollout", "running", f"step {index + 1} of {len(spec.steps)}: "
                    f"{percent}% to version {candidate}")
            started = time.monotonic()
            self._step_started[model] = started
            verdict_at = spec.step_seconds  # a hold moves it on by one more step's length
            while True:
                if control.abort is not None:
                    self._record(record, "abort", control.abort, {})
                    return Outcome(False, control.abort)
                if control.paused:
                    await self._paused(model, control)
                    started = self._step_started[model] = time.monotonic()  # a fresh window
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
                    agreement = await self.agreement(model, stable, candidate, samples, spec)
                decision = judge(spec, baseline, candidate_w, agreement, step_over)
                self._renew(model)
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
                await self._wait(control, TICK_S)
        return Outcome(True, f"version {candidate} promoted through steps "
                       f"{list(spec.steps)}")

    # -- before any user: the gate and the shadow step --------------------------------------
    async def _gate(self, model: str, spec: RolloutSpec, samples: Path | None,
                    on_step: StepCallback) -> Outcome | None:
        """The candidate judged on the replayed samples before any user request: an
        Outcome when rolled back, None when it passes."""
        record = self.store.rollout(model)
        assert record is not None
        figures: dict[str, Any] = {"step": "gate", "stage": "gate", "percent": 0}
        if samples is None:
            self._record(record, Verdict.PROMOTE.value, "no samples to replay "
                         "(agreement_samples: 0): the gate judged nothing", figures)
            return None
        on_step("rollout", "running", f"gate: version {record.candidate} against "
                f"{record.stable} on the replayed samples, before any user request")
        started = time.monotonic()
        probe = await self.probe(model, record.stable, record.candidate, samples, spec)
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

    async def _shadow_step(self, model: str, spec: RolloutSpec, control: _Control,
                           on_step: StepCallback) -> Outcome | None:
        """Live requests answered by stable and mirrored to the candidate, compared
        pair by pair: an Outcome when rolled back (or aborted), None when promoted to
        the first step."""
        record = self.store.rollout(model)
        assert record is not None and spec.shadow is not None
        shadow = Shadow(record.stable, record.candidate, spec.shadow.percent,
                        _metric(self.store, model), spec.shadow.max_in_flight)
        seconds, need = spec.shadow_seconds, spec.shadow_min_requests
        detail = (f"shadow step: {shadow.percent}% of live requests mirrored to version "
                  f"{shadow.candidate}, users answered by {shadow.stable}")
        record = self.store.put_rollout(replace(record, detail=detail))
        self._renew(model)  # the lease before the share: never a share without one
        self.state.set_shadow(model, shadow)
        await self.state.settle()  # both planes mirror from now on
        on_step("rollout", "running", detail)
        try:
            started = self._step_started[model] = time.monotonic()
            verdict_at, holds = seconds, 0
            while True:
                if control.abort is not None:
                    self._record(record, "abort", control.abort, {})
                    return Outcome(False, control.abort)
                if control.paused:
                    await self._paused(model, control)
                    shadow.tally.clear()  # a fresh window
                    started = self._step_started[model] = time.monotonic()
                    verdict_at, holds = seconds, 0
                    record = self.store.rollout(model) or record
                    continue
                elapsed = time.monotonic() - started
                stable_w, candidate_w, agreement = shadow.tally.windows()
                decision = judge_side_by_side(
                    spec, stable_w, candidate_w, agreement, min_requests=need,
                    over=elapsed >= verdict_at, final=holds >= SHADOW_MAX_HOLDS)
                self._renew(model)
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
                await self._wait(control, TICK_S)
        finally:
            self.state.set_shadow(model, None)

    async def _wait(self, control: _Control, timeout_s: float | None = None) -> None:
        control.changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(control.changed.wait(), timeout_s)

    async def _paused(self, model: str, control: _Control) -> None:
        """Until resumed or aborted. No verdict meanwhile, but the lease is renewed
        every tick all the same: the operator's hold is the verdict, and the control
        plane is there to lift it; were it gone, the replicas fail safe."""
        while control.paused and control.abort is None:
            self._renew(model)
            await self._wait(control, TICK_S)

    def _renew(self, model: str) -> None:
        """The split's lease runs from now (:meth:`GatewayState.note_verdict`)."""
        self.state.note_verdict(model, self.wall_clock())

    async def _set_percent(self, record: RolloutRecord, index: int, percent: int,
                           gauge: Any) -> RolloutRecord:
        self._renew(record.model)  # the lease before the share: never a share without one
        self.state.set_split(record.model, Split(record.stable, record.candidate, percent))
        await self.state.settle()  # the step is on record once both planes route by it
        gauge.set(percent)
        return self.store.put_rollout(replace(record, step=index, percent=percent))

    def _record(self, record: RolloutRecord, decision: str, reason: str,
                figures: dict[str, Any]) -> RolloutRecord:
        """A verdict (or an operator's stop) on the rollout, in the log and as a metric."""
        entry = {"at": time.time(), "decision": decision, "reason": reason, **figures}
        log.info("rollout of %s (%d -> %d): %s: %s %s", record.model, record.stable,
                 record.candidate, decision, reason, figures)
        self.deployer.core.metrics.rollout_decisions.labels(record.model, decision).inc()
        state = {"rollback": "rolled_back", "abort": "aborted"}.get(decision, record.state)
        return self.store.put_rollout(replace(record, decisions=(*record.decisions, entry),
                                              state=state, detail=reason))

    # -- the end -------------------------------------------------------------------------
    async def _promote(self, model: str, stable: int, candidate: int,
                       warm_batches: Sequence[int]) -> None:
        # the verdict is final: no replica may send this share back to stable, which
        # the activation below unloads
        self.state.note_verdict(model, None)
        self.state.set_split(model, Split(stable, candidate, 100))
        await self.state.settle()
        async with self.deployer.lock(model):
            await self.deployer.activate(model, candidate, warm_batches)
        self.state.set_split(model, None)
        await self.state.settle()
        record = self.store.rollout(model)
        if record is not None:
            self.store.put_rollout(replace(record, state="promoted", percent=100))

    async def _back_to_stable(self, model: str, stable: int, candidate: int,
                              warm_batches: Sequence[int]) -> None:
        """Everything pinned to stable, then the members serve stable alone."""
        self.state.note_verdict(model, None)  # no share left to fail safe from
        self.state.set_split(model, Split(stable, candidate, 0))
        await self.state.settle()
        try:
            async with self.deployer.lock(model):
                await self.deployer.activate(model, stable, warm_batches)
        except GatewayError as exc:  # the split keeps stable serving meanwhile
            log.error("rollout of %s: members could not go back to version %d alone: %s",
                      model, stable, exc.message)
            return
        self.state.set_split(model, None)
        await self.state.settle()

    # -- agreement -------------------------------------------------------------------------
    async def agreement(self, model: str, stable: int, candidate: int, samples: Path,
                        spec: RolloutSpec) -> float:
        """The evaluation sample replayed to both versions as deployed (a member of the
        model's pools, by version): the share of equal top-1 classes when the owner's
        budget speaks of top-1, else the mean cosine of the first output."""
        config = self._config(model, candidate)
        with np.load(samples) as data:
            arrays = {name: data[name] for name in data.files}
        metric = _metric(self.store, model)
        member = self.deployer.members(model)[0]
        outputs = [await self._replay(model, version, config, arrays, member)
                   for version in (stable, candidate)]
        return agreement_of(outputs[0], outputs[1], metric)

    async def probe(self, model: str, stable: int, candidate: int, samples: Path,
                    spec: RolloutSpec) -> Probe:
        """The gate's replay: each sample a request of its own to both versions as
        deployed (a member of the model's pools, by version), the versions interleaved
        (which goes first alternates), in rounds until the candidate has
        ``P99_MIN_ANSWERS`` answers or ``min(step_seconds, GATE_PROBE_MAX_S)`` passed
        (one round at least). Failures are counted, not raised: they are the verdict's."""
        config = self._config(model, candidate)
        with np.load(samples) as data:
            arrays = {name: data[name] for name in data.files}
        count = len(next(iter(arrays.values()))) if arrays else 0
        member = self.deployer.members(model)[0]
        bodies = [_body(config, arrays, i, i + 1) for i in range(count)]
        output = config.output[0].name
        answers: dict[int, list[tuple[bool, float]]] = {stable: [], candidate: []}
        outputs: dict[int, list[np.ndarray | None]] = {stable: [None] * count,
                                                        candidate: [None] * count}
        ends = time.monotonic() + min(spec.step_seconds, GATE_PROBE_MAX_S)
        rounds = 0
        while True:
            for i, (body, headers) in enumerate(bodies):
                first_stable = (i + rounds) % 2 == 0
                for version in (stable, candidate) if first_stable else (candidate, stable):
                    began = time.perf_counter()
                    status, answer = await self._send(model, version, member, body, headers)
                    answers[version].append((status == 200, time.perf_counter() - began))
                    if rounds == 0 and status == 200:
                        with contextlib.suppress(Exception):  # undecodable: not compared
                            outputs[version][i] = np.asarray(
                                triton_http.InferenceServerClient.parse_response_body(
                                    answer).as_numpy(output))
            rounds += 1
            if not count or len(answers[candidate]) >= P99_MIN_ANSWERS or \
                    time.monotonic() >= ends:
                break
        pairs = [(a, b) for a, b in zip(outputs[stable], outputs[candidate], strict=True)
                 if a is not None and b is not None]
        agreement = agreement_of(
            [row for a, _ in pairs for row in a.reshape(len(a), -1)],
            [row for _, b in pairs for row in b.reshape(len(b), -1)],
            _metric(self.store, model)) if pairs else None
        return Probe(count, Window.of(answers[stable]), Window.of(answers[candidate]),
                     agreement)

    async def _send(self, model: str, version: int, member: PoolMember, body: bytes,
                    headers: dict[str, str]) -> tuple[int, bytes]:
        admin = self.deployer.admin

        async def call(m: PoolMember) -> tuple[int, bytes]:
            return await admin.infer(m, model, version, body, headers)

        try:
            return await self.deployer.core.telemetry.synthetic(
                model, member, call, protocol="http", traffic="rollout",
                outcome=lambda r: "success" if r[0] == 200 else "upstream_error")
        except GatewayError as err:  # the member did not answer: a failure of this version
            return 503, err.message.encode()

    async def _replay(self, model: str, version: int, config: mc.ModelConfig,
                      arrays: dict[str, np.ndarray], member: PoolMember) -> list[np.ndarray]:
        count = len(next(iter(arrays.values())))
        step = max(1, config.max_batch_size)
        per_sample: list[np.ndarray] = []
        admin = self.deployer.admin
        for start in range(0, count, step):
            body, headers = _body(config, arrays, start, start + step)

            async def call(m: PoolMember, body: bytes = body,
                           headers: dict[str, str] = headers) -> tuple[int, bytes]:
                return await admin.infer(m, model, version, body, headers)

            status, answer = await self.deployer.core.telemetry.synthetic(
                model, member, call, protocol="http", traffic="rollout",
                outcome=lambda r: "success" if r[0] == 200 else "upstream_error")
            if status != 200:
                raise DeployFailed(f"replaying the evaluation sample to version {version} "
                                   f"answered {status}: {answer[:2000].decode(errors='replace')}")
            output = triton_http.InferenceServerClient.parse_response_body(answer).as_numpy(
                config.output[0].name)
            per_sample.extend(np.asarray(output).reshape(len(output), -1))
        return per_sample


def _body(config: mc.ModelConfig, arrays: dict[str, np.ndarray], start: int,
          end: int) -> tuple[bytes, dict[str, str]]:
    """An infer request of samples ``start:end`` (binary tensors in, the first output
    as JSON out: the answer is one JSON object, no binary part to frame)."""
    inputs = []
    for tensor in config.input:
        batch = arrays[tensor.name][start:end]
        datatype = mc.DataType.Name(tensor.data_type).removeprefix("TYPE_")
        item = triton_http.InferInput(tensor.name, list(batch.shape), datatype)
        item.set_data_from_numpy(batch.astype(TRITON_TO_NUMPY[datatype]), binary_data=True)
        inputs.append(item)
    wanted = [triton_http.InferRequestedOutput(config.output[0].name, binary_data=False)]
    body, json_size = triton_http.InferenceServerClient.generate_request_body(
        inputs, outputs=wanted)
    headers = {"Content-Type": "application/octet-stream"}
    if json_size is not None:
        headers["Inference-Header-Content-Length"] = str(json_size)
    return body, headers


def side_by_side_config(stable: mc.ModelConfig, candidate: mc.ModelConfig) -> mc.ModelConfig:
    """Triton keeps one config per model, so both versions run under one: stable's
    scheduling (dynamic batching, instance groups, warm-up), which the traffic's majority
    keeps, with the candidate's backend parameters (runtime settings its variant may need,
    e.g. the optimizers an FP16 variant must run without). A candidate for another
    backend or with other tensors fails to load: the rollout ends, stable serving."""
    config = mc.ModelConfig()
    config.CopyFrom(stable)
    config.parameters.clear()
    for key, value in candidate.parameters.items():
        config.parameters[key].CopyFrom(value)
    return config


def _metric(store: RecordStore, model: str) -> Literal["top1", "cosine"]:
    """top-1 when the model's latest upload budgeted top-1, else cosine."""
    for job in store.jobs(model, limit=5):
        budget = (job.spec or {}).get("accuracy_budget") or {}
        if budget.get("max_top1_drop") is not None:
            return "top1"
        if job.spec:
            break
    return "cosine"


