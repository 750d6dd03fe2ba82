"""The residency, assembled: what each member of a pool with a memory budget holds,
changed by the policy's plan each round and by misses.

The parts, each with one job:
- :class:`~gateway.residency.holdings.HoldingTable`: one record per (member, model), a
  state machine, the one writer of who holds what (and of the routing it implies);
- :class:`~gateway.residency.actuator.Actuator`: loads and evictions on the members,
  through ``MemberAdmin`` and the warm-up's loader, a member's load slots;
- :class:`~gateway.residency.waiting.WaitingRoom`: the requests of misses, one load per
  model, answered at once when they cannot be served in time;
- :mod:`gateway.residency.report`: what ``GET /v1/residency`` and the console show.

Once per round (:meth:`Residency.round`):
1. **what the members hold**, from each one's repository index (Triton's own word: a
   Triton that restarted empty, or a model a deploy loaded, is seen here);
2. **demand**, from the request counters, and the footprints measured again;
3. **the plan** (:func:`gateway.policy.residency.plan`) over a view built from the
   records: its evictions, promotions, and the loads that fit now (with
   ``fill_free_room``, while no request waits for a load in the pool, models held nowhere
   fill the room left, each only into a load slot free now);
4. misses no member had room for are placed again.

A miss is placed by :func:`gateway.policy.residency_misses.place_miss`: the victims it names
are evicted first, and only once they are gone is its load queued, so the accounted use
(queued and loading footprints included) never exceeds a budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.config import GatewayConfig
from gateway.config.residency import ResidencySpec
from gateway.core import Core
from gateway.errors import Conflict, InvalidInput, ModelNotFound, Unavailable
from gateway.lifecycle.records.store import RecordStore
from gateway.policy import residency as policy
from gateway.policy import residency_misses as admission
from gateway.pools import Pool, PoolMember
from gateway.residency import report
from gateway.residency.actuator import Actuator, LoadOne, Sleep
from gateway.residency.demand import DemandMeter
from gateway.residency.footprints import Footprints
from gateway.residency.holdings import (
    LEAVING,
    MAIN,
    PENDING,
    PROBATION,
    HoldingTable,
    Phase,
    StaleTransition,
)
from gateway.residency.metrics import ResidencyMetrics
from gateway.residency.misses import Misses
from gateway.residency.waiting import WaitingRoom
from gateway.residency.window import RecentMax
from gateway.state import GatewayState
from gateway.upstream.triton import MemberAdmin

log = logging.getLogger(__name__)

# the most of a member's budget kept free for a load's surge (a model whose load surges
# more than that is loaded past its budget for a moment rather than held nowhere)
SURGE_SHARE = 0.25
RECORD_EVERY_S = 10.0  # demand recorded (the lifecycle's records, else its file) this often
READY = "READY"


@dataclass
class Residency:
    core: Core
    admin: MemberAdmin
    load_one: LoadOne  # loads and warms one model on one member (the warm-up's loader)
    footprints: Footprints
    demand: DemandMeter
    metrics: ResidencyMetrics
    sleep: Sleep = asyncio.sleep
    repository: dict[str, set[str]] = field(default_factory=dict)  # pool -> models Triton has
    table: HoldingTable = field(init=False)
    actuator: Actuator = field(init=False)
    room: WaitingRoom = field(init=False)
    misses: Misses = field(init=False)
    _routed: set[str] = field(default_factory=set)  # models with a route of their own
    # (member, model) a plan's load waits for the room of (its victims draining)
    _reserved: set[tuple[str, str]] = field(default_factory=set)
    _recorded_at: float = field(default=float("-inf"))
    # pool -> the most one round's measures raised a member's accounted use, within
    # RISE_MEMORY_S (margin_bytes)
    _rises: dict[str, RecentMax] = field(default_factory=dict)

    def __post_init__(self) -> None:
        clock = self.state.clock
        self.misses = Misses(self, self.metrics)
        self.table = HoldingTable(self.state, clock, self.misses.changed)
        self.actuator = Actuator(
            self.table, self.admin, self.load_one, self.state, self.footprints,
            self.metrics, members=self._member, slots=self.slots,
            urgency=lambda model: self.room.waiters(model) + self.demand.rate(model),
            clock=clock, release_wait_s=self._release_wait_s, sleep=self.sleep)
        self.room = WaitingRoom(self.misses, self.spec, clock,
                                lambda model, n: self.metrics.waiting.labels(model).set(n))

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
                                     failed_retry_s=spec.failed_retry_s,
                                     probation_share=spec.probation_share,
                                     probation_min_s=spec.probation_min_s)

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

    def _member(self, key: str) -> PoolMember | None:
        return next((m for p in self.pools() for m in p.members if m.key == key), None)

    def _pool_of_member(self, key: str) -> Pool | None:
        return next((p for p in self.pools() if any(m.key == key for m in p.members)), None)

    def _release_wait_s(self, key: str) -> float:
        pool = self._pool_of_member(key)
        return self.spec(pool).release_wait_s if pool is not None else 0.0

    def slots(self, key: str) -> int:
        """Loads the member runs at once."""
        pool = self._pool_of_member(key)
        return self.spec(pool).loads_per_member if pool is not None else 1

    # -- the view the policy decides over ----------------------------------------------
    def view(self, pool: Pool, now: float | None = None) -> policy.ResidencyView:
        now = self.state.clock() if now is None else now
        last_used = self.state.last_used()
        models = []
        for name in self.models(pool):
            configured = self.state.config.models.get(name)
            rolling = self.state.split_of(name) is not None
            models.append(policy.ModelView(
                name=name, footprint_bytes=self.footprints.bytes(name, pool),
                min_replicas=policy.resolve_min_replicas(
                    configured.min_replicas if configured else None,
                    bool(configured and configured.on_demand), len(pool.members), rolling),
                demand_rps=self.demand.rate(name), last_used=last_used.get(name),
                frozen=rolling))
        margin = self.margin_bytes(pool)
        members = tuple(self._member_view(pool, m, now, last_used, margin)
                        for m in pool.members)
        return policy.ResidencyView(now=now, models=tuple(models), members=members)

    def _member_view(self, pool: Pool, member: PoolMember, now: float,
                     last_used: Mapping[str, float], margin: int) -> policy.MemberView:
        holdings = self.table.of_member(member.key).values()
        # misses placed here waiting for their victims to leave: their room is theirs, as
        # a pending load's (loaded into probation, expected when their room is made), the
        # victims' bytes counted once
        promised = {f.model: f for f in self.room.promised(member.key)}
        leaving = {h.model for h in holdings if h.phase in LEAVING}
        return policy.MemberView(
            key=member.key, budget_bytes=self.usable_bytes(pool),
            margin_bytes=margin,
            available=member.available(now) and member.healthy,
            held={h.model: h.resident_since or h.since for h in holdings
                  if h.phase is Phase.RESIDENT or h.phase in LEAVING},
            failed={h.model: h.since for h in holdings if h.phase is Phase.FAILED},
            draining=frozenset(leaving),
            pending=frozenset({h.model for h in holdings if h.phase in PENDING}
                              | {m for k, m in self._reserved if k == member.key}
                              | promised.keys()),
            probation=frozenset({h.model for h in holdings if h.segment == PROBATION}
                                | promised.keys()),
            ready_at={h.model: now + self.actuator.expected_in(h) for h in holdings
                      if h.phase in PENDING} | {
                m: now + expected for m, f in promised.items()
                if (expected := self.misses.expected_in(f)) is not None},
            covered={m: sum(self.footprints.bytes(v, pool) for v in f.victims & leaving)
                     for m, f in promised.items()},
            lent=frozenset(h.model for h in holdings if h.lent(last_used.get(h.model))))

    def unreserve(self, model: str) -> None:
        """A plan's load of ``model`` waiting for room is decided again by a miss."""
        self._reserved = {r for r in self._reserved if r[1] != model}

    def headroom_bytes(self, pool: Pool) -> int:
        """What each member keeps free: the configured ``headroom_bytes``, or with
        ``surge_headroom`` the largest surge a load of one of the pool's models was
        measured to take beyond what it keeps (:meth:`Footprints.surge`), at most
        :data:`SURGE_SHARE` of the budget, when larger."""
        spec = self.spec(pool)
        if not spec.surge_headroom:
            return spec.headroom_bytes
        surge = min(self.footprints.surge(self.models(pool)),
                    int(spec.memory_budget_bytes * SURGE_SHARE))
        return max(spec.headroom_bytes, surge)

    def margin_bytes(self, pool: Pool) -> int:
        """What a placement leaves free of a member's usable budget (the budget's
        evictions start only past the whole of it): what the figures were seen to move
        by, the most one round's measures raised a member's accounted use or one model's
        figure rose at a measure (:meth:`Footprints.growth`: a load measured larger)
        within the last :data:`~gateway.residency.window.RISE_MEMORY_S`, at most
        :data:`SURGE_SHARE` of it; ``placement_margin`` of it when larger."""
        usable = self.usable_bytes(pool)
        rises = self._rises.get(pool.name)
        seen = max(rises.value(self.state.clock()) if rises else 0,
                   self.footprints.growth(self.models(pool)))
        return max(int(usable * self.spec(pool).placement_margin),
                   min(seen, int(usable * SURGE_SHARE)))

    def usable_bytes(self, pool: Pool) -> int:
        """What a member's models may take together: the budget less the headroom."""
        return self.spec(pool).memory_budget_bytes - self.headroom_bytes(pool)

    def used_bytes(self, pool: Pool, member_key: str) -> int:
        """The member's accounted use: every holding but failed ones (queued, loading,
        warming, resident, draining, unloading)."""
        return sum(self.footprints.bytes(m, pool) for m, h in
                   self.table.of_member(member_key).items() if h.in_use)

    # -- what the members hold -------------------------------------------------------------
    async def reconcile(self, pool: Pool) -> None:
        """Each healthy member's repository index -> its records: a model READY there that
        no record holds is adopted (a deploy loaded it, or a gateway before this one); a
        resident one Triton no longer has ready is dropped (the member restarted)."""
        fetched = self.state.clock()
        members = [m for m in pool.members if m.healthy]
        indexes = await asyncio.gather(*(self._index(m) for m in members))
        for member, index in zip(members, indexes, strict=True):
            if index is not None:
                self._reconcile_member(pool, member, index, fetched)
        # every model the pool may hold has a route of its own (HAProxy: its backend),
        # held or not: a request for one held nowhere is a miss, not an unknown model
        for model in set(self.models(pool)) - self._routed:
            self._routed.add(model)
            self.table.publish(model)

    def _reconcile_member(self, pool: Pool, member: PoolMember, index: dict[str, str],
                          fetched: float) -> None:
        self.repository.setdefault(pool.name, set()).update(index)
        ready = {name for name, state in index.items() if state == READY}
        holdings = self.table.of_member(member.key)
        for model, held in holdings.items():
            # (a record that changed since the index was read is newer than it)
            if held.phase is Phase.RESIDENT and model not in ready and held.since < fetched:
                log.warning("%s no longer has %s ready (restarted?): dropped", member.key,
                            model)
                self.table.drop(held)
        for model in ready - holdings.keys():
            if not self.table.gone_since(member.key, model, fetched) and \
                    pool in self.state.pools_for(model):
                self.table.adopt(member.key, model)

    async def _index(self, member: PoolMember) -> dict[str, str] | None:
        try:
            answer = await self.admin.repository_index(member)
        except Exception as exc:  # noqa: BLE001 - that member is looked at next round
            log.info("repository index of %s: %r", member.key, exc)
            return None
        states: dict[str, str] = {}
        for entry in answer:  # an entry per version: READY if any version is
            name = str(entry.get("name", ""))
            if name and states.get(name) != READY:
                states[name] = str(entry.get("state", ""))
        return states

    # -- each round ----------------------------------------------------------------------
    async def round(self) -> None:
        now = self.state.clock()
        self.demand.read(now, {m: flight.waiters for m, flight in self.room.flights.items()})
        for pool in self.pools():
            await self.reconcile(pool)
            self.footprints.refresh(self.models(pool))
            await self._remeasure(pool)
            self._reserved = {r for r in self._reserved
                              if all(m.key != r[0] for m in pool.members)}
            self.execute(pool, policy.plan(self.view(pool), self.knobs(pool),
                                           fill=self._may_fill(pool)))
            self._gauges(pool)
        for flight in self.room.unplaced():
            self.misses.place(flight)
        if now - self._recorded_at >= RECORD_EVERY_S:
            self._recorded_at = now
            self.demand.record()

    def _may_fill(self, pool: Pool) -> bool:
        """Whether the plan may fill the pool's free room now: the pool asks for it and no
        request waits for a load there (misses take room and load slots first)."""
        return self.spec(pool).fill_free_room and not any(
            f.pool is pool and not f.done.done() for f in self.room.flights.values())

    async def _remeasure(self, pool: Pool) -> None:
        """Resident models measured again (a runtime grows after its load); the most the
        new figures raised a member's accounted use is remembered (:meth:`margin_bytes`:
        several of a member's models grow at once, and one model's figure is every
        holder's)."""
        resident = {member.key: [m for m, h in self.table.of_member(member.key).items()
                                 if h.phase is Phase.RESIDENT]
                    for member in pool.members if member.healthy}
        # only the figures this round measures: another model's may change while it runs
        # (a load's first measure, the runtime's overhead learned and added to a pending
        # model's converter figure), which is not a stub growing
        before = {m: self.footprints.bytes(m, pool) for names in resident.values()
                  for m in names}
        for member in pool.members:
            if resident.get(member.key):
                await self.footprints.remeasure(member, resident[member.key])
        moved = {m: self.footprints.bytes(m, pool) - size for m, size in before.items()}
        rise = max((sum(moved.get(m, 0) for m, h in self.table.of_member(k.key).items()
                        if h.in_use) for k in pool.members), default=0)
        if rise > 0:
            self._rises.setdefault(pool.name, RecentMax()).note(rise, self.state.clock())

    def execute(self, pool: Pool, plan: policy.Plan) -> None:
        """The plan's evictions and segment changes at once; its loads that fit each
        member's accounted use now and its load queue (the rest at a later round,
        re-planned then: a load queued on the room an eviction frees would overcommit the
        budget while the eviction drains). Those left keep their room from misses until
        then (``_reserved``: the view counts them pending)."""
        for move in plan.evictions:
            holding = self.table.get(move.member, move.model)
            if holding is not None and holding.phase is Phase.RESIDENT:
                self.actuator.start_eviction(holding, move.reason)
        for move in plan.segments:
            holding = self.table.get(move.member, move.model)
            if holding is not None:
                self.table.set_segment(holding, MAIN if move.reason == "promote" else PROBATION)
        usable = self.usable_bytes(pool)
        for move in plan.loads:
            member = self._member(move.member)
            if member is None or not self.table.may_queue(move.member, move.model):
                continue
            queued = self.actuator.queued(move.member)
            no_room = self.used_bytes(pool, move.member) \
                + self.footprints.bytes(move.model, pool) > usable
            if move.reason == "fill":  # only into a slot and room free now, never kept
                if no_room or queued + self.actuator.running(move.member) \
                        >= self.slots(move.member):
                    continue
            elif no_room or queued >= self.slots(move.member):
                # its room is kept for it until the next round (misses placed meanwhile
                # see it taken), when the plan decides again
                self._reserved.add((move.member, move.model))
                continue
            self.actuator.enqueue(self.table.queue(move.member, move.model, move.reason))

    async def wait(self, model: str, deadline_s: float | None) -> None:
        """The waiting room (:meth:`GatewayState.wait_resident` calls it on a miss; the
        holders it publishes are the state's own, so it names none)."""
        await self.room.wait(model, deadline_s)

    # -- deploys of a model resident nowhere ------------------------------------------------
    async def reserve(self, model: str) -> list[PoolMember]:
        """Members to load a new version of ``model`` on when no member holds it (an
        upload): the one the policy picks, room made; recorded as loading there until
        :meth:`deployed` says how it went."""
        pool = self.pool_of(model)
        if pool is None:
            return []
        placed = admission.place_miss(self.view(pool), model, self.knobs(pool))
        if placed is None:
            raise Unavailable(self.no_room(pool, model), retry_after_s=None)
        member_key, evictions = placed
        await asyncio.gather(*(self.actuator.start_eviction(victim, "room") for e in evictions
                               if (victim := self.table.get(e.member, e.model)) is not None))
        member = self._member(member_key)
        assert member is not None
        current = self.table.get(member_key, model)
        if current is None or current.phase is Phase.FAILED:
            current = self.table.queue(member_key, model, "deploy")
        if current.phase is Phase.QUEUED:
            self.table.advance(current, Phase.LOADING)  # the deployer loads it
        return [member]

    def deployed(self, model: str, members: Collection[PoolMember], ok: bool) -> None:
        """A deploy on reserved members ended: resident there, or nothing held."""
        for member in members:
            holding = self.table.get(member.key, model)
            if holding is None or holding.phase not in PENDING:
                continue
            with contextlib.suppress(StaleTransition):
                self.table.advance(holding, Phase.RESIDENT if ok else None)
            if ok:
                self.metrics.loads.labels(model, "deploy").inc()

    def fits(self, model: str, footprint_bytes: int) -> str | None:
        """Why ``model`` of ``footprint_bytes`` fits no member of its pool (None: it
        fits one): an upload is refused with this."""
        pool = self.pool_of(model)
        if pool is None or footprint_bytes <= self.usable_bytes(pool):
            return None
        return (f"model '{model}' needs {footprint_bytes} bytes once loaded, more than any "
                f"member of pool '{pool.name}' may hold ({self.usable_bytes(pool)} "
                "bytes: memory_budget_bytes less the headroom a load takes)")

    def no_room(self, pool: Pool, model: str) -> str:
        size, budget = self.footprints.bytes(model, pool), self.usable_bytes(pool)
        if size > budget:
            return (f"model '{model}' needs {size} bytes, more than any member of pool "
                    f"'{pool.name}' may hold ({budget} bytes)")
        return (f"model '{model}' is resident nowhere and no member of pool '{pool.name}' "
                "has room for it now (their budgets hold models within min_resident_s of "
                "their load, or loading): retry")

    # -- an operator's word -----------------------------------------------------------------
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
        holding = self.table.get(member.key, model)
        if action == "evict":
            if holding is None or holding.phase is not Phase.RESIDENT:
                raise Conflict(f"model '{model}' is not resident on {member.key}")
            await self.actuator.evict(holding, "operator")
            return
        if holding is not None and holding.phase is not Phase.FAILED:
            raise Conflict(f"model '{model}' is already {holding.phase} on {member.key}")
        size, room = self.footprints.bytes(model, pool), self.usable_bytes(pool)
        used = self.used_bytes(pool, member.key)
        if used + size > room:
            raise Conflict(f"member {member.key} has no room for '{model}' ({size} bytes; "
                           f"{used} of {room} used): evict first")
        queued = self.table.queue(member.key, model, "operator")
        self.actuator.enqueue(queued)
        while (now := self.table.get(member.key, model)) is not None and \
                now.token == queued.token and now.phase in PENDING:
            await self.sleep(0.05)
        if now is None or now.token != queued.token or now.phase is not Phase.RESIDENT:
            raise Unavailable(f"loading '{model}' on {member.key} failed: "
                              f"{now.reason if now is not None else 'it was dropped'}",
                              retry_after_s=None)

    # -- start-up ---------------------------------------------------------------------------
    async def preload(self, timeout_s: float = 600.0) -> None:
        """At start: adopt what the members hold, load by recorded use up to the budgets
        (most used first), and return once every pinned model (``min_replicas``) is
        resident on as many members (or ``timeout_s`` passed)."""
        give_up = self.state.clock() + timeout_s
        while self.state.clock() < give_up:
            try:
                await self.round()
            except Exception:  # noqa: BLE001 - as run_forever: the next round tries again
                log.exception("residency round failed (preload)")
            if all(self._pinned_met(pool) for pool in self.pools()):
                return
            await self.sleep(0.1)
        log.error("residency preload: pinned models not all resident after %.0f s",
                  timeout_s)

    def _pinned_met(self, pool: Pool) -> bool:
        available = [m for m in pool.members if m.available(self.state.clock())]
        if not available or pool.name not in self.repository:
            return False
        view = {m.name: m for m in self.view(pool).models}
        for model in self.models(pool):
            wanted = min(view[model].min_replicas, len(available))
            phases = [h.phase for k, h in self.table.of_model(model).items()
                      if any(m.key == k for m in available)]
            if sum(p in (Phase.RESIDENT, Phase.FAILED) for p in phases) < wanted:
                return False
        return True

    async def run_forever(self, interval_s: float) -> None:
        while True:
            try:
                await self.round()
            except Exception:  # noqa: BLE001 - the next round tries again
                log.exception("residency round failed")
            await self.sleep(interval_s)

    async def close(self) -> None:
        await self.actuator.close()
        self.demand.record()

    # -- what owners and operators see --------------------------------------------------------
    def _gauges(self, pool: Pool) -> None:
        for member in pool.members:
            self.metrics.budget.labels(pool.name, member.key).set(
                self.spec(pool).memory_budget_bytes)
            self.metrics.used.labels(pool.name, member.key).set(
                self.used_bytes(pool, member.key))

    def report(self) -> dict[str, Any]:
        """``GET /v1/residency``: which models live on which member, and why."""
        return report.build(self)


def build_residency(config: GatewayConfig, core: Core, admin: MemberAdmin,
                    load_one: LoadOne, records: RecordStore | None = None
                    ) -> Residency | None:
    """The residency of ``config``'s pools with a memory budget (None: none has one);
    ``records``: the lifecycle's store, where demand is recorded (None: its file)."""
    specs = [p.residency for p in config.pools if p.residency is not None]
    if not specs:
        return None
    lifecycle = config.lifecycle
    demand_path = next((s.demand_file for s in specs if s.demand_file), None) or (
        lifecycle.state_dir / "residency-demand.json" if lifecycle else None)
    metrics = ResidencyMetrics.create(core.metrics.registry)
    footprints = Footprints(config, admin, lifecycle.repository if lifecycle else None,
                            clock=core.state.clock)
    demand = DemandMeter(core.metrics, min(s.demand_half_life_s for s in specs), demand_path,
                         records)
    residency = Residency(core, admin, load_one, footprints, demand, metrics)
    core.state.on_miss(residency.wait)
    return residency
