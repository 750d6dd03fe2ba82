"""The transport-free core of the gateway.

``Forwarder.forward`` is what both the HTTP and the gRPC adapters call for every model
request. It applies the request policy (``gateway/policy``) in its order, as HAProxy's
rules do: the API key's rate limit, the model's route, its readiness, its admission
limit (requests in the gateway, refused at once beyond it); a model no member holds
(residency) waits for its load first; then the routing policy's
choice of member, the upstream call supplied by the adapter (bytes in, bytes out), one
retry on another member when the first fails with :class:`Unavailable`, passive
ejection of the failed member, and metrics.

During a rollout's shadow step (:class:`gateway.policy.rollout.Shadow`) the transports
ask :meth:`Forwarder.shadow` whether a request they pinned to stable is mirrored, and
hand its copy for the candidate to :meth:`Forwarder.mirror`: a task of its own, started
once the user's answer is in hand, bounded in number, never awaited by the request.

This module imports neither ``fastapi`` nor ``grpc``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from gateway.config import GatewayConfig
from gateway.core import Core
from gateway.errors import (
    CANCELLED_OUTCOME,
    DeadlineExceeded,
    GatewayError,
    ModelNotReady,
    Overloaded,
    Unavailable,
    outcome_name,
)
from gateway.metrics import GatewayMetrics
from gateway.policy import admission, deadline, queueing, readiness, tenancy, triton_priority
from gateway.policy.model_name import grpc_names_version
from gateway.policy.rate import RateLimiter, configured_classes
from gateway.policy.rollout import Shadow, pin_grpc_version
from gateway.policy.routing import RoutingPolicy
from gateway.policy.tenancy import Tenant, TenantDirectory
from gateway.policy.upstream import RETRIES, EjectionPolicy
from gateway.pools import Pool, PoolMember
from gateway.python.queueing import PoolQueue, QueueTimeout
from gateway.python.tenants import TenantLedger
from gateway.state import GatewayState

T = TypeVar("T")
log = logging.getLogger(__name__)

UpstreamCall = Callable[[PoolMember], Awaitable[T]]
# milliseconds the current request waited for its model to load (a miss; unset: a hit):
# the transports answer it in the ``infergate-load-wait-ms`` header / trailing metadata
LOAD_WAIT_MS: ContextVar[int | None] = ContextVar("infergate_load_wait_ms", default=None)
LOAD_WAIT_HEADER = "infergate-load-wait-ms"
MIRROR_TIMEOUT_S = 30.0  # a mirror's own deadline (nobody waits for it)


@dataclass(frozen=True)
class RequestOptions:
    """What the transports extract from a request besides its bytes."""

    deadline_s: float | None = None  # seconds left for the client, None = no deadline
    api_key: str | None = None
    traffic: str = "user"  # "warmup" for synthetic keep-warm requests
    # of deadline_s, the grace HAProxy added to a stream's (deadline.STREAM_GRACE_MS):
    # the gateway waits that long, the client's own deadline is the rest
    grace_s: float = 0.0

    @property
    def client_deadline_s(self) -> float | None:
        """Seconds left until the client's own deadline (None: no deadline)."""
        return None if self.deadline_s is None else self.deadline_s - self.grace_s


NO_OPTIONS = RequestOptions()
MIRROR_OPTIONS = RequestOptions(deadline_s=MIRROR_TIMEOUT_S, traffic="shadow")
# a mirror's answer compared with stable's: (its outcome label, their agreement or None)
Compare = Callable[[T], tuple[str, float | None]]


@dataclass
class ModelRoute:
    """Per-model state the forwarder caches on first use: its pools and admission limit
    (refreshed when the gateway's state changes), the count in the gateway, metric
    children."""

    model: str
    pools: list[Pool]
    limits: admission.AdmissionLimits
    # the member keys that hold it, in a pool with residency (None: every member)
    holders: frozenset[str] | None = None
    in_system: int = 0  # requests of this model in the gateway now
    by_class: Counter[str] = field(default_factory=Counter)  # of them, per tenant class
    children: dict[tuple[str, ...], Any] = field(default_factory=dict)

    def follow(self, state: GatewayState) -> None:
        self.pools = state.pools_for(self.model)
        self.limits = state.admission_limits(self.model, self.pools)
        self.holders = state.holders(self.model)


def _routable(pool: Pool) -> int:
    """Members of ``pool`` a request may go to now (their slots are the queue's)."""
    return sum(1 for m in pool.members if m.healthy and not m.restoring)


