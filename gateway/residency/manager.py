"""The residency, carried out: what each member of a pool with a memory budget holds,
changed by the policy's plan each round and by misses.

Once per round (:meth:`Residency.round`):
1. **What the members hold**, from each one's repository index (Triton's own word:
   a Triton that restarted empty, or a model a deploy loaded, is seen here);
2. **demand**, from the request counters (:class:`~gateway.residency.demand.DemandMeter`);
3. **the plan** (:func:`gateway.policy.residency.plan`) over what is held, footprints,
   budgets and demand: its evictions, then its loads (``loads_per_member`` at once).

A **miss** (a request for a model no member holds) waits in the pool's waiting room
(:meth:`Residency.wait`) while the model loads on the member
:func:`~gateway.policy.residency.place_miss` picks; a load that fails marks the model
failed on that member with the reason and tries one other member; then the waiting
requests get the error.

**A load**: the loader (the lifecycle's serving version pinned, else the repository's
config) loads and warms it; only then is the member added to the model's holders
(:meth:`GatewayState.set_holders`) and the data planes follow (``settle``).
**An eviction** loses nothing: the member leaves the model's holders first, both data
planes follow, the requests of the model in flight there end (every data plane's count,
:meth:`GatewayState.in_flight_at`), then Triton unloads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.config import GatewayConfig
from gateway.config.residency import ResidencySpec
from gateway.core import Core
from gateway.errors import (
    Conflict,
    GatewayError,
    InvalidInput,
    ModelNotFound,
    ModelNotReady,
    Unavailable,
)
from gateway.policy import residency as policy
from gateway.pools import Pool, PoolMember
from gateway.residency.demand import DemandMeter
from gateway.residency.footprints import Footprints
from gateway.residency.metrics import ResidencyMetrics
from gateway.state import GatewayState
from gateway.upstream.triton import MemberAdmin

log = logging.getLogger(__name__)

LoadOne = Callable[[PoolMember, str], Awaitable[None]]
EVICT_DRAIN_S = 60.0  # in-flight requests of an evicted model get this long to end
RECORD_EVERY_S = 10.0  # demand written to its file this often
ROOM_POLL_S = 0.1  # a miss no member has room for looks again this often
READY = "READY"


@dataclass
class Holding:
    """One model on one member, as the residency knows it."""

    state: str  # "loading" | "resident" | "evicting" | "failed"
    since: float  # when it entered that state (a load: when it started)
    reason: str = ""  # why (a load's or an eviction's reason, a failure's message)


class _NoRoom(Exception):
    """No member can take a missed model now."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.message, self.retry_after_s = message, retry_after_s


@dataclass
class _Miss:
    """A model loading for the requests that missed it: their shared outcome."""

    done: asyncio.Future[None]
    member: str
    started: float


