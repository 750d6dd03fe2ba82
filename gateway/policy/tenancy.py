"""Tenants and priorities: who is refused first when a pool fills up.

Every API key belongs to a tenant (keys no tenant names, and requests without a key,
belong to the ``default`` tenant). A tenant has a priority class (``critical``,
``standard``, ``sheddable``), a weight, and optional limits of its own (requests in
flight, a rate). Configuration: the gateway file's ``tenancy:`` section, ``infergate up
--tenants FILE``, or ``PUT /v1/tenants`` live (:class:`TenancySpec`).

The signals, the same on both data planes:

- **load** of a pool: the requests the gateway has in flight to it now (the Python
  forwarder's count; HAProxy's ``be_conn`` of the pool's two backends), plus the
  requests queued in its Triton servers that are not the gateway's own (Triton's
  ``nv_inference_pending_request_count``, scraped once per probe round, beyond the
  gateway's in-flight to each member, the least over the last 4 s: load that lasts from
  other replicas and other clients, not the echo of the gateway's own requests in a
  gauge Triton refreshes every 2 s, :func:`queued_elsewhere`);
- **capacity** of a pool: ``capacity_per_member`` times members, the unit of
  ``infergate_pool_saturation`` (saturation = load / capacity);
- a tenant's requests in flight for the model in that pool, and in the whole gateway.

The rule (:func:`decide`), for a request of tenant *t* (class *k*) to a pool, checked
before the model's own admission bound (:mod:`.admission`, applied per class by
:meth:`Tenancy.model_bound`):

1. *t*'s ``max_in_flight`` reached: refused (``tenant_limit``);
2. load >= the ceiling of class *k* (:meth:`Tenancy.ceiling`: ``refuse_at[k]`` times
   capacity; by default sheddable 1 (1 + queue_factor / 4 in a pool that queues in the
   gateway, :meth:`Tenancy.in_pool`), standard 1 + queue_factor / 2, critical
   1 + queue_factor): refused (``saturated``). As the pool fills, sheddable goes first,
   then standard; critical keeps the room between the standard ceiling and its own, and
   is refused only at the hard bound;
3. load >= capacity (the pool is saturated) and *t* already has its share in flight:
   refused (``fair_share``).

Shares lend what nobody uses (:meth:`Tenancy.shares`): a tenant's share is its class
ceiling times its weight over the weights of the **active** tenants of its class, itself
counted. Active in a pool: requests in flight there, or one arrived within the last
:data:`ACTIVE_WINDOW_S` (:class:`TenantActivity`). A tenant alone in its class gets the
whole class ceiling; a tenant that arrives gets the share it has beside the active ones
at once (the table holds, for a tenant not active, its share as if it had just
arrived), and the active ones' shares shrink to make room for it within a probe round.
No admitted request is cut: a tenant above its new share is refused its next requests
until it is back under it. Below capacity nobody is held to a share.

Worked example: a pool of capacity 8, ``queue_factor`` 2 (standard ceiling 16), tenants
``web`` (weight 3) and ``app`` (weight 1), both standard, the default tenant standard.
``app`` alone: share 16 (only the ceiling, 16, refuses it). ``web`` arrives and floods:
``web`` 16 x 3/4 = 12, ``app`` 16 x 1/4 = 4; once the pool's load reaches 8, ``web`` is
refused from 12 in flight and ``app`` from 4; ``app`` stops for 2 s: ``web``'s share is
16 again. The default tenant, sending nothing, takes no share.

Refusals are 429 / RESOURCE_EXHAUSTED with ``Retry-After`` and a message naming the
reason, answered after :func:`refusal_delay_ms` (the tenancy's ``refusal_delay_ms``, a
tarpit, longer for a tenant with many refusals waiting): a client that retries every
refusal at once is slowed by its own concurrency (about ``refusals_per_s`` refusals a
second, however many requests it keeps refused), instead of taking the CPU Triton and
the other tenants need to be refused thousands of times a second. The request waits on
its own (HAProxy's ``http-request tarpit`` in a backend whose ``timeout tarpit`` is that
wait, one backend per wait :func:`refusal_waits_ms` lists; an ``asyncio.sleep`` of its
own task on the Python plane), counted only among its tenant's
refusals waiting: neither in the tenant's requests in flight nor in the pool's load. A
request whose deadline (ms) leaves no room for the delay within 9/10 of it is answered
at once (a gRPC client must read RESOURCE_EXHAUSTED, not its own DEADLINE_EXCEEDED).
The other refusals (rates, the model's bound, deadlines, readiness) are answered at
once. Admitted requests queue in Triton, or, in a pool with ``gateway_queue``, in the
gateway, in the order of :mod:`gateway.policy.queueing` (class, then the tenant's
virtual time by its weight); the load above counts them either way.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace

from gateway.config.tenancy import (
    DEFAULT_REFUSAL_DELAY_MS,
    DEFAULT_REFUSALS_PER_S,
    DEFAULT_TENANT,
    MAX_REFUSAL_DELAY_MS,
    Priority,
    TenancySpec,
    TenantLimits,
)
from gateway.policy.access import configured_digest, key_digest
from gateway.policy.deadline import SHARE_DEN, SHARE_NUM
from gateway.policy.rate import RateClass

RETRY_AFTER_S = 1

TENANT_LIMIT = "tenant '{tenant}' has {count} requests in flight (its limit {limit})"
SATURATED = ("pool '{pool}' is saturated: load {load} for capacity {capacity}; "
             "{priority} requests are refused from load {ceiling}")
FAIR_SHARE = ("pool '{pool}' is saturated (load {load} for capacity {capacity}) and "
              "tenant '{tenant}' has its share in flight ({share})")
RATE_WHO = "tenant '{tenant}'"


REASONS = ("tenant_limit", "saturated", "fair_share")  # refusal reasons of decide()
# a refusal waiting longer than the tenancy's delay waits a multiple of this
REFUSAL_WAIT_STEP_MS = 50
assert MAX_REFUSAL_DELAY_MS % REFUSAL_WAIT_STEP_MS == 0
# classes at least as important as each: the model's bound counts a request of class k
# against the requests of these (Tenancy.model_bound)
AT_LEAST = {Priority.CRITICAL: (Priority.CRITICAL,),
            Priority.STANDARD: (Priority.CRITICAL, Priority.STANDARD),
            Priority.SHEDDABLE: (Priority.CRITICAL, Priority.STANDARD, Priority.SHEDDABLE)}
ACTIVE_WINDOW_S = 2.0  # a tenant with no request in flight is active this long after one
# a pool that queues in the gateway refuses the sheddable class from 1 + queue_factor x
# this times its capacity (1.5x with the default queue_factor 2), not 1x: a sheddable
# flood refused from 1x left the member idle between its refused clients' retries
QUEUED_SHEDDABLE = 0.25


@dataclass(frozen=True)
class Tenant:
    name: str
    priority: Priority
    weight: float
    max_in_flight: int | None = None
    rate: RateClass | None = None

    def rate_message(self) -> str:
        assert self.rate is not None
        return self.rate.message(RATE_WHO.format(tenant=self.name))


@dataclass(frozen=True)
class Refusal:
    reason: str  # one of REASONS
    message: str


@dataclass(frozen=True)
class Standing:
    """What :func:`decide` weighs, every count without the request being decided."""

    pool: str
    load: int  # the pool's load (module docstring)
    capacity: int
    ceiling: int  # of the tenant's class in this pool
    here: int  # the tenant's requests in flight for this model in this pool
    share: int  # the tenant's share in this pool
    total: int = 0  # the tenant's requests in flight in the gateway


def decide(tenant: Tenant, s: Standing) -> Refusal | None:
    """Admit (None) or refuse, by the module's rule."""
    if tenant.max_in_flight is not None and s.total >= tenant.max_in_flight:
        return Refusal("tenant_limit", TENANT_LIMIT.format(
            tenant=tenant.name, count=s.total + 1, limit=tenant.max_in_flight))
    if s.load >= s.ceiling:
        return Refusal("saturated", SATURATED.format(
            pool=s.pool, load=s.load, capacity=s.capacity, priority=tenant.priority.value,
            ceiling=s.ceiling))
    if s.load >= s.capacity and s.here >= s.share:
        return Refusal("fair_share", FAIR_SHARE.format(
            pool=s.pool, load=s.load, capacity=s.capacity, tenant=tenant.name, share=s.share))
    return None


