"""Carrying out the residency's moves on the members, through ``MemberAdmin`` and the
warm-up's loader only: a holding's load (queued for one of the member's load slots,
loaded, warmed, then routed to) and its eviction (out of routing, its requests in flight
there end, then unloaded). Every step is a transition of the holding
(:mod:`gateway.residency.holdings`); a step whose record changed meanwhile stops there.

**Load slots**: a member runs ``slots`` loads at once (``loads_per_member``); the rest
wait in its queue, the most urgent first (requests waiting for it plus its demand per
second), then in the order they were decided. The measured load times give
:meth:`Actuator.expected_in`, how long until a holding is resident: what the waiting
room answers a request by.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import GatewayError
from gateway.pools import PoolMember
from gateway.residency.footprints import Footprints
from gateway.residency.holdings import (
    PENDING,
    Holding,
    HoldingTable,
    Phase,
    StaleTransition,
)
from gateway.residency.metrics import ResidencyMetrics
from gateway.state import GatewayState
from gateway.upstream.triton import MemberAdmin

log = logging.getLogger(__name__)

# loads and warms one model on one member, calling ``loaded()`` between the load and
# the gateway's warm-up (the warm-up's loader: ModelLifecycle/ConfiguredLoader.restore_one)
LoadOne = Callable[[PoolMember, str, Callable[[], None]], Awaitable[None]]
Sleep = Callable[[float], Awaitable[None]]
EVICT_DRAIN_S = 60.0  # in-flight requests of an evicted model get this long to end
DRAIN_POLL_S = 0.02
DEFAULT_LOAD_S = 2.0  # a load's expected time before any was measured
DEFAULT_EVICTION_S = 0.5  # an eviction's expected time (drain, unload) before any was measured
EVICTIONS_KEPT = 32  # the last evictions whose times give the typical one


@dataclass
class Actuator:
    table: HoldingTable
    admin: MemberAdmin
    load_one: LoadOne
    state: GatewayState
    footprints: Footprints
    metrics: ResidencyMetrics
    members: Callable[[str], PoolMember | None]  # key -> member
    slots: Callable[[str], int]  # key -> loads it runs at once
    # model -> how urgent its load is: requests waiting for it plus its demand per second
    # (a hot model's load before a cold one's miss: it serves more requests sooner)
    urgency: Callable[[str], float]
    clock: Callable[[], float]
    # member -> how long an unloaded model's processes may take to exit before its room
    # is given to another load (0: not waited for)
    release_wait_s: Callable[[str], float] = lambda key: 0.0
    sleep: Sleep = asyncio.sleep
    load_seconds: dict[str, float] = field(default_factory=dict)  # model -> last load took
    # the last evictions' seconds from out of routing to their room free (drain, unload,
    # the processes' exit): how long a miss waits for room being made
    eviction_seconds: list[float] = field(default_factory=list)
    _queues: dict[str, list[Holding]] = field(default_factory=dict)  # member -> queued
    _running: dict[str, int] = field(default_factory=dict)  # member -> loads running
    _tasks: set[asyncio.Task[Any]] = field(default_factory=set)

    # -- loads ---------------------------------------------------------------------------
    def enqueue(self, holding: Holding) -> None:
        """Start a queued holding's load when its member has a slot free."""
        self._queues.setdefault(holding.member, []).append(holding)
        self.pump(holding.member)

    def pump(self, member_key: str) -> None:
        """Start the member's queued loads its free slots allow, those requests wait for
        first (a slot freed, a request arrived for a queued model)."""
        queue = self._queues.get(member_key, [])
        queue[:] = [h for h in queue if self._current(h)]
        queue.sort(key=self._order)
        while queue and self._running.get(member_key, 0) < self.slots(member_key):
            holding = queue.pop(0)
            self._running[member_key] = self._running.get(member_key, 0) + 1
            self.spawn(self._load(holding))

    def queued_ahead(self, holding: Holding) -> int:
        """Loads that start before ``holding`` on its member, running ones included."""
        queue = sorted((h for h in self._queues.get(holding.member, []) if self._current(h)),
                       key=self._order)
        ahead = next((i for i, h in enumerate(queue) if h.token == holding.token), len(queue))
        return ahead + self._running.get(holding.member, 0)

    def _order(self, holding: Holding) -> tuple[float, float]:
        return (-self.urgency(holding.model), holding.queued_at)

    def queued(self, member_key: str) -> int:
        """Loads waiting for one of the member's slots."""
        return sum(1 for h in self._queues.get(member_key, []) if self._current(h))

    def expected_in(self, holding: Holding) -> float:
        """Seconds until ``holding`` is resident, from the measured load times."""
        own = self.expected_load_s(holding.model)
        if holding.phase is Phase.RESIDENT:
            return 0.0
        if holding.phase is not Phase.QUEUED:
            return max(0.0, own - (self.clock() - holding.since))
        waves = self.queued_ahead(holding) // max(1, self.slots(holding.member))
        return waves * self.typical_load_s() + own

    def expected_load_s(self, model: str) -> float:
        return self.load_seconds.get(model, self.typical_load_s())

    def typical_load_s(self) -> float:
        figures = sorted(self.load_seconds.values())
        return figures[len(figures) // 2] if figures else DEFAULT_LOAD_S

    def typical_eviction_s(self) -> float:
        figures = sorted(self.eviction_seconds)
        return figures[len(figures) // 2] if figures else DEFAULT_EVICTION_S

    def timings(self) -> dict[str, Any]:
        """What the waiting room's expectations are made of, as reported: the typical
        load (the median of each model's last) and eviction (of the last
        ``EVICTIONS_KEPT``), and how many figures each is of; None while none was measured
        (the defaults stand in)."""
        return {"load_s": round(self.typical_load_s(), 3) if self.load_seconds else None,
                "loads_measured": len(self.load_seconds),
                "eviction_s": (round(self.typical_eviction_s(), 3) if self.eviction_seconds
                               else None),
                "evictions_measured": len(self.eviction_seconds)}

    def _current(self, holding: Holding) -> bool:
        now = self.table.get(holding.member, holding.model)
        return now is not None and now.token == holding.token and now.phase is Phase.QUEUED

    async def _load(self, holding: Holding) -> None:
        member = self.members(holding.member)
        try:
            if member is None:
                self.table.advance(holding, Phase.FAILED, "the member left its pool")
                return
            await self._load_on(member, holding)
        except StaleTransition as stale:
            log.info("load of %s on %s overtaken: %s", holding.model, holding.member, stale)
        except Exception as exc:  # noqa: BLE001 - never left loading for good
            log.exception("loading %s on %s failed", holding.model, holding.member)
            with contextlib.suppress(StaleTransition):
                current = self.table.get(holding.member, holding.model)
                if current is not None and current.token == holding.token and \
                        current.phase in PENDING:
                    self.table.advance(current, Phase.FAILED, repr(exc))
        finally:
            self._running[holding.member] -= 1
            self.pump(holding.member)

    async def _load_on(self, member: PoolMember, holding: Holding) -> None:
        loading = self.table.advance(holding, Phase.LOADING)
        assert loading is not None
        gpu_before = await self.footprints.gpu_before(member)
        started, wall = self.clock(), time.time()
        warming: list[Holding] = []

        def loaded() -> None:
            with contextlib.suppress(StaleTransition):
                after = self.table.advance(loading, Phase.WARMING)
                warming.extend([after] if after else [])

        try:
            await self.load_one(member, holding.model, loaded)
        except Exception as exc:  # noqa: BLE001 - the holding says why, the waiters too
            message = exc.message if isinstance(exc, GatewayError) else repr(exc)
            log.error("loading %s on %s (%s) failed: %s", holding.model, member.key,
                      holding.reason, message)
            self.metrics.load_failures.labels(holding.model, member.key).inc()
            with contextlib.suppress(GatewayError):  # nothing half-loaded stays behind
                await self.admin.unload(member, holding.model)
            self.table.advance(warming[0] if warming else loading, Phase.FAILED, message)
            return
        seconds = self.clock() - started
        self.table.advance(warming[0] if warming else loading, Phase.RESIDENT)
        self.load_seconds[holding.model] = seconds
        self.metrics.loads.labels(holding.model, holding.reason).inc()
        self.metrics.load_seconds.observe(seconds)
        await self.state.settle()  # both data planes route to it there now
        self.spawn(self.footprints.measure(member, holding.model, gpu_before, wall - 1.0))

    # -- evictions -------------------------------------------------------------------------
    def start_eviction(self, holding: Holding, reason: str) -> asyncio.Future[bool]:
        """Out of routing at once (draining: a decision made next sees it going), the
        rest in the background; the future says whether it went (:meth:`evict`)."""
        try:
            draining = self.table.advance(holding, Phase.DRAINING, reason)
        except StaleTransition:
            done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            done.set_result(False)
            return done
        assert draining is not None
        future = asyncio.ensure_future(self._drain_and_unload(draining, reason))
        self._tasks.add(future)
        future.add_done_callback(self._tasks.discard)
        return future

    async def evict(self, holding: Holding, reason: str) -> bool:
        """Out of routing there first, its requests in flight there end, then unloaded;
        False when it stays (the record changed, or Triton refused the unload)."""
        return await self.start_eviction(holding, reason)

    async def _drain_and_unload(self, holding: Holding, reason: str) -> bool:
        member = self.members(holding.member)
        if member is None:  # it left its pool (DNS): nothing to unload there any more
            self.table.drop(holding)
            return True
        try:
            await self.state.settle()
            give_up = self.clock() + EVICT_DRAIN_S
            while await self.state.in_flight_at(holding.model, member) > 0:
                if self.clock() >= give_up:
                    log.warning("evicting %s from %s: requests still in flight after %.0f s; "
                                "Triton's unload waits for those it runs", holding.model,
                                member.key, EVICT_DRAIN_S)
                    break
                await self.sleep(DRAIN_POLL_S)
            unloading = self.table.advance(holding, Phase.UNLOADING)
            assert unloading is not None
            await self.admin.unload(member, holding.model)
            # Triton answers before the model's processes have exited: its memory is
            # free (and its room given to another load) only once they have
            wait_s = self.release_wait_s(member.key)
            if not await self.footprints.released(member, holding.model, wait_s):
                log.warning("%s's processes on %s still run %.0f s after its unload",
                            holding.model, member.key, wait_s)
        except StaleTransition:
            return False
        except Exception as exc:  # noqa: BLE001 - whatever failed, the holding moves on
            if isinstance(exc, GatewayError):
                log.error("evicting %s from %s failed: %s", holding.model, member.key,
                          exc.message)
            else:
                log.exception("evicting %s from %s failed", holding.model, member.key)
            self._eviction_failed(holding, refused=isinstance(exc, GatewayError))
            return False
        with contextlib.suppress(StaleTransition):
            self.table.advance(unloading, None)
        seconds = self.clock() - holding.since
        self.eviction_seconds = [*self.eviction_seconds[-EVICTIONS_KEPT + 1:], seconds]
        self.metrics.eviction_seconds.observe(seconds)
        self.metrics.evictions.labels(holding.model, reason).inc()
        return True

    def _eviction_failed(self, holding: Holding, refused: bool) -> None:
        """An eviction that failed never leaves its holding draining for good (out of
        routing, its room counted, never evicted or loaded again): back to resident
        while Triton was not asked to unload it, or refused (it still serves the model
        there); gone when the unload may have happened otherwise (routing never goes
        back to it; the next reconcile adopts it again if the member still has it)."""
        with contextlib.suppress(StaleTransition):
            current = self.table.get(holding.member, holding.model)
            if current is None or current.token != holding.token:
                return
            if current.phase is Phase.DRAINING or refused:
                self.table.advance(current, Phase.RESIDENT, "eviction failed")
            else:
                self.table.drop(current)

    # -- tasks -------------------------------------------------------------------------------
    def spawn(self, job: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(job)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def running(self, member_key: str) -> int:
        return self._running.get(member_key, 0)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self._tasks, return_exceptions=True)
