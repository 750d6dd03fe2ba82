"""What the gateway knows, with one owner: pools and their members, which pools serve a
model, which models are not ready and why, whether start-up preloading is done, whether
the gateway drains, when each model was last asked for.

:class:`GatewayState` is changed through its methods only (a member's own state through
:class:`~gateway.pools.PoolMember`'s). Both data planes follow it: the Python forwarder
(``gateway/python/forwarder.py``) reads it on every request; the HAProxy controller
(``gateway/haproxy/controller.py``) renders a snapshot of it once per probe round and
whenever a lifecycle step awaits :meth:`GatewayState.settle`. Its writers are the control
plane's parts: the probes (members' health, queue depth, version; DNS membership), the
lifecycle (readiness, the pools serving a model, a rollout's split) and the server
(draining).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from gateway.config import GatewayConfig
from gateway.config.pools import MemberSpec
from gateway.config.tenancy import TenancySpec
from gateway.errors import ModelNotFound, Unavailable
from gateway.policy import admission, deadline
from gateway.policy.model_name import UNKNOWN_MODEL
from gateway.policy.rollout import Shadow, Split
from gateway.policy.tenancy import Tenancy, TenantActivity, queued_elsewhere
from gateway.pools import Pool, PoolMember, pools_for_model
from gateway.telemetry import VersionTally

log = logging.getLogger(__name__)

Follower = Callable[[], Awaitable[None]]
RecoveryHook = Callable[[PoolMember], Awaitable[None]]
# (model, the client's seconds left or None): returns once the model has a member that
# holds it, or raises (the residency's waiting room, gateway.residency); returns the keys
# of the members known to hold it where this process's state does not name them yet (a
# data-plane replica told by the control plane), else None
MissHandler = Callable[[str, float | None], Awaitable[frozenset[str] | None]]
# (model, member): requests of the model a data plane has at the member now
InFlightReader = Callable[[str, PoolMember], Awaitable[int]]


class GatewayState:
    def __init__(self, config: GatewayConfig, pools: list[Pool],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.pools = pools  # the list is this object's; change it through methods
        self.clock = clock
        self._not_ready: dict[str, str] = {}
        self._assigned: dict[str, tuple[str, ...]] = {}
        self._last_used: dict[str, float] = {}
        self._preloaded = True
        self._draining = False
        self._followers: list[Follower] = []
        self._watchers: list[Callable[[], None]] = []
        self._recovery: list[RecoveryHook] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._restores: dict[str, asyncio.Task[None]] = {}  # member key -> its restore
        self._tenancy: Tenancy | None = None
        self._splits: dict[str, Split] = {}
        self._shadows: dict[str, Shadow] = {}
        # model -> its rollout's last verdict, epoch seconds (the split's lease)
        self._verdicts: dict[str, float] = {}
        # models of pools with residency: the member keys that hold each and may take its
        # requests (absent: none, a miss)
        self._holders: dict[str, frozenset[str]] = {}
        self._miss_handler: MissHandler | None = None
        self._in_flight_readers: list[InFlightReader] = []
        # answers per version of the models under rollout (both data planes record)
        self.tally = VersionTally()
        self._activity = TenantActivity()
        if config.tenancy is not None:
            self._tenancy = Tenancy.from_spec(config.tenancy, config.queue_factor)

    # -- reads -------------------------------------------------------------------------
    def members(self) -> list[PoolMember]:
        return [m for p in self.pools for m in p.members]

    def pools_for(self, model: str) -> list[Pool]:
        """The pools serving ``model``: the lifecycle's assignment, else the static lists."""
        assigned = self._assigned.get(model)
        if assigned is None:
            return pools_for_model(self.pools, model)
        return [p for p in self.pools if p.name in assigned]

    def members_of(self, model: str, available: bool = True) -> list[PoolMember]:
        """The members of ``model``'s pools that hold it (every member, where a pool has
        no residency; only those available now, by default); ModelNotFound when no pool
        serves it."""
        return self._members(model, self.holders(model), available)

    def available_among(self, model: str, keys: Iterable[str]) -> list[PoolMember]:
        """The members of ``model``'s pools available now whose keys are among ``keys``,
        whatever this state says they hold (ModelNotFound when no pool serves it)."""
        return self._members(model, frozenset(keys), available=True)

    def _members(self, model: str, keys: frozenset[str] | None, available: bool
                 ) -> list[PoolMember]:
        """The members of ``model``'s pools among ``keys`` (None: all), available now or
        not."""
        now = self.clock()
        return [m for p in self.serving_pools(model) for m in p.members
                if (not available or m.available(now)) and (keys is None or m.key in keys)]

    def resident(self, model: str) -> bool:
        """Whether ``model`` may take requests without a load (True outside residency)."""
        return self.holders(model) is None or bool(self.members_of(model))

    def managed(self, model: str) -> bool:
        """Whether one of ``model``'s pools decides where it lives (residency)."""
        return any(p.spec.residency is not None for p in self.pools_for(model))

    def holders(self, model: str) -> frozenset[str] | None:
        """The member keys that hold ``model`` and may take its requests, for a model
        of a pool with residency; None: every member of its pools (no residency)."""
        if not self.managed(model):
            return None
        return self._holders.get(model, frozenset())

    def serving_pools(self, model: str) -> list[Pool]:
        """:meth:`pools_for`, ModelNotFound when no pool serves ``model``."""
        pools = self.pools_for(model)
        if not pools:
            raise ModelNotFound(UNKNOWN_MODEL.format(model=model))
        return pools

    def priority_levels(self, model: str) -> int:
        """The priority levels of ``model``'s dynamic batcher: the fewest any member of
        its pools read (a level is then in range on each), 0 when none did
        (gateway.policy.triton_priority)."""
        read = [m.priority_levels[model][1] for p in self.pools_for(model)
                for m in p.members if model in m.priority_levels]
        return min(read, default=0)

    def leveled_models(self) -> dict[str, int]:
        """Every model with two or more priority levels (:meth:`priority_levels`) that a
        member of its pools read."""
        read = {model for p in self.pools for m in p.members for model in m.priority_levels}
        return {model: n for model in read if (n := self.priority_levels(model)) >= 2}

    def serves(self, model: str, member: PoolMember) -> bool:
        return any(member in pool.members for pool in self.pools_for(model))

    def admission_limits(self, model: str, pools: Sequence[Pool] | None = None
                         ) -> admission.AdmissionLimits:
        """The model's policy fields, else its pools' capacity (:mod:`gateway.policy.admission`)."""
        policy = self.config.models.get(model)
        capacity = sum(p.capacity for p in (self.pools_for(model) if pools is None else pools))
        return admission.admission_limits(
            capacity, self.config.queue_factor,
            policy.max_concurrency if policy else None, policy.max_queue if policy else None)

    def queued_elsewhere(self, pool: Pool) -> int:
        """Requests queued in ``pool``'s members that are not the gateway's (the tenancy
        rule's load: :func:`gateway.policy.tenancy.queued_elsewhere`)."""
        now = self.clock()
        return sum(queued_elsewhere(m.queue_samples, now) for m in pool.members)

    def service_us(self, model: str, pool: Pool) -> int | None:
        """The model's service time measured lately in ``pool`` (the mean over its
        members that measured it within :data:`~gateway.policy.deadline.FRESH_S`, kept
        to two significant digits); None: none that recent."""
        now = self.clock()
        measured = [t for m in pool.members
                    if (t := m.service_time_us(model, now, deadline.FRESH_S)) is not None]
        if not measured:
            return None
        return deadline.service_quantum(sum(measured) / len(measured))

    def drain_us(self, model: str, pool: Pool, service_us: int) -> int:
        """Microseconds per request that ``pool`` works off beyond its capacity: the
        slower of its service time over its capacity and one over the most answers per
        second its members gave the model lately (their sum,
        :data:`~gateway.policy.deadline.PEAK_WINDOW_S`: a round's count is noisy, its
        peak high, so it only ever adds to the wait the capacity predicts)."""
        now = self.clock()
        rate = sum(m.peak_answer_rate(model, now, deadline.PEAK_WINDOW_S) for m in pool.members)
        by_capacity = service_us / max(1, pool.capacity)
        return deadline.service_quantum(max(by_capacity, 1e6 / rate) if rate > 0
                                        else by_capacity)

    def active_tenants(self, pool: str) -> frozenset[str]:
        """The tenants active in ``pool`` now (:class:`~gateway.policy.tenancy.TenantActivity`)."""
        return self._activity.active(pool, self.clock())

    def not_ready_reason(self, model: str) -> str | None:
        return self._not_ready.get(model) if self._not_ready else None

    def not_ready(self) -> Mapping[str, str]:
        return dict(self._not_ready)

    def assignments(self) -> Mapping[str, tuple[str, ...]]:
        return dict(self._assigned)

    def known_models(self) -> set[str]:
        """Every model the gateway has a word about: named by a pool or a policy, assigned,
        not ready, asked for, or one a pool with residency may hold."""
        named = {m for p in self.pools for m in p.spec.models if m != "*"}
        return (named | set(self.config.models) | set(self._assigned) | set(self._not_ready)
                | set(self._last_used) | set(self._holders))

    def last_used(self) -> Mapping[str, float]:
        """Model -> when a user request for it last arrived (keep-warm's idleness clock)."""
        return dict(self._last_used)

    def split_of(self, model: str) -> Split | None:
        """The model's stable/candidate split while it is rolled out (None: none)."""
        return self._splits.get(model)

    @property
    def splits(self) -> Mapping[str, Split]:
        return self._splits

    def verdict_at(self, model: str) -> float | None:
        """When the rollout of ``model`` last took a verdict (epoch seconds), while it
        holds a lease (None: none): the lease the snapshot publishes with the split."""
        return self._verdicts.get(model)

    @property
    def tenancy(self) -> Tenancy | None:
        """Tenants and priority classes (None: admission per model only)."""
        return self._tenancy

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def preloaded(self) -> bool:
        return self._preloaded

    def ready(self) -> bool:
        """Ready when preloaded, not draining and every pool has an available member."""
        now = self.clock()
        return not self._draining and self._preloaded and all(
            any(m.available(now) for m in p.members) for p in self.pools)

    def any_member(self, pools: Sequence[Pool] | None = None) -> PoolMember:
        now = self.clock()
        for pool in pools or self.pools:
            for member in sorted(pool.members, key=lambda m: m.in_flight):
                if member.available(now):
                    return member
        raise Unavailable("no healthy Triton member")

    # -- changes -----------------------------------------------------------------------
    def serve(self, model: str, pool_names: Sequence[str]) -> None:
        """Serve ``model`` from these pools from now on (the lifecycle's one call)."""
        self._assigned[model] = tuple(pool_names)
        self._changed()

    def set_holders(self, model: str, members: Iterable[str]) -> None:
        """``model``'s requests go to these members only from now on (the residency's
        one call: a member is added once the model is loaded and warm there, removed
        before it is unloaded)."""
        keys = frozenset(members)
        if self._holders.get(model) != keys:
            self._holders[model] = keys
            self._changed()

    def mark_not_ready(self, model: str, reason: str) -> None:
        """``model`` answers 503 + Retry-After (first load, warm-up) until marked ready."""
        self._not_ready[model] = reason
        self._changed()

    def mark_ready(self, model: str) -> None:
        if self._not_ready.pop(model, None) is not None:
            self._changed()

    def set_split(self, model: str, split: Split | None) -> None:
        """Unversioned requests of ``model`` split between two versions from now on
        (the rollout's one call; None: no split, Triton's own choice)."""
        if split is None:
            self._splits.pop(model, None)
            self._verdicts.pop(model, None)  # no split, no lease
        else:
            self._splits[model] = split
        self._changed()

    def note_verdict(self, model: str, at: float | None) -> None:
        """The rollout of ``model`` took a verdict at ``at`` (epoch seconds): its lease
        runs from then (:func:`gateway.haproxy.snapshot.fail_safe`); None: it holds no
        lease (its share is no longer under judgement). Every verdict (every tick of
        the rollout) lands here, without telling the watchers: nothing the Python
        forwarder routes by changes, and a snapshot reads it on its own grid."""
        if at is None:
            self._verdicts.pop(model, None)
        else:
            self._verdicts[model] = at

    def shadow_of(self, model: str) -> Shadow | None:
        """The model's shadow step while it runs (None: none)."""
        return self._shadows.get(model)

    @property
    def shadows(self) -> Mapping[str, Shadow]:
        return self._shadows

    def set_shadow(self, model: str, shadow: Shadow | None) -> None:
        """A share of ``model``'s unversioned requests mirrored to a candidate from now
        on (the rollout's shadow step; None: none). The Python plane mirrors them, HAProxy
        sends that share to it (map ``shadow``)."""
        if shadow is None:
            self._shadows.pop(model, None)
        else:
            self._shadows[model] = shadow
        self._changed()

    def set_tenancy(self, spec: TenancySpec | None) -> Tenancy | None:
        """Tenants from now on (``PUT /v1/tenants``); ValueError when ``spec`` cannot be
        applied (nothing changes then). Requests in flight keep their counts."""
        tenancy = None if spec is None else Tenancy.from_spec(spec, self.config.queue_factor)
        self._tenancy = tenancy
        self._changed()
        return tenancy

    def set_preloaded(self, preloaded: bool) -> None:
        self._preloaded = preloaded

    def start_draining(self) -> None:
        self._draining = True

    def note_used(self, model: str, at: float | None = None) -> None:
        """A user request for ``model`` arrived (either data plane)."""
        self._last_used[model] = self.clock() if at is None else at

    def note_tenant(self, pool: str, tenant: str, at: float | None = None) -> None:
        """A request of ``tenant`` arrived at ``pool``, or it has requests in flight there
        (the data plane that saw it)."""
        self._activity.note(pool, tenant, self.clock() if at is None else at)

    def resolved(self, pool: Pool, specs: Iterable[MemberSpec]) -> list[str]:
        """A DNS pool's members are now ``specs`` (:meth:`Pool.resolved`); the keys that
        joined."""
        joined = pool.resolved(list(specs))
        self._changed()
        return joined

    # -- who follows -------------------------------------------------------------------
    def follow(self, follower: Follower) -> None:
        """``follower`` is awaited by :meth:`settle` (HAProxy applies the state now)."""
        self._followers.append(follower)

    def watch(self, watcher: Callable[[], None]) -> None:
        """``watcher`` is called after every change of routes, readiness or membership
        (the Python forwarder refreshes what it caches)."""
        self._watchers.append(watcher)

    async def settle(self) -> None:
        """Return once every follower routes by the state set so far: a lifecycle step
        that changed routing awaits this before it reports success."""
        for follower in self._followers:
            await follower()

    def _changed(self) -> None:
        for watcher in self._watchers:
            watcher()

    # -- misses: requests for a model no member holds --------------------------------------
    def on_miss(self, handler: MissHandler) -> None:
        """``handler`` holds a request for a model no member holds until one does (the
        residency's waiting room)."""
        self._miss_handler = handler

    async def wait_resident(self, model: str, deadline_s: float | None
                            ) -> frozenset[str] | None:
        """Return once ``model`` may take requests (at once when it may); raises what
        the waiting room answers when it cannot load in time. Returns the keys of the
        members that hold it when this state does not name them yet (a replica whose
        snapshot lags the control plane's answer: its request goes there), else None."""
        if self.resident(model):
            return None
        if self._miss_handler is None:
            raise Unavailable(f"no member holds model '{model}' and nothing loads it")
        return await self._miss_handler(model, deadline_s)

    def count_in_flight(self, reader: InFlightReader) -> None:
        """``reader`` says how many requests of a model a data plane has at a member
        (HAProxy's; the replicas' that run elsewhere, from the snapshot feed; the
        Python forwarder's in this process are counted on the member itself)."""
        self._in_flight_readers.append(reader)

    async def in_flight_at(self, model: str, member: PoolMember) -> int:
        """Requests of ``model`` at ``member`` now, every data plane together: an
        eviction unloads once this is 0."""
        total = member.model_in_flight.get(model, 0)
        for reader in self._in_flight_readers:
            total += await reader(model, member)
        return total

    # -- members back from the dead ------------------------------------------------------
    def on_recovery(self, hook: RecoveryHook) -> None:
        """``hook`` runs when a member comes back from the dead, before it is routable
        again (the lifecycle reloads the serving versions there)."""
        self._recovery.append(hook)

    def recovered(self, member: PoolMember, on_error: Callable[[BaseException], None]) -> None:
        """Run the recovery hooks for ``member`` in the background, held out of routing
        until they are done. A member back again while its last restore still runs (it
        failed again meanwhile) is restored anew, the old restore cancelled: that one
        may wait on a call the member's failure lost (a load has minutes), and the
        member stayed out of routing until it ended (CI: a Triton resumed from SIGSTOP
        refused connections for a moment, failed its check again, came back, and was
        never routable again within 30 s)."""
        if not self._recovery:
            return
        previous = self._restores.pop(member.key, None)
        if previous is not None and not previous.done():
            previous.cancel()  # (it leaves the member's flag to the new one)
            log.warning("member %s/%s came back while restoring: restoring it anew",
                        member.pool, member.key)
        elif not member.restore_started():
            return

        async def restore() -> None:
            try:
                for hook in self._recovery:
                    await hook(member)
            except Exception as exc:  # noqa: BLE001 - reported; the member serves what it has
                on_error(exc)
            finally:
                if self._restores.get(member.key) is task:  # not replaced by a newer one
                    del self._restores[member.key]
                    member.restore_done()
                    self._changed()
            try:
                await self.settle()  # routable again: HAProxy follows now
            except Exception as exc:  # noqa: BLE001 - it follows at its next round
                on_error(exc)

        task = asyncio.create_task(restore())
        self._restores[member.key] = task
        self._tasks.add(task)  # a strong reference until it is done
        task.add_done_callback(self._tasks.discard)