def refusal_delay_ms(delay_ms: int, deadline_ms: int | None, waiting: int = 1,
                     per_s: int = DEFAULT_REFUSALS_PER_S) -> int:
    """Milliseconds a refusal of :func:`decide` waits before it is answered: the
    tenancy's ``refusal_delay_ms``, or longer where the tenant has many refusals waiting:
    ``waiting`` (its refusals waiting for their answers, this one counted) x 1000 /
    ``per_s`` (the tenancy's ``refusals_per_s``), at most ``MAX_REFUSAL_DELAY_MS``, so
    that a tenant keeping N requests refused is answered about ``per_s`` refusals a
    second however large N, and a tenant refused now and then only the delay. A
    request's deadline (``deadline_ms``, None without one) bounds it to 9/10 of the
    deadline (``deadline.SHARE_NUM`` / ``SHARE_DEN``, the share deadline shedding keeps);
    where even the tenancy's delay does not fit there: 0, answered at once, before the
    client's own deadline ends the call. A wait longer than the delay is a multiple of
    ``REFUSAL_WAIT_STEP_MS``, rounded up (down where the deadline bounds it, never below
    the delay): one of :func:`refusal_waits_ms`, each a tarpit of its own on HAProxy's
    plane. In integers, as HAProxy computes it."""
    if delay_ms <= 0:
        return 0
    if deadline_ms is not None and delay_ms * SHARE_DEN > deadline_ms * SHARE_NUM:
        return 0
    wait = max(delay_ms, min(MAX_REFUSAL_DELAY_MS, waiting * 1000 // per_s))
    if wait > delay_ms:
        wait = -(-wait // REFUSAL_WAIT_STEP_MS) * REFUSAL_WAIT_STEP_MS
    if deadline_ms is not None:
        bound = deadline_ms * SHARE_NUM // SHARE_DEN
        if wait > bound:
            wait = max(delay_ms, bound // REFUSAL_WAIT_STEP_MS * REFUSAL_WAIT_STEP_MS)
    return wait


def refusal_waits_ms(delay_ms: int) -> tuple[int, ...]:
    """Every wait :func:`refusal_delay_ms` gives a refusal (0 aside) for the tenancy's
    ``delay_ms``: the delay, then each step above it up to ``MAX_REFUSAL_DELAY_MS``."""
    if delay_ms <= 0:
        return ()
    steps = range(REFUSAL_WAIT_STEP_MS, MAX_REFUSAL_DELAY_MS + 1, REFUSAL_WAIT_STEP_MS)
    return (delay_ms, *(step for step in steps if step > delay_ms))


def split_shares(ceilings: Mapping[Priority, int],
                 tenants: Iterable[tuple[str, Priority, float]],
                 active: Collection[str]) -> dict[str, int]:
    """Every tenant's share ``(name, class, weight)`` of a pool whose class ceilings are
    ``ceilings`` while the tenants ``active`` are: its class ceiling times its weight over
    the weights of the active tenants of its class, itself counted (a tenant not active:
    its share were it to arrive now); at least 1. It is room a tenant keeps once the pool
    is saturated; below capacity the pool is anyone's. Both planes (and each data-plane
    replica, over what it sees) compute it."""
    tenants = list(tenants)
    weight_of: dict[Priority, float] = {}
    for name, priority, weight in tenants:
        if name in active:
            weight_of[priority] = weight_of.get(priority, 0.0) + weight
    shares = {}
    for name, priority, weight in tenants:
        others = weight_of.get(priority, 0.0) - (weight if name in active else 0.0)
        shares[name] = max(1, math.floor(ceilings[priority] * weight / (weight + others)
                                         + 1e-9))
    return shares


class TenantActivity:
    """Which tenants are active in each pool (the module docstring): noted by the data
    plane that sees them, a request's arrival (the Python forwarder) or a probe round's
    reading of HAProxy's tables (requests in flight or arrived within the window)."""

    def __init__(self, window_s: float = ACTIVE_WINDOW_S) -> None:
        self.window_s = window_s
        self._seen: dict[str, dict[str, float]] = {}  # pool -> tenant -> when last seen

    def note(self, pool: str, tenant: str, now: float) -> None:
        self._seen.setdefault(pool, {})[tenant] = now

    def active(self, pool: str, now: float) -> frozenset[str]:
        seen = self._seen.get(pool)
        if not seen:
            return frozenset()
        return frozenset(t for t, when in seen.items() if now - when <= self.window_s)


ELSEWHERE_WINDOW_S = 4.0  # twice Triton's default metrics interval (2 s)


def queued_elsewhere(samples: Iterable[tuple[float, int, int]], now: float) -> int:
    """Requests queued in a member that are not the gateway's, from its probes' samples
    ``(when, pending, ours)``: Triton's pending count beyond the gateway's in-flight to
    it (ours may be queued too: not counted twice), the least over the last
    :data:`ELSEWHERE_WINDOW_S`. Triton refreshes the pending gauge every 2 s, so right
    after a burst of the gateway's own it still shows the burst while the gateway's
    count is back to zero; the least over the window keeps that from counting as load,
    and counts load that lasts (another gateway replica's, another client's)."""
    recent = [max(0, pending - ours) for when, pending, ours in samples
              if now - when <= ELSEWHERE_WINDOW_S]
    return min(recent, default=0)


@dataclass(frozen=True)
class Tenancy:
    """A :class:`TenancySpec` made ready for lookups: tenants by name and key digest,
    class ceilings resolved against the gateway's ``queue_factor``."""

    tenants: tuple[Tenant, ...]  # the default first
    keys: tuple[tuple[str, str], ...]  # (key digest, tenant name), sorted
    refuse_at: tuple[tuple[Priority, float], ...]  # in a pool that queues in Triton
    refusal_delay_ms: int = DEFAULT_REFUSAL_DELAY_MS  # refusal_delay_ms() applies it
    refusals_per_s: int = DEFAULT_REFUSALS_PER_S  # ... and this
    # in a pool that queues in the gateway (gateway_queue); empty: as refuse_at
    refuse_at_queued: tuple[tuple[Priority, float], ...] = ()
    triton_levels: bool = True  # the class as Triton's level (gateway.policy.triton_priority)

    @classmethod
    def from_spec(cls, spec: TenancySpec, queue_factor: float) -> Tenancy:
        """Ceilings not given derive from ``queue_factor``: standard 1 + queue_factor / 2,
        critical 1 + queue_factor, sheddable 1 where the pool queues in Triton, and
        1 + queue_factor / 4 where it queues in the gateway (:data:`QUEUED_SHEDDABLE`):
        there the class order puts every waiting critical and standard request ahead of
        it, so the sheddable class may wait too, and a member whose slot frees takes the
        next request from the queue at once instead of idling until a refused client
        tries again."""
        def tenant(name: str, t: TenantLimits) -> Tenant:
            return Tenant(name, t.priority, t.weight, t.max_in_flight,
                          RateClass.of(t.rate) if t.rate else None)

        given = spec.refuse_at
        sheddable = given.sheddable if given.sheddable is not None else 1.0
        standard = given.standard if given.standard is not None else 1 + queue_factor / 2
        critical = given.critical if given.critical is not None else 1 + queue_factor
        standard = max(standard, sheddable)  # a derived one follows given ones
        critical = max(critical, standard)
        queued = (given.sheddable if given.sheddable is not None
                  else min(standard, 1 + queue_factor * QUEUED_SHEDDABLE))
        refuse_at = ((Priority.SHEDDABLE, sheddable), (Priority.STANDARD, standard),
                     (Priority.CRITICAL, critical))
        refuse_at_queued = ((Priority.SHEDDABLE, max(sheddable, queued)),
                            (Priority.STANDARD, standard), (Priority.CRITICAL, critical))
        return cls(
            tenants=(tenant(DEFAULT_TENANT, spec.default),
                     *(tenant(t.name, t) for t in spec.tenants)),
            keys=tuple(sorted((configured_digest(k), t.name)
                              for t in spec.tenants for k in t.keys)),
            refuse_at=refuse_at,
            refusal_delay_ms=spec.refusal_delay_ms,
            refusals_per_s=spec.refusals_per_s,
            refuse_at_queued=() if refuse_at_queued == refuse_at else refuse_at_queued,
            triton_levels=spec.triton_levels,
        )

    def in_pool(self, gateway_queue: bool) -> Tenancy:
        """The rules a pool applies, asked of the gateway's rules: one that queues in
        the gateway (``gateway_queue``) its own class ceilings (:attr:`refuse_at_queued`,
        where they differ), whose ceilings, shares and model bounds follow them; one that
        queues in Triton these. (The rules returned are a pool's: ask them no further.)"""
        if not gateway_queue or not self.refuse_at_queued:
            return self
        return self._queued

    @functools.cached_property
    def _queued(self) -> Tenancy:
        """:meth:`in_pool`'s rules for a pool that queues in the gateway, made once (the
        Python plane asks per request)."""
        return replace(self, refuse_at=self.refuse_at_queued, refuse_at_queued=())

    @property
    def default(self) -> Tenant:
        return self.tenants[0]

    def by_name(self) -> dict[str, Tenant]:
        return {t.name: t for t in self.tenants}

    def by_digest(self) -> dict[str, Tenant]:
        names = self.by_name()
        return {digest: names[name] for digest, name in self.keys}

    def ceiling(self, priority: Priority, capacity: int) -> int:
        """The load from which ``priority`` is refused in a pool of ``capacity``."""
        factor = dict(self.refuse_at)[priority]
        return max(1, math.floor(factor * capacity + 1e-9))

    def shares(self, capacity: int, active: Collection[str] = ()) -> dict[str, int]:
        """Every tenant's share of a pool of ``capacity`` while the tenants ``active`` are
        (:func:`split_shares`)."""
        ceilings = {p: self.ceiling(p, capacity) for p, _ in self.refuse_at}
        return split_shares(ceilings, ((t.name, t.priority, t.weight) for t in self.tenants),
                            active)

    def model_bound(self, priority: Priority, in_system: int) -> int:
        """The model's own bound for a class (:mod:`.admission`'s ``in_system`` is the
        critical one): scaled by the class ceilings, ``refuse_at[k] / refuse_at[critical]``
        (:meth:`bound_permille`), so lower classes are refused first. A request of class
        *k* counts the model's requests of *k* and of the classes above it
        (:data:`AT_LEAST`): room a lower class holds never refuses a higher one."""
        return max(1, in_system * self.bound_permille(priority) // 1000)

    def bound_permille(self, priority: Priority) -> int:
        """``refuse_at[k] / refuse_at[critical]`` in thousandths, rounded up (a third is
        334: a bound of 12 gives sheddable 4, not 3). HAProxy computes the same bound
        with the same integers (``mul``, then ``div(1000)``)."""
        factors = dict(self.refuse_at)
        return math.ceil(1000 * factors[priority] / factors[Priority.CRITICAL] - 1e-9)


class TenantDirectory:
    """Who a presented key belongs to, for the Python forwarder (HAProxy looks the same
    digest up in its ``tenants`` map)."""

    def __init__(self, tenancy: Tenancy) -> None:
        self.tenancy = tenancy
        self._by_digest = tenancy.by_digest()

    def tenant_of(self, api_key: str | None) -> Tenant:
        if not api_key:  # an empty key is no key
            return self.tenancy.default
        return self._by_digest.get(key_digest(api_key), self.tenancy.default)


def describe(tenancy: Tenancy, capacities: Mapping[str, int],
             active: Mapping[str, Collection[str]] | None = None,
             queued: Collection[str] = (),
             lanes: Mapping[str, int] | None = None) -> dict[str, object]:
    """What ``GET /v1/tenants`` shows: tenants (key digests, never keys) and, per pool,
    its capacity, class ceilings (those of :meth:`Tenancy.in_pool`: the pools named in
    ``queued`` queue in the gateway, with ``lanes``' lane_per_member), the active tenants
    and every tenant's share now."""
    active = active or {}
    keys: dict[str, list[str]] = {}
    for digest, name in tenancy.keys:
        keys.setdefault(name, []).append(f"sha256:{digest}")

    def pool(name: str, cap: int) -> dict[str, object]:
        rules = tenancy.in_pool(name in queued)
        return {"capacity": cap, "gateway_queue": name in queued,
                "lane_per_member": (lanes or {}).get(name, 0) if name in queued else 0,
                "ceilings": {p.value: rules.ceiling(p, cap) for p, _ in rules.refuse_at},
                "active": sorted(active.get(name, ())),
                "shares": rules.shares(cap, active.get(name, ()))}

    return {
        "tenants": [{
            "name": t.name, "priority": t.priority.value, "weight": t.weight,
            "max_in_flight": t.max_in_flight,
            "rate": None if t.rate is None else {"rate_per_s": t.rate.rate_per_s,
                                                 "burst": t.rate.burst},
            "keys": keys.get(t.name, []),
        } for t in tenancy.tenants],
        "refuse_at": {p.value: f for p, f in tenancy.refuse_at},
        "refuse_at_gateway_queue": {p.value: f for p, f in tenancy.in_pool(True).refuse_at},
        "refusal_delay_ms": tenancy.refusal_delay_ms,
        "refusals_per_s": tenancy.refusals_per_s,
        "triton_levels": tenancy.triton_levels,
        "pools": {name: pool(name, cap) for name, cap in sorted(capacities.items())},
    }


__all__ = ["ACTIVE_WINDOW_S", "AT_LEAST", "DEFAULT_TENANT", "QUEUED_SHEDDABLE", "Priority",
           "Refusal", "Standing", "Tenancy", "TenantActivity", "TenantDirectory", "decide",
           "queued_elsewhere", "refusal_delay_ms", "split_shares"]