@dataclass
class Forwarder:
    """The Python forwarder: reads what the gateway knows (``state``), owns only what it
    counts itself (per-model routes, rate windows, metric children)."""

    core: Core
    policy: RoutingPolicy = field(default_factory=RoutingPolicy)
    ejection: EjectionPolicy = field(default_factory=EjectionPolicy)
    rng: random.Random = field(default_factory=random.Random)
    routes: dict[str, ModelRoute] = field(default_factory=dict)
    rate_limiter: RateLimiter = field(init=False)
    tenants: TenantDirectory | None = field(init=False, default=None)
    ledger: TenantLedger = field(init=False, default_factory=TenantLedger)
    _tenant_children: dict[tuple[str, ...], Any] = field(init=False, default_factory=dict)
    # the pools that queue in the gateway: their slots and waiting requests
    queues: dict[str, PoolQueue] = field(init=False, default_factory=dict)
    # tenant -> its refusals waiting for their answers (their delay grows with them)
    _refusals_waiting: Counter[str] = field(init=False, default_factory=Counter)
    _mirrors: set[asyncio.Task[None]] = field(init=False, default_factory=set)

    def __post_init__(self) -> None:
        default, per_key = configured_classes(self.state.config.rate_limits)
        self.rate_limiter = RateLimiter(default, per_key, clock=self.clock)
        self.state.watch(self._refresh_routes)
        self.core.telemetry.each_round(self._note_tenants_in_flight)
        self.core.telemetry.each_round(self._grant_slots)
        self._refresh_routes()

    @classmethod
    def for_config(cls, config: GatewayConfig, metrics: GatewayMetrics | None = None,
                   clock: Callable[[], float] = time.monotonic) -> Forwarder:
        """A forwarder over a new state of ``config``'s pools (tests)."""
        return cls(Core.for_config(config, metrics, clock))

    @property
    def state(self) -> GatewayState:
        return self.core.state

    @property
    def metrics(self) -> GatewayMetrics:
        return self.core.metrics

    @property
    def clock(self) -> Callable[[], float]:
        return self.state.clock

    # -- lookups -----------------------------------------------------------------------
    def route(self, model: str) -> ModelRoute:
        route = self.routes.get(model)
        if route is None:
            pools = self.state.serving_pools(model)
            route = self.routes[model] = ModelRoute(
                model, pools, self.state.admission_limits(model, pools),
                holders=self.state.holders(model))
        return route

    def _refresh_routes(self) -> None:
        """The state changed (a model's pools, DNS membership): cached routes follow, in
        place (requests in the gateway stay counted)."""
        for route in self.routes.values():
            route.follow(self.state)
        self._grant_slots()
        tenancy_now = self.state.tenancy
        if tenancy_now is None:
            self.tenants = None
        elif self.tenants is None or self.tenants.tenancy is not tenancy_now:
            self.tenants = TenantDirectory(tenancy_now)

    # -- the request path --------------------------------------------------------------
    async def forward(
        self,
        model: str,
        call: UpstreamCall[T],
        *,
        protocol: str,
        options: RequestOptions = NO_OPTIONS,
        outcome: Callable[[T], str] | None = None,
        metered: bool = True,
        version: int | None = None,
    ) -> T:
        """Admit, route and run ``call``; ``metered=False`` skips the request policy's
        rate and admission checks and metrics (metadata and config calls). ``version``:
        the version :meth:`pin` chose for it (its answer is tallied for the rollout)."""
        if not metered:
            return (await self._attempts(self.route(model), call, protocol, options))[0]
        tenant = self.tenants.tenant_of(options.api_key) if self.tenants else None
        try:  # the policy's order: rate, route, readiness, admission
            if tenant is not None and tenant.rate is not None:
                self.rate_limiter.check_tenant(tenant.name, tenant.rate, tenant.rate_message())
            else:
                self.rate_limiter.check(options.api_key)
        except Overloaded as err:
            with contextlib.suppress(GatewayError):  # counted for a model it serves
                self._refused(self.route(model), protocol, options, err, tenant, "rate")
            raise
        route = self.route(model)
        started, patience = self.clock(), options.client_deadline_s
        if options.traffic == "user":
            self.state.note_used(model, started)
        held_by = None  # where a miss's answer says the model is, before the state does
        if route.holders is not None and not self.state.resident(model):
            options, held_by = await self._wait_resident(route, protocol, options, tenant)
        try:
            pool = self._admit(route, options, tenant)
        except GatewayError as err:
            self._refused(route, protocol, options, err, tenant,
                          err.reason if isinstance(err, Overloaded)
                          else "deadline" if isinstance(err, DeadlineExceeded) else "")
            await self._tarpit(err, options, tenant)
            raise
        queue, release = self._queue(pool), None
        try:
            if queue is not None:
                assert pool is not None
                options, release = await self._wait_turn(queue, route, pool, protocol,
                                                         options, tenant)
            elif tenant is not None:
                self._tenant_child("queue_wait", tenant).observe(0.0)
            result, served_by = await self._attempts(route, call, protocol, options, pool,
                                                     held_by)
        except GatewayError:
            if version is not None:
                now = self.clock()
                self.state.tally.record(model, version, False, now - started, now)
            raise
        except asyncio.CancelledError:  # its client gave up (a gRPC call cancelled)
            gave_up = CANCELLED_OUTCOME  # or its deadline ended it (its own timer, or ours)
            if deadline.given_up_at_deadline((self.clock() - started) * 1000,
                                             None if patience is None else patience * 1000):
                gave_up = outcome_name(DeadlineExceeded)
            self._count(route, pool.name if pool is not None else "-", protocol, gave_up,
                        options.traffic)
            if tenant is not None:
                self._tenant_child("requests", tenant, gave_up).inc()
            raise
        finally:
            self._count_in(route, -1, pool, tenant)
            if release is not None:
                release()
        outcome_label = outcome(result) if outcome else "success"
        self._count(route, served_by, protocol, outcome_label, options.traffic)
        elapsed = self.clock() - started
        if version is not None:
            self.state.tally.record(model, version, outcome_label == "success", elapsed,
                                    started + elapsed)
        self._child(route, ("latency", served_by, protocol, options.traffic)).observe(elapsed)
        if tenant is not None:
            self._tenant_child("requests", tenant, outcome_label).inc()
            self._tenant_child("latency", tenant).observe(elapsed)
        return result

    async def _wait_resident(self, route: ModelRoute, protocol: str, options: RequestOptions,
                             tenant: Tenant | None
                             ) -> tuple[RequestOptions, frozenset[str] | None]:
        """A miss: no member holds the model. Wait in the residency's waiting room while
        it loads (bounded by the room's size and by the request's deadline); the options
        with the deadline that is left, and the members the wait's answer names when the
        state does not yet (:meth:`GatewayState.wait_resident`). The wait is said in
        :data:`LOAD_WAIT_MS`."""
        began = self.clock()
        try:
            held_by = await self.state.wait_resident(route.model, options.deadline_s)
        except GatewayError as err:
            self._refused(route, protocol, options, err, tenant, "loading")
            raise
        waited = self.clock() - began
        LOAD_WAIT_MS.set(round(waited * 1000))
        if options.deadline_s is None:
            return options, held_by
        return replace(options, deadline_s=options.deadline_s - waited), held_by

    def _queue(self, pool: Pool | None) -> PoolQueue | None:
        """The queue of a pool that queues in the gateway (made on first use)."""
        if pool is None or not pool.spec.gateway_queue:
            return None
        queue = self.queues.get(pool.name)
        if queue is None:
            def slots(pool: Pool = pool) -> int:
                return pool.spec.capacity_per_member * _routable(pool)

            def lane(pool: Pool = pool) -> int:
                return pool.spec.lane_per_member * _routable(pool)
            queue = self.queues[pool.name] = PoolQueue(slots, self.clock, lane)
        return queue

    def _grant_slots(self) -> None:
        """Members may have come back: their slots go to the waiting requests."""
        for queue in self.queues.values():
            queue.grant()

    async def _wait_turn(self, queue: PoolQueue, route: ModelRoute, pool: Pool, protocol: str,
                         options: RequestOptions, tenant: Tenant | None
                         ) -> tuple[RequestOptions, Callable[[], None]]:
        """A slot of ``pool``: the lane's, at once, for a light tenant's request that
        finds the pool's full (``queueing.takes_lane``), else one waited for in the
        policy's order (class, then the tenant's virtual time) at most the pool's bound
        or the request's deadline; the options with the deadline that is left, and what
        gives the slot back."""
        backlog, cost = 0, queueing.cost_us(1.0)
        if tenant is not None:  # counted in already: the others are its backlog
            backlog = self.ledger.here[route.model, pool.name, tenant.name] - 1
            cost = queueing.cost_us(tenant.weight)
            # a managed model's requests have no lane (HAProxy: its backends have none)
            lane = pool.spec.lane_per_member if route.holders is None else 0
            if queueing.takes_lane(tenant.priority, backlog, lane) and queue.take_lane():
                self._tenant_child("queue_wait", tenant).observe(0.0)
                return options, queue.release_lane
        key = queueing.order_key(tenant.priority if tenant else None,
                                 int(self.clock() * 1000), queueing.offset_ms(backlog, cost))
        bound_ms = pool.spec.max_queue_wait_ms
        passes = options.deadline_s is not None and options.deadline_s * 1000 < bound_ms
        limit = options.deadline_s if passes and options.deadline_s is not None \
            else bound_ms / 1000
        try:
            waited = await queue.acquire(key, limit)
        except QueueTimeout as exc:
            message = queueing.expired_message(pool.name, int(exc.waited_s * 1000), bound_ms,
                                               exc.members, passes)
            err: GatewayError = (DeadlineExceeded(message) if exc.members or passes
                                 else Unavailable(message))
            self._count(route, "-", protocol, outcome_name(err), options.traffic)
            if tenant is not None:
                self._tenant_child("requests", tenant, outcome_name(err)).inc()
            raise err from None
        if tenant is not None:
            self._tenant_child("queue_wait", tenant).observe(waited)
        left = None if options.deadline_s is None else options.deadline_s - waited
        return replace(options, deadline_s=left), queue.release

    def triton_level(self, model: str, options: RequestOptions) -> int | None:
        """The Triton priority level the request's class gets at ``model``, None: none
        (no tenancy, or a model without levels; gateway/policy/triton_priority.py)."""
        if self.tenants is None or not self.tenants.tenancy.triton_levels:
            return None
        levels = self.state.priority_levels(model)  # most models none: no key looked up
        if levels < 2:
            return None
        return triton_priority.level(self.tenants.tenant_of(options.api_key).priority, levels)

    def pin(self, model: str) -> int | None:
        """The version an unversioned request of ``model`` goes to while it is rolled
        out (:class:`gateway.policy.rollout.Split`); None: no rollout, no pin."""
        split = self.state.split_of(model)
        return None if split is None else split.pick(self.rng.randrange(100))

    def pin_grpc(self, model: str, message: bytes) -> tuple[bytes, int | None]:
        """A ``ModelInferRequest``'s wire bytes pinned by :meth:`pin` (``model_version``
        appended), and the version; unchanged (None) when it names a version itself."""
        version = self.pin(model)
        if version is None or grpc_names_version(message):
            return message, None
        return pin_grpc_version(message, version), version

    # -- the shadow step -------------------------------------------------------------------
    def shadow(self, model: str, version: int | None, marked: bool = False) -> Shadow | None:
        """The model's shadow step when this request is mirrored to its candidate: a
        request going to stable (``version``: as pinned, or as HAProxy pinned it),
        drawn at the shadow's percent, or ``marked`` by HAProxy's own draw."""
        shadow = self.state.shadow_of(model)
        if shadow is None or version != shadow.stable:
            return None
        return shadow if marked or shadow.sampled(self.rng.randrange(100)) else None

    def mirror(self, shadow: Shadow, model: str, protocol: str, call: UpstreamCall[T],
               stable: tuple[bool, float], compare: Compare[T]) -> None:
        """Send the request's copy for the candidate (``call``) in a task of its own
        and tally it beside stable's answer (``stable``: ok, seconds); ``compare`` its
        answer with stable's. Beyond ``shadow.max_in_flight`` mirrors at once: none,
        counted skipped. Never raises, never waited for."""
        if not shadow.admit():
            return
        task = asyncio.get_running_loop().create_task(
            self._mirror(shadow, model, protocol, call, stable, compare))
        self._mirrors.add(task)
        task.add_done_callback(self._mirrors.discard)

    async def _mirror(self, shadow: Shadow, model: str, protocol: str, call: UpstreamCall[T],
                      stable: tuple[bool, float], compare: Compare[T]) -> None:
        started = self.clock()
        outcome, agreement = "upstream_error", None
        try:
            route = self.route(model)
            result, served_by = await self._attempts(route, call, protocol, MIRROR_OPTIONS)
            outcome, agreement = compare(result)
            self._count(route, served_by, protocol, outcome, MIRROR_OPTIONS.traffic)
        except GatewayError as err:
            outcome = outcome_name(err)
        except Exception:  # noqa: BLE001 - a mirror never fails anything but itself
            log.exception("mirroring a request of %s to version %d", model, shadow.candidate)
        finally:
            shadow.done()
        ok = outcome == "success"
        shadow.tally.record(stable[0], stable[1], ok, self.clock() - started,
                            agreement if ok and stable[0] else None)

    def _admit(self, route: ModelRoute, options: RequestOptions,
               tenant: Tenant | None) -> Pool | None:
        """Readiness; the pool, chosen now; with tenants the tenancy rule on it; the
        model's bound (per class, with tenants); a deadline the pool cannot meet
        (:mod:`gateway.policy`). Counts the request in; the pool."""
        reason = self.state.not_ready_reason(route.model)
        if reason is not None:
            raise ModelNotReady(readiness.not_ready_message(route.model, reason),
                                retry_after_s=readiness.RETRY_AFTER_S)
        if options.deadline_s is not None and options.deadline_s <= 0:
            raise DeadlineExceeded(deadline.EXPIRED)
        pool = self.policy.choose_pool(route.pools, route.model, self.clock(), self.rng)
        limit, count = route.limits.in_system, route.in_system
        tenancy_now = self.tenants.tenancy if self.tenants is not None else None
        if tenant is not None and tenancy_now is not None:
            if pool is not None:
                tenancy_now = tenancy_now.in_pool(pool.spec.gateway_queue)
                self.state.note_tenant(pool.name, tenant.name)
                standing = self.ledger.standing(
                    tenancy_now, tenant, route.model, pool.name, pool.capacity,
                    self.state.queued_elsewhere(pool), self.state.active_tenants(pool.name))
                refusal = tenancy.decide(tenant, standing)
                if refusal is not None:
                    raise Overloaded(refusal.message, retry_after_s=tenancy.RETRY_AFTER_S,
                                     reason=refusal.reason)
            limit = tenancy_now.model_bound(tenant.priority, limit)
            count = sum(route.by_class[c] for c in tenancy.AT_LEAST[tenant.priority])
        if count >= limit:
            raise Overloaded(admission.overloaded_message(route.model, count + 1, limit),
                             retry_after_s=admission.RETRY_AFTER_S, reason="overloaded")
        patience = options.client_deadline_s  # (a stream's grace is not for its work)
        if patience is not None and pool is not None:
            self._shed_if_hopeless(route.model, pool, patience)
        self._count_in(route, +1, pool, tenant)
        return pool

    async def _tarpit(self, err: GatewayError, options: RequestOptions,
                      tenant: Tenant | None) -> None:
        """A refusal of the tenancy rules waits :func:`tenancy.refusal_delay_ms` before it
        is answered (HAProxy's tarpit), on the request's own task, counted nowhere but in
        its tenant's refusals waiting: a client retrying every refusal at once is slowed
        by its own concurrency."""
        if not (isinstance(err, Overloaded) and err.reason in tenancy.REASONS
                and self.tenants is not None and tenant is not None):
            return
        rules = self.tenants.tenancy
        deadline_ms = None if options.deadline_s is None else int(options.deadline_s * 1000)
        delay = tenancy.refusal_delay_ms(rules.refusal_delay_ms, deadline_ms,
                                         self._refusals_waiting[tenant.name] + 1,
                                         rules.refusals_per_s)
        if delay:
            self._refusals_waiting[tenant.name] += 1
            try:
                await asyncio.sleep(delay / 1000)
            finally:
                self._refusals_waiting[tenant.name] -= 1
                if not self._refusals_waiting[tenant.name]:
                    del self._refusals_waiting[tenant.name]

    def _shed_if_hopeless(self, model: str, pool: Pool, deadline_s: float) -> None:
        service = self.state.service_us(model, pool)
        if service is None:
            return
        load = self.ledger.pools[pool.name] + self.state.queued_elsewhere(pool)
        expected = deadline.expected_ms(service, load, pool.capacity,
                                        self.state.drain_us(model, pool, service))
        deadline_ms = int(deadline_s * 1000)
        if deadline.hopeless(deadline_ms, expected):
            raise DeadlineExceeded(deadline.HOPELESS.format(
                deadline=deadline_ms, model=model, expected=expected, pool=pool.name,
                load=load, capacity=pool.capacity))

    def _count_in(self, route: ModelRoute, delta: int, pool: Pool | None = None,
                  tenant: Tenant | None = None) -> None:
        route.in_system += delta
        if tenant is not None:
            route.by_class[tenant.priority] += delta
        # beyond the concurrency the members are expected to run at once: waiting in
        # their queues (HAProxy's plane estimates the same gauge)
        self._child(route, ("queued",)).set(max(0, route.in_system - route.limits.concurrency))
        if pool is not None:
            self.ledger.add(route.model, pool.name, tenant.name if tenant else None, delta)
        if tenant is not None:
            self._tenant_child("in_flight", tenant).inc(delta)

    def _refused(self, route: ModelRoute, protocol: str, options: RequestOptions,
                 err: GatewayError, tenant: Tenant | None = None, reason: str = "") -> None:
        self._count(route, "-", protocol, outcome_name(err), options.traffic)
        self._child(route, ("rejected", outcome_name(err))).inc()
        if tenant is not None:
            self._tenant_child("requests", tenant, outcome_name(err)).inc()
            if reason:
                self._tenant_child("refused", tenant, reason).inc()

    def _tenant_child(self, kind: str, tenant: Tenant, *labels: str) -> Any:
        key = (kind, tenant.name, tenant.priority.value, *labels)
        child = self._tenant_children.get(key)
        if child is None:
            m = self.metrics
            family = {"requests": m.tenant_requests, "refused": m.tenant_refused,
                      "latency": m.tenant_latency, "in_flight": m.tenant_in_flight,
                      "queue_wait": m.tenant_queue_wait}[kind]
            child = self._tenant_children[key] = family.labels(*key[1:])
        return child

    async def _attempts(self, route: ModelRoute, call: UpstreamCall[T], protocol: str,
                        options: RequestOptions, pool: Pool | None = None,
                        held_by: frozenset[str] | None = None) -> tuple[T, str]:
        """The call on a member (of ``pool`` first, when admission chose one), one retry
        on another member (any pool) when it fails with Unavailable; ``held_by``: the
        members a miss's answer named, taken while the state names no holder."""
        tried: list[str] = []
        for attempt in range(1 + RETRIES):  # inference is idempotent: retried elsewhere
            pools = [pool] if pool is not None and not tried else route.pools
            holders = route.holders if held_by is None else route.holders or held_by
            member = self.policy.choose(pools, route.model, self.clock(), self.rng, tried,
                                        holders)
            if member is None:
                if tried:
                    break
                self._count(route, "-", protocol, "unavailable", options.traffic)
                raise Unavailable(f"no healthy Triton member serves model '{route.model}'")
            tried.append(member.key)
            gauge = self._child(route, ("in_flight", member.pool))
            member.request_started(route.model)
            gauge.inc()
            try:
                result = await call(member)
            except Unavailable:
                self._record_failure(member)
                if attempt < RETRIES:
                    continue
                self._count(route, member.pool, protocol, "unavailable", options.traffic)
                raise
            finally:
                member.request_ended(route.model)
                gauge.dec()
            member.answered()
            return result, member.pool
        self._count(route, "-", protocol, "unavailable", options.traffic)
        raise Unavailable(f"all members serving '{route.model}' failed ({', '.join(tried)})")

    def _record_failure(self, member: PoolMember) -> None:
        self.metrics.upstream_errors.labels(member.pool, member.key).inc()
        if member.failed(self.clock(), self.ejection):
            self.metrics.member_healthy.labels(member.pool, member.key).set(0)

    def _child(self, route: ModelRoute, key: tuple[str, ...]) -> Any:
        """Metric children cached per model: ``labels()`` is too slow for the hot path."""
        child = route.children.get(key)
        if child is None:
            kind, *rest = key
            m = self.metrics
            child = route.children[key] = {
                "in_flight": lambda: m.in_flight.labels(route.model, *rest),
                "latency": lambda: m.latency.labels(route.model, *rest),
                "queued": lambda: m.queued.labels(route.model),
                "rejected": lambda: m.rejected.labels(route.model, *rest),
                "requests": lambda: m.requests.labels(route.model, *rest),
            }[kind]()
        return child

    def _count(self, route: ModelRoute, pool: str, protocol: str, outcome: str,
               traffic: str) -> None:
        self._child(route, ("requests", pool, protocol, outcome, traffic)).inc()

    def _note_tenants_in_flight(self) -> None:
        """Once per probe round: the tenants with requests in flight here stay active (as
        HAProxy's controller notes what its tables show)."""
        for (pool_name, tenant_name), count in self.ledger.in_pool.items():
            if count:
                self.state.note_tenant(pool_name, tenant_name)