@dataclass
class Residency:
    core: Core
    admin: MemberAdmin
    load_one: LoadOne  # loads and warms one model on one member (the warm-up's loader)
    footprints: Footprints
    demand: DemandMeter
    metrics: ResidencyMetrics
    held: dict[str, dict[str, Holding]] = field(default_factory=dict)  # member -> model ->
    repository: dict[str, set[str]] = field(default_factory=dict)  # pool -> models Triton has
    waiting: dict[str, int] = field(default_factory=dict)  # model -> requests waiting
    _misses: dict[str, _Miss] = field(default_factory=dict)
    _tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    _recorded_at: float = field(default=float("-inf"))
    _load_seconds: dict[str, float] = field(default_factory=dict)  # model -> last load took
    _published: set[str] = field(default_factory=set)  # models whose holders the state has
    _removed: dict[tuple[str, str], float] = field(default_factory=dict)  # (member, model)
    _load_slots: dict[str, asyncio.Semaphore] = field(default_factory=dict)  # per member

    @property
    def state(self) -> GatewayState:
        return self.core.state

    def pools(self) -> list[Pool]:
        return [p for p in self.state.pools if p.spec.residency is not None]

    @staticmethod
    def spec(pool: Pool) -> ResidencySpec:
        assert pool.spec.residency is not None
        return pool.spec.residency

    def knobs(self, pool: Pool) -> policy.ResidencyKnobs:
        spec = self.spec(pool)
        return policy.ResidencyKnobs(min_resident_s=spec.min_resident_s,
                                     rps_per_replica=spec.rps_per_replica,
                                     failed_retry_s=spec.failed_retry_s)

    def pool_of(self, model: str) -> Pool | None:
        """The pool with residency that serves ``model`` (the first, when several do)."""
        return next((p for p in self.state.pools_for(model) if p.spec.residency), None)

    def models(self, pool: Pool) -> list[str]:
        """The models ``pool`` may hold: those it names, or (``*``) those its members'
        repository has, that the gateway routes to it."""
        named = [m for m in pool.spec.models if m != "*"]
        known = set(named) if "*" not in pool.spec.models else (
            self.repository.get(pool.name, set()) | set(named))
        return sorted(m for m in known if pool in self.state.pools_for(m))

    # -- the view the policy decides over ----------------------------------------------------
    def min_replicas(self, pool: Pool, model: str) -> int:
        configured = self.state.config.models.get(model)
        members = len(pool.members)
        if configured is not None and configured.min_replicas is not None:
            wanted = min(configured.min_replicas, members)
        elif configured is not None and configured.on_demand:
            wanted = 0
        else:
            wanted = members  # pinned everywhere: the behaviour without residency
        if self.state.split_of(model) is not None:  # a rollout needs it somewhere
            wanted = max(wanted, 1)
        return wanted

    def view(self, pool: Pool, now: float) -> policy.ResidencyView:
        last_used = self.state.last_used()
        models = tuple(
            policy.ModelView(name=m, footprint_bytes=self.footprints.bytes(m, pool),
                             min_replicas=self.min_replicas(pool, m),
                             demand_rps=self.demand.rate(m), last_used=last_used.get(m))
            for m in self.models(pool))
        members = tuple(self._member_view(pool, m, now) for m in pool.members)
        return policy.ResidencyView(now=now, models=models, members=members)

    def _member_view(self, pool: Pool, member: PoolMember, now: float) -> policy.MemberView:
        holdings = self.held.get(member.key, {})
        return policy.MemberView(
            key=member.key, budget_bytes=self.spec(pool).usable_bytes,
            available=member.available(now) and member.healthy,
            held={m: h.since for m, h in holdings.items() if h.state != "failed"},
            failed={m: h.since for m, h in holdings.items() if h.state == "failed"},
            draining=frozenset(m for m, h in holdings.items() if h.state == "evicting"))

    def used_bytes(self, pool: Pool, member: PoolMember) -> int:
        return sum(self.footprints.bytes(m, pool) for m, h in
                   self.held.get(member.key, {}).items() if h.state != "failed")

    # -- what the members hold -------------------------------------------------------------
    async def reconcile(self, pool: Pool) -> None:
        """Each available member's repository index -> what it holds: a model READY there
        that the residency did not load is adopted (a deploy loaded it, or a gateway
        before this one); one it holds that Triton no longer has ready is dropped (the
        member restarted, or the model failed)."""
        now = fetched = self.state.clock()
        members = [m for m in pool.members if m.healthy]
        indexes = await asyncio.gather(*(self._index(m) for m in members))
        now = self.state.clock()
        changed: set[str] = set()
        for member, index in zip(members, indexes, strict=True):
            if index is None:
                continue
            self.repository.setdefault(pool.name, set()).update(index)
            holdings = self.held.setdefault(member.key, {})
            ready = {name for name, state in index.items() if state == READY}
            for model in list(holdings):
                held = holdings[model]
                # (a holding that changed since the index was read is newer than it)
                if held.state == "resident" and model not in ready and held.since < fetched:
                    log.warning("%s no longer has %s ready (restarted?): dropped", member.key,
                                model)
                    del holdings[model]
                    changed.add(model)
            for model in ready - holdings.keys():
                if self._removed.get((member.key, model), float("-inf")) >= fetched:
                    continue  # unloaded since the index was read
                if pool in self.state.pools_for(model):
                    holdings[model] = Holding("resident", now, "found loaded")
                    changed.add(model)
        # every model the pool may hold has a route of its own (HAProxy: its backend),
        # held or not: a request for one held nowhere is a miss, not an unknown model
        changed |= set(self.models(pool)) - self._published
        for model in changed:
            self._publish(model)

    async def _index(self, member: PoolMember) -> dict[str, str] | None:
        try:
            answer = await self.admin.repository_index(member)
        except GatewayError as exc:
            log.info("repository index of %s: %s", member.key, exc.message)
            return None
        states: dict[str, str] = {}
        for entry in answer:  # an entry per version: READY if any version is
            name = str(entry.get("name", ""))
            if name and states.get(name) != READY:
                states[name] = str(entry.get("state", ""))
        return states

    def _publish(self, model: str) -> None:
        """The model's holders in the gateway's state: the members it is resident on."""
        self._published.add(model)
        self.state.set_holders(model, [key for key, holdings in self.held.items()
                                       if (h := holdings.get(model)) and h.state == "resident"])
        self.metrics.resident(model, {k: (h := hs.get(model)) is not None and h.state == "resident"
                                      for k, hs in self.held.items()})

    # -- each round ----------------------------------------------------------------------------
    async def round(self) -> None:
        now = self.state.clock()
        self.demand.read(now)
        for pool in self.pools():
            await self.reconcile(pool)
            self.footprints.refresh(self.models(pool))
            self.execute(pool, policy.plan(self.view(pool, now), self.knobs(pool)))
            self._gauges(pool)
        if now - self._recorded_at >= RECORD_EVERY_S:
            self._recorded_at = now
            self.demand.record()

    def execute(self, pool: Pool, plan: policy.Plan) -> None:
        """The plan's evictions at once, then its loads that the members' load slots allow
        (the rest at a later round, re-planned then)."""
        members = {m.key: m for m in pool.members}
        # a model under rollout keeps the members it has: they load both its versions
        # side by side, a replica added meanwhile would hold its serving version alone
        kept = {m.member for m in plan.evictions if self.state.split_of(m.model) is not None}
        plan = policy.Plan(  # (no load where an eviction it needed the room of is kept)
            loads=tuple(m for m in plan.loads if self.state.split_of(m.model) is None
                        and m.member not in kept),
            evictions=tuple(m for m in plan.evictions
                            if self.state.split_of(m.model) is None),
            replicas=plan.replicas)
        for move in plan.evictions:
            member = members.get(move.member)
            holding = self.held.get(move.member, {}).get(move.model)
            if member is not None and holding is not None and holding.state == "resident":
                self._spawn(self.evict(move.model, member, move.reason))
        slots = {key: self.spec(pool).loads_per_member - sum(
            1 for h in self.held.get(key, {}).values() if h.state == "loading")
            for key in members}
        for move in plan.loads:
            member = members.get(move.member)
            if member is None or slots[move.member] <= 0 or move.model in self.held.get(
                    move.member, {}):
                continue
            slots[move.member] -= 1
            self._reserve(move.model, member.key, move.reason)
            self._spawn(self._load_reported(move.model, member, move.reason))

    def _reserve(self, model: str, member_key: str, reason: str) -> None:
        """A load decided now counts in its member's use now (not once its task runs:
        a miss placed meanwhile would see the room it takes as free)."""
        self.held.setdefault(member_key, {})[model] = Holding("loading", self.state.clock(),
                                                              reason)

    def _spawn(self, job: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(job)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _load_reported(self, model: str, member: PoolMember, reason: str) -> None:
        with contextlib.suppress(GatewayError, _NoRoom):  # said in the log, the holding
            await self.load(model, member, reason)

    # -- a load, an eviction ------------------------------------------------------------------
    async def load(self, model: str, member: PoolMember, reason: str) -> None:
        """Load and warm ``model`` on ``member``; then route to it there. A failure marks
        it failed there with the reason (and raises)."""
        holdings = self.held.setdefault(member.key, {})
        began = self.state.clock()
        holdings[model] = Holding("loading", began, reason)
        slots = self._load_slots.get(member.key)
        if slots is None:
            pool = next(p for p in self.pools() if member in p.members)
            slots = self._load_slots[member.key] = asyncio.Semaphore(
                self.spec(pool).loads_per_member)
        try:
            async with slots:  # misses' loads too: a member loads a few at a time
                pool = next(p for p in self.pools() if member in p.members)
                if self.used_bytes(pool, member) > self.spec(pool).usable_bytes:
                    # footprints measured while it waited for its slot: no room now
                    holdings.pop(model, None)
                    self._removed[member.key, model] = self.state.clock()
                    raise _NoRoom(f"member {member.key} has no room for '{model}' any more "
                                  "(footprints measured meanwhile)", 1.0)
                gpu_before = await self.footprints.gpu_before(member)
                started, wall = time.perf_counter(), time.time()
                await self.load_one(member, model)
        except _NoRoom:
            raise
        except Exception as exc:
            message = exc.message if isinstance(exc, GatewayError) else repr(exc)
            holdings[model] = Holding("failed", self.state.clock(), message)
            self.metrics.load_failures.labels(model, member.key).inc()
            log.error("loading %s on %s (%s) failed: %s", model, member.key, reason, message)
            with contextlib.suppress(GatewayError):  # nothing half-loaded stays behind
                await self.admin.unload(member, model)
            self._publish(model)
            raise
        seconds = time.perf_counter() - started
        self._load_seconds[model] = seconds
        holdings[model] = Holding("resident", self.state.clock(), reason)
        self.metrics.loads.labels(model, reason).inc()
        self.metrics.load_seconds.observe(seconds)
        self._publish(model)
        await self.state.settle()  # both data planes route to it there now
        self._spawn(self.footprints.measure(member, model, gpu_before, wall - 1.0))

    async def evict(self, model: str, member: PoolMember, reason: str) -> None:
        """Out of routing there first, its requests in flight there end, then unloaded."""
        holdings = self.held.setdefault(member.key, {})
        holdings[model] = Holding("evicting", self.state.clock(), reason)
        self._publish(model)
        try:
            await self.state.settle()
            deadline = time.monotonic() + EVICT_DRAIN_S
            while await self.state.in_flight_at(model, member) > 0:
                if time.monotonic() >= deadline:
                    log.warning("evicting %s from %s: requests still in flight after %.0f s; "
                                "Triton's unload waits for those it runs", model, member.key,
                                EVICT_DRAIN_S)
                    break
                await asyncio.sleep(0.02)
            await self.admin.unload(member, model)
        except GatewayError as exc:
            log.error("evicting %s from %s failed: %s", model, member.key, exc.message)
            holdings[model] = Holding("resident", self.state.clock(), "eviction failed")
            self._publish(model)
            return
        holdings.pop(model, None)
        self._removed[member.key, model] = self.state.clock()
        self.metrics.evictions.labels(model, reason).inc()
        self.metrics.resident(model, {member.key: False})

    # -- misses ---------------------------------------------------------------------------------
    async def wait(self, model: str, deadline_s: float | None) -> None:
        """Hold a request for ``model``, resident nowhere, until it is loaded (the
        waiting room): 503 + Retry-After (``ModelNotReady``) past the room's size or the
        request's own deadline; the load's error when it fails on two members."""
        pool = self.pool_of(model)
        if pool is None or self.state.resident(model):
            return
        if model not in self.models(pool):
            await self.reconcile(pool)  # a model the members got since the last round?
            if model not in self.models(pool):
                raise ModelNotFound(f"Request for unknown model: '{model}' is not found")
        room = self.spec(pool).waiting_room
        waiting_now = sum(self.waiting.get(m, 0) for m in self.models(pool))
        if waiting_now >= room.max_requests:
            raise ModelNotReady(
                f"model '{model}' is being loaded, and the waiting room of pool "
                f"'{pool.name}' is full ({room.max_requests} requests wait for models "
                "being loaded): retry shortly", retry_after_s=self._retry_after(model),
                reason="loading")
        limit = room.max_wait_s if deadline_s is None else min(room.max_wait_s, deadline_s)
        give_up = time.monotonic() + max(0.0, limit)
        self.waiting[model] = self.waiting.get(model, 0) + 1
        self.metrics.waiting.labels(model).set(self.waiting[model])
        try:
            miss = await self._miss_within(pool, model, give_up)
            await asyncio.wait_for(asyncio.shield(miss.done),
                                   max(0.0, give_up - time.monotonic()))
        except TimeoutError:
            waited = self.state.clock() - miss.started
            raise ModelNotReady(
                f"model '{model}' is being loaded on member {miss.member} ({waited:.1f} s "
                f"so far), longer than this request may wait ({limit:.1f} s): retry",
                retry_after_s=self._retry_after(model), reason="loading") from None
        finally:
            self.waiting[model] -= 1
            self.metrics.waiting.labels(model).set(self.waiting[model])

    async def _miss_within(self, pool: Pool, model: str, give_up: float) -> _Miss:
        """:meth:`_miss`, waiting (until ``give_up``, monotonic) for room when no member
        has any now (every candidate's models loaded within ``min_resident_s``, or
        loading): room frees as they age, and the next round's evictions make it."""
        if self.footprints.bytes(model, pool) > self.spec(pool).usable_bytes:
            raise Unavailable(self._no_room(pool, model), retry_after_s=None)  # never fits
        while True:
            try:
                return self._miss(pool, model)
            except _NoRoom as no_room:
                if time.monotonic() + ROOM_POLL_S > give_up:
                    raise ModelNotReady(no_room.message, retry_after_s=no_room.retry_after_s,
                                        reason="loading") from None
            await asyncio.sleep(ROOM_POLL_S)
            if self.state.resident(model):  # a round loaded it meanwhile
                done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                done.set_result(None)
                return _Miss(done, "", self.state.clock())

    def _retry_after(self, model: str) -> float:
        return max(1.0, math.ceil(self._load_seconds.get(model, 1.0)))

    def _miss(self, pool: Pool, model: str) -> _Miss:
        """The load the misses of ``model`` wait for: the one under way, else a new one
        on the member the policy picks (after the evictions that make room)."""
        miss = self._misses.get(model)
        if miss is not None and not miss.done.done():
            return miss
        loading = [(key, h) for key, hs in self.held.items()
                   if (h := hs.get(model)) is not None and h.state == "loading"]
        now = self.state.clock()
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.add_done_callback(_consume)
        if loading:  # a planned load is under way: wait for the model to be resident
            key, holding = loading[0]
            miss = _Miss(done, key, holding.since)
            self._spawn(self._until_resident(model, done))
        else:
            place = policy.place_miss(self.view(pool, now), model, self.knobs(pool))
            if place is None:
                raise _NoRoom(self._no_room(pool, model),
                              max(1.0, self.spec(pool).min_resident_s / 4))
            member_key, evictions = place
            miss = _Miss(done, member_key, now)
            self._reserve(model, member_key, "miss")
            self._spawn(self._load_for_misses(pool, model, member_key, evictions, done))
        self._misses[model] = miss
        return miss

    def _no_room(self, pool: Pool, model: str) -> str:
        size = self.footprints.bytes(model, pool)
        budget = self.spec(pool).usable_bytes
        if size > budget:
            return (f"model '{model}' needs {size} bytes, more than any member of pool "
                    f"'{pool.name}' may hold ({budget} bytes)")
        return (f"model '{model}' is resident nowhere and no member of pool '{pool.name}' "
                "has room for it now (their budgets hold models loaded within the last "
                f"{self.spec(pool).min_resident_s:.0f} s, or loading): retry")

    async def _until_resident(self, model: str, done: asyncio.Future[None]) -> None:
        while not self.state.resident(model):
            if not any((h := hs.get(model)) is not None and h.state == "loading"
                       for hs in self.held.values()):
                if not done.done():
                    done.set_exception(Unavailable(
                        f"model '{model}' could not be loaded: {self._failures(model)}",
                        retry_after_s=None))
                return
            await asyncio.sleep(0.02)
        if not done.done():
            done.set_result(None)

    async def _load_for_misses(self, pool: Pool, model: str, member_key: str,
                               evictions: Sequence[policy.Move],
                               done: asyncio.Future[None]) -> None:
        """Evict to make room, load; on failure one other member (once); no room after
        all (footprints measured meanwhile): placed again, for up to the waiting room's
        ``max_wait_s``. The misses get the outcome."""
        members = {m.key: m for m in pool.members}
        give_up = time.monotonic() + self.spec(pool).waiting_room.max_wait_s
        failures = 0
        try:
            while True:
                await asyncio.gather(*(self.evict(e.model, members[e.member], e.reason)
                                       for e in evictions if e.member in members))
                try:
                    await self.load(model, members[member_key], "miss")
                    done.set_result(None)
                    return
                except _NoRoom:
                    pass
                except GatewayError:
                    failures += 1
                    if failures >= 2:  # two members tried: the error is the model's
                        break
                while (place := policy.place_miss(self.view(pool, self.state.clock()), model,
                                                  self.knobs(pool))) is None:
                    if time.monotonic() >= give_up:
                        if failures:
                            break
                        raise ModelNotReady(self._no_room(pool, model),
                                            retry_after_s=1.0, reason="loading")
                    await asyncio.sleep(ROOM_POLL_S)
                if place is None:  # failed once, and no other member to try now
                    break
                member_key, evictions = place
                self._reserve(model, member_key, "miss")
            done.set_exception(Unavailable(
                f"model '{model}' could not be loaded: {self._failures(model)}",
                retry_after_s=None))
        except Exception as exc:  # noqa: BLE001 - the waiting requests get it
            if not done.done():
                done.set_exception(exc)

    def _failures(self, model: str) -> str:
        failed = [f"{key}: {h.reason}" for key, hs in self.held.items()
                  if (h := hs.get(model)) is not None and h.state == "failed"]
        return "; ".join(failed) or "the load did not finish"

    # -- deploys of a model resident nowhere -------------------------------------------------
    async def reserve(self, model: str) -> list[PoolMember]:
        """Members to load a new version of ``model`` on when no member holds it (an
        upload): the one the policy picks, room made; recorded as loading there until
        :meth:`deployed` says how it went."""
        pool = self.pool_of(model)
        if pool is None:
            return []
        now = self.state.clock()
        place = policy.place_miss(self.view(pool, now), model, self.knobs(pool))
        if place is None:
            raise Unavailable(self._no_room(pool, model), retry_after_s=None)
        members = {m.key: m for m in pool.members}
        member_key, evictions = place
        await asyncio.gather(*(self.evict(e.model, members[e.member], e.reason)
                               for e in evictions if e.member in members))
        self.held.setdefault(member_key, {})[model] = Holding("loading", now, "deploy")
        return [members[member_key]]

    def deployed(self, model: str, members: Collection[PoolMember], ok: bool) -> None:
        """A deploy on reserved members ended: resident there, or nothing held."""
        now = self.state.clock()
        for member in members:
            holdings = self.held.setdefault(member.key, {})
            if ok:
                holdings[model] = Holding("resident", now, "deploy")
                self.metrics.loads.labels(model, "deploy").inc()
            else:
                holdings.pop(model, None)
                self._removed[member.key, model] = now
        self._publish(model)

    def fits(self, model: str, footprint_bytes: int) -> str | None:
        """Why ``model`` of ``footprint_bytes`` fits no member of its pool (None: it
        fits one): an upload is refused with this."""
        pool = self.pool_of(model)
        if pool is None or footprint_bytes <= self.spec(pool).usable_bytes:
            return None
        return (f"model '{model}' needs {footprint_bytes} bytes once loaded, more than any "
                f"member of pool '{pool.name}' may hold ({self.spec(pool).usable_bytes} "
                "bytes: memory_budget_bytes less headroom_bytes)")

    # -- an operator's word ---------------------------------------------------------------------
    async def operator_move(self, model: str, member_key: str, action: str) -> None:
        """``load`` or ``evict`` ``model`` on a member now, as an eviction or a load of
        the policy's would (draining a member, warming one ahead of a launch). The
        policy decides again at its next rounds: what demand asks for comes back."""
        pool = self.pool_of(model)
        if pool is None or model not in self.models(pool):
            raise ModelNotFound(f"model '{model}' is in no pool with residency")
        member = next((m for m in pool.members if m.key == member_key), None)
        if member is None:
            raise InvalidInput(f"pool '{pool.name}' has no member '{member_key}' (members: "
                               f"{', '.join(m.key for m in pool.members)})")
        holding = self.held.get(member.key, {}).get(model)
        if action == "evict":
            if holding is None or holding.state != "resident":
                raise Conflict(f"model '{model}' is not resident on {member.key}")
            await self.evict(model, member, "operator")
            return
        if holding is not None and holding.state in ("resident", "loading"):
            raise Conflict(f"model '{model}' is already {holding.state} on {member.key}")
        size, room = self.footprints.bytes(model, pool), self.spec(pool).usable_bytes
        if self.used_bytes(pool, member) + size > room:
            raise Conflict(f"member {member.key} has no room for '{model}' ({size} bytes; "
                           f"{self.used_bytes(pool, member)} of {room} used): evict first")
        await self.load(model, member, "operator")

    # -- start-up -----------------------------------------------------------------------------
    async def preload(self, timeout_s: float = 600.0) -> None:
        """At start: adopt what the members hold, load by recorded use up to the budgets
        (most used first), and return once every pinned model (``min_replicas``) is
        resident on as many members (or ``timeout_s`` passed)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            await self.round()
            if all(self._pinned_met(pool) for pool in self.pools()):
                return
            await asyncio.sleep(0.1)
        log.error("residency preload: pinned models not all resident after %.0f s",
                  timeout_s)

    def _pinned_met(self, pool: Pool) -> bool:
        available = [m for m in pool.members if m.available(self.state.clock())]
        if not available or pool.name not in self.repository:
            return False
        for model in self.models(pool):
            wanted = min(self.min_replicas(pool, model), len(available))
            held = sum(1 for m in available if (h := self.held.get(m.key, {}).get(model))
                       is not None and h.state == "resident")
            failed = sum(1 for m in available if (h := self.held.get(m.key, {}).get(model))
                         is not None and h.state == "failed")
            if held + failed < wanted:
                return False
        return True

    async def run_forever(self, interval_s: float) -> None:
        while True:
            try:
                await self.round()
            except Exception:  # noqa: BLE001 - the next round tries again
                log.exception("residency round failed")
            await asyncio.sleep(interval_s)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self.demand.record()

    # -- what owners and operators see ------------------------------------------------------
    def _gauges(self, pool: Pool) -> None:
        for member in pool.members:
            self.metrics.budget.labels(pool.name, member.key).set(
                self.spec(pool).memory_budget_bytes)
            self.metrics.used.labels(pool.name, member.key).set(self.used_bytes(pool, member))

    def report(self) -> dict[str, Any]:
        """``GET /v1/residency``: which models live on which member, and why."""
        now = self.state.clock()
        last_used = self.state.last_used()
        pools, models = [], {}
        for pool in self.pools():
            spec = self.spec(pool)
            members = []
            for member in pool.members:
                holdings = self.held.get(member.key, {})
                members.append({
                    "key": member.key, "available": member.available(now),
                    "budget_bytes": spec.memory_budget_bytes,
                    "usable_bytes": spec.usable_bytes,
                    "used_bytes": self.used_bytes(pool, member),
                    "models": [{"model": m, "state": h.state,
                                "for_s": round(now - h.since, 1), "reason": h.reason,
                                "footprint_bytes": self.footprints.bytes(m, pool)}
                               for m, h in sorted(holdings.items())],
                })
            pools.append({"name": pool.name, "budget_bytes": spec.memory_budget_bytes,
                          "headroom_bytes": spec.headroom_bytes, "members": members})
            for model in self.models(pool):
                configured = self.state.config.models.get(model)
                used = last_used.get(model)
                size, source = self.footprints.of(model, pool)
                models[model] = {
                    "pool": pool.name,
                    "on_demand": bool(configured and configured.on_demand),
                    "min_replicas": self.min_replicas(pool, model),
                    "footprint_bytes": size, "footprint_source": source,
                    "demand_rps": round(self.demand.rate(model), 4),
                    "last_used_s_ago": None if used is None else round(now - used, 1),
                    "members": sorted(k for k, hs in self.held.items()
                                      if (h := hs.get(model)) and h.state == "resident"),
                    "waiting": self.waiting.get(model, 0),
                }
        return {"pools": pools, "models": models}


def _consume(future: asyncio.Future[None]) -> None:
    """A miss's outcome nobody waits for any more is not an unretrieved exception."""
    if not future.cancelled():
        future.exception()


def build_residency(config: GatewayConfig, core: Core, admin: MemberAdmin,
                    load_one: LoadOne) -> Residency | None:
    """The residency of ``config``'s pools with a memory budget (None: none has one)."""
    specs = [p.residency for p in config.pools if p.residency is not None]
    if not specs:
        return None
    lifecycle = config.lifecycle
    demand_path = next((s.demand_file for s in specs if s.demand_file), None) or (
        lifecycle.state_dir / "residency-demand.json" if lifecycle else None)
    metrics = ResidencyMetrics.create(core.metrics.registry)
    footprints = Footprints(config, admin.client, lifecycle.repository if lifecycle else None)
    demand = DemandMeter(core.metrics, min(s.demand_half_life_s for s in specs), demand_path)
    residency = Residency(core, admin, load_one, footprints, demand, metrics)
    core.state.on_miss(residency.wait)
    return residency
