"""Progressive delivery's driver: a new version earns its traffic step by step, and a bad
one rolls itself back (the policy and verdict: :mod:`gateway.policy.rollout`).

:class:`Rollouts` writes each model's rollout record. :meth:`Rollouts.run` is what an
upload's job calls instead of the all-at-once activation when its model has a rollout
policy and a serving version:

1. **Side by side.** The split is set first, 0 % to the candidate (so unversioned
   requests stay pinned to stable, which Triton would not do by itself: it answers an
   unversioned request with the highest version loaded). Then every member loads the
   model with ``version_policy { specific { versions: [stable, candidate] } }``
   (:func:`side_by_side_config`), and the candidate is warmed explicitly by version.
2. **The judging** (:class:`~.rollout_stages.RolloutStages`): the gate, on the replayed
   sample before any user request (:mod:`.rollout_replay`); the shadow step, live
   requests mirrored to the candidate; the steps, each a growing share of unversioned
   requests, judged every tick. Every verdict is recorded on the rollout, and while the
   candidate has a share each tick renews the split's lease, without which the data
   planes send the model's traffic to stable by themselves.
3. **The end.** Promoted: the candidate is recorded serving (its pinned config written,
   so a restarted Triton loads it alone) and the members load it alone. Rolled back or
   aborted: the split pins everything to stable, the members load stable alone, and the
   job fails with the verdict (the job runner then removes the candidate version). The
   promotion drops the lease before it gives the candidate 100 %: that share is the
   verdict, and stable is unloading under it.

Operators pause, resume or abort a running rollout (:meth:`Rollouts.pause`,
:meth:`Rollouts.resume`, :meth:`Rollouts.abort`) and read its windows so far
(:meth:`Rollouts.status`).

A gateway that stops during a rollout ends it on the next start (:meth:`Rollouts.recover`):
recorded ``interrupted``, the split pins everything to stable, and only once every data
plane routes by that (:meth:`Rollouts.until_stable`: the local HAProxy and every replica
the feed knows, across the restart) does the start-up preload have the members serve
stable alone, unloading the candidate; the job runner's recovery removes its files.
Never a half state.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from gateway.config.rollout import RolloutSpec
from gateway.errors import Conflict, GatewayError, ModelNotFound
from gateway.lifecycle.records.store import RecordStore, RolloutRecord
from gateway.lifecycle.warmup.deploy import Deployer, StepCallback, load_on, warm_on
from gateway.lifecycle.warmup.rollout_replay import Replay, version_config
from gateway.lifecycle.warmup.rollout_stages import (
    Control,
    Outcome,
    RolloutStages,
    record_decision,
)
from gateway.policy.rollout import Split
from gateway.state import GatewayState
from gateway.upstream.triton import override_for_version

log = logging.getLogger(__name__)
# the rollout's record and its job say so (not the conversion's "worker died")
INTERRUPTED = "interrupted: the control plane restarted"
INTERRUPTED_DETAIL = (INTERRUPTED + ": stable version {stable} serves, candidate "
                      "{candidate} was removed")


@dataclass
class Rollouts:
    """Every model's rollouts: what operators ask of them, their end after a restart,
    and :meth:`run`, one rollout from loading side by side to its end."""

    deployer: Deployer
    store: RecordStore
    samples_dir: Path  # <state>/rollouts: each rollout's replay sample, while it runs
    wall_clock: Callable[[], float] = time.time  # the lease's clock (epoch seconds)
    _running: dict[str, RolloutStages] = field(default_factory=dict)  # model -> its judging
    # models whose rollout recover() ended: pinned to stable until the preload serves it
    _interrupted: set[str] = field(default_factory=set)

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
            running = self._running.get(model)
            started = running.step_started if running is not None else None
            since = started if started is not None else time.monotonic()
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

    def _ask(self, model: str, change: Callable[[Control], None],
             state: str | None) -> RolloutRecord:
        running, record = self._running.get(model), self.active(model)
        if running is None or record is None:
            raise Conflict(f"model {model!r} has no rollout in progress")
        change(running.control)
        running.control.changed.set()
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
            ended.append(record_decision(
                self.store, self.deployer.core.metrics,
                replace(record, state="interrupted", percent=0, detail=reason),
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
        if self.state.split_of(model) is not None and model not in self._running:
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
        metrics = self.deployer.core.metrics
        gauge = metrics.rollout_percent.labels(model, str(stable), str(candidate))
        stages = self._running[model] = RolloutStages(
            model, spec, samples, store=self.store, state=self.state, metrics=metrics,
            replay=Replay(self.deployer, self.store), wall_clock=self.wall_clock,
            gauge=gauge, on_step=on_step)
        self.state.tally.watch(model)
        try:
            on_step("rollout", "running", f"version {candidate} beside {stable}: loading")
            await self._side_by_side(model, stable, candidate, warm_batches)
            outcome = await stages.gate()
            if outcome is None and spec.shadow is not None:
                outcome = await stages.shadow_step()
            if outcome is None:
                outcome = await stages.steps(self.store.rollout(model) or record)
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
            record_decision(self.store, metrics, self.store.rollout(model) or record,
                            "abort", f"the rollout failed: {why}", {})
            await self._back_to_stable(model, stable, candidate, warm_batches)
            raise
        finally:
            gauge.set(0)
            self._running.pop(model, None)
            self.state.tally.forget(model)
            if samples is not None:
                samples.unlink(missing_ok=True)

    async def _side_by_side(self, model: str, stable: int, candidate: int,
                            warm_batches: Sequence[int]) -> None:
        self.state.set_split(model, Split(stable, candidate, 0))
        await self.state.settle()
        config = side_by_side_config(version_config(self.store, model, stable),
                                     version_config(self.store, model, candidate))
        batches = tuple(b for b in warm_batches if b <= max(1, config.max_batch_size)) or (1,)
        members = self.deployer.members(model)
        async with self.deployer.lock(model):
            await load_on(self.deployer.admin, model,
                          override_for_version(config, candidate, batches, also=(stable,)),
                          members, [])
            await asyncio.gather(*(warm_on(self.deployer.core, self.deployer.admin, model,
                                           candidate, config, batches, m) for m in members))

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
