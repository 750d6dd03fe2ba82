"""The transport-free core of the gateway.

``DataPlane.forward`` is what both the HTTP and the gRPC adapters call for every model
request. It applies the request policy (``gateway/policy``) in its order, as HAProxy's
rules do: the API key's rate limit, the model's route, its readiness, its admission
limit (requests in the gateway, refused at once beyond it); then the routing policy's
choice of member, the upstream call supplied by the adapter (bytes in, bytes out), one
retry on another member when the first fails with :class:`Unavailable`, passive
ejection of the failed member, and metrics.

This module imports neither ``fastapi`` nor ``grpc``.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gateway.errors import (
    DeadlineExceeded,
    GatewayError,
    ModelNotFound,
    ModelNotReady,
    Overloaded,
    Unavailable,
    outcome_name,
)
from gateway.metrics import GatewayMetrics
from gateway.policy import admission, readiness
from gateway.policy.model_name import UNKNOWN_MODEL
from gateway.policy.rate import RateClass, RateLimiter
from gateway.policy.upstream import RETRIES, EjectionPolicy
from gateway.pools import GatewayConfig, Pool, PoolMember, pools_for_model
from gateway.routing import RoutingPolicy

T = TypeVar("T")

UpstreamCall = Callable[[PoolMember], Awaitable[T]]


@dataclass(frozen=True)
class RequestOptions:
    """What the transports extract from a request besides its bytes."""

    deadline_s: float | None = None  # seconds left for the client, None = no deadline
    api_key: str | None = None
    traffic: str = "user"  # "warmup" for synthetic keep-warm requests


NO_OPTIONS = RequestOptions()


@dataclass
class ModelRoute:
    """Per-model state cached on first use: its pools, admission limit and count,
    metric children."""

    model: str
    pools: list[Pool]
    limits: admission.AdmissionLimits
    in_system: int = 0  # requests of this model in the gateway now
    children: dict[tuple[str, ...], Any] = field(default_factory=dict)
    last_user_request_at: float = float("-inf")  # keep-warm's idleness clock


@dataclass
class DataPlane:
    config: GatewayConfig
    pools: list[Pool]
    metrics: GatewayMetrics
    policy: RoutingPolicy = field(default_factory=RoutingPolicy)
    ejection: EjectionPolicy = field(default_factory=EjectionPolicy)
    clock: Callable[[], float] = time.monotonic
    rng: random.Random = field(default_factory=random.Random)
    draining: bool = False
    routes: dict[str, ModelRoute] = field(default_factory=dict)
    # Readiness gate: false until start-up preloading has loaded the configured models.
    preloaded: bool = True
    # model -> why it cannot take requests yet (first load, warm-up): answered 503 +
    # Retry-After instead of reaching Triton, which would say "unknown model" (400).
    not_ready: dict[str, str] = field(default_factory=dict)
    # run when a member comes back from the dead, before it is routable again (the
    # lifecycle reloads the serving versions there: a restarted Triton has none loaded)
    member_recovered: list[Callable[[PoolMember], Awaitable[None]]] = field(
        default_factory=list
    )
    background: set[Any] = field(default_factory=set)  # running member restores
    # awaited by settle(): data planes that follow this state (HAProxy) apply it now
    followers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    # awaited before a scrape: HAProxy's live counts read now, not a round ago
    gauge_sources: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    # model -> pools that serve it, set by the model lifecycle (an upload's target
    # pools); overrides the pools' static ``models`` lists for that model.
    assigned_pools: dict[str, tuple[str, ...]] = field(default_factory=dict)
    rate_limiter: RateLimiter = field(init=False)

    def __post_init__(self) -> None:
        limits = self.config.rate_limits
        self.rate_limiter = RateLimiter(
            RateClass(limits.default.rate_per_s, limits.default.burst) if limits.default else None,
            {k: RateClass(v.rate_per_s, v.burst) for k, v in limits.keys.items()},
            clock=self.clock,
        )

    # -- lookups -----------------------------------------------------------------------
    def route(self, model: str) -> ModelRoute:
        route = self.routes.get(model)
        if route is None:
            pools = self.pools_for(model)
            if not pools:
                raise ModelNotFound(UNKNOWN_MODEL.format(model=model))
            route = self.routes[model] = ModelRoute(
                model, pools, self.admission_limits(model, pools))
        return route

    def pools_for(self, model: str) -> list[Pool]:
        """The pools serving ``model``: the lifecycle's assignment, else the static lists."""
        assigned = self.assigned_pools.get(model)
        if assigned is None:
            return pools_for_model(self.pools, model)
        return [p for p in self.pools if p.name in assigned]

    def assign_pools(self, model: str, pool_names: Sequence[str]) -> None:
        """Serve ``model`` from these pools from now on (a cached route is updated in
        place: requests in the gateway stay counted)."""
        self.assigned_pools[model] = tuple(pool_names)
        route = self.routes.get(model)
        if route is not None:
            route.pools = self.pools_for(model)
            route.limits = self.admission_limits(model, route.pools)

    # -- readiness, owned here: the lifecycle tells, a native data plane follows -----
    def mark_not_ready(self, model: str, reason: str) -> None:
        """``model`` answers 503 + Retry-After (first load, warm-up) until marked ready."""
        self.not_ready[model] = reason

    def mark_ready(self, model: str) -> None:
        self.not_ready.pop(model, None)

    def set_preloaded(self, preloaded: bool) -> None:
        self.preloaded = preloaded

    async def settle(self) -> None:
        """Return once every follower (HAProxy) routes by the state set so far: a
        lifecycle step that changed routing awaits this before it reports success."""
        for follower in self.followers:
            await follower()

    def note_user_request(self, model: str, at: float | None = None) -> None:
        """A user request for ``model`` was served elsewhere (HAProxy): keep-warm's
        idleness clock."""
        route = self.routes.get(model)
        if route is not None:
            route.last_user_request_at = self.clock() if at is None else at

    def admission_limits(self, model: str, pools: Sequence[Pool]) -> admission.AdmissionLimits:
        """The model's policy fields, else its pools' capacity (:mod:`gateway.policy.admission`)."""
        policy = self.config.models.get(model)
        return admission.admission_limits(
            sum(p.capacity for p in pools), self.config.queue_factor,
            policy.max_concurrency if policy else None, policy.max_queue if policy else None)

    def refresh_limits(self) -> None:
        """Re-size admission limits after pool membership changed (DNS discovery)."""
        for route in self.routes.values():
            route.limits = self.admission_limits(route.model, route.pools)

    def members(self) -> list[PoolMember]:
        return [m for p in self.pools for m in p.members]

    def ready(self) -> bool:
        """Ready when not draining and every pool has at least one available member."""
        now = self.clock()
        return not self.draining and self.preloaded and all(
            any(m.available(now) for m in p.members) for p in self.pools
        )

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
    ) -> T:
        """Admit, route and run ``call``; ``metered=False`` skips the request policy's
        rate and admission checks and metrics (metadata and config calls)."""
        if not metered:
            return (await self._attempts(self.route(model), call, protocol, options))[0]
        try:  # the policy's order: rate, route, readiness, admission
            self.rate_limiter.check(options.api_key)
        except Overloaded as err:
            with contextlib.suppress(GatewayError):  # counted for a model it serves
                self._refused(self.route(model), protocol, options, err)
            raise
        route = self.route(model)
        started = self.clock()
        if options.traffic == "user":
            route.last_user_request_at = started
        try:
            self._admit(route, options)
        except GatewayError as err:
            self._refused(route, protocol, options, err)
            raise
        try:
            result, pool = await self._attempts(route, call, protocol, options)
        finally:
            self._count_in(route, -1)
        self._count(route, pool, protocol, outcome(result) if outcome else "success",
                    options.traffic)
        self._child(route, ("latency", pool, protocol, options.traffic)).observe(
            self.clock() - started
        )
        return result

    def _admit(self, route: ModelRoute, options: RequestOptions) -> None:
        """Readiness, then admission (:mod:`gateway.policy`); counts the request in."""
        reason = self.not_ready.get(route.model) if self.not_ready else None
        if reason is not None:
            raise ModelNotReady(readiness.not_ready_message(route.model, reason),
                                retry_after_s=readiness.RETRY_AFTER_S)
        if options.deadline_s is not None and options.deadline_s <= 0:
            raise DeadlineExceeded("deadline exceeded before the request was admitted")
        limit = route.limits.in_system
        if route.in_system >= limit:
            raise Overloaded(admission.overloaded_message(route.model, route.in_system + 1,
                                                          limit),
                             retry_after_s=admission.RETRY_AFTER_S)
        self._count_in(route, +1)

    def _count_in(self, route: ModelRoute, delta: int) -> None:
        route.in_system += delta
        # beyond the concurrency the members are expected to run at once: waiting in
        # their queues (HAProxy's plane estimates the same gauge)
        self._child(route, ("queued",)).set(max(0, route.in_system - route.limits.concurrency))

    def _refused(self, route: ModelRoute, protocol: str, options: RequestOptions,
                 err: GatewayError) -> None:
        self._count(route, "-", protocol, outcome_name(err), options.traffic)
        self._child(route, ("rejected", outcome_name(err))).inc()

    async def _attempts(self, route: ModelRoute, call: UpstreamCall[T], protocol: str,
                        options: RequestOptions) -> tuple[T, str]:
        tried: list[str] = []
        for attempt in range(1 + RETRIES):  # inference is idempotent: retried elsewhere
            member = self.policy.choose(route.pools, route.model, self.clock(), self.rng, tried)
            if member is None:
                if tried:
                    break
                self._count(route, "-", protocol, "unavailable", options.traffic)
                raise Unavailable(f"no healthy Triton member serves model '{route.model}'")
            tried.append(member.key)
            gauge = self._child(route, ("in_flight", member.pool))
            member.in_flight += 1
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
                member.in_flight -= 1
                gauge.dec()
            member.consecutive_failures = 0
            return result, member.pool
        self._count(route, "-", protocol, "unavailable", options.traffic)
        raise Unavailable(f"all members serving '{route.model}' failed ({', '.join(tried)})")

    async def send_to(self, model: str, member: PoolMember, call: UpstreamCall[T], *,
                      protocol: str, traffic: str = "warmup",
                      outcome: Callable[[T], str] | None = None) -> T:
        """One request to a chosen member, outside admission control and routing: the
        synthetic traffic (warm-up, keep-warm) that must reach every member. Counted
        under ``traffic`` so that SLO figures can leave it out."""
        route = self.route(model)
        started = self.clock()
        member.in_flight += 1
        try:
            result = await call(member)
        except GatewayError as err:
            self._count(route, member.pool, protocol, outcome_name(err), traffic)
            raise
        finally:
            member.in_flight -= 1
        self._count(route, member.pool, protocol, outcome(result) if outcome else "success",
                    traffic)
        self._child(route, ("latency", member.pool, protocol, traffic)).observe(
            self.clock() - started
        )
        return result

    def _record_failure(self, member: PoolMember) -> None:
        member.consecutive_failures += 1
        self.metrics.upstream_errors.labels(member.pool, member.key).inc()
        if member.consecutive_failures >= self.ejection.failures:
            member.ejected_until = self.clock() + self.ejection.ejection_s(
                member.consecutive_failures
            )
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

    # -- server-level calls ------------------------------------------------------------
    def any_member(self, pools: Sequence[Pool] | None = None) -> PoolMember:
        now = self.clock()
        for pool in pools or self.pools:
            for member in sorted(pool.members, key=lambda m: m.in_flight):
                if member.available(now):
                    return member
        raise Unavailable("no healthy Triton member")

    async def refresh_gauges(self) -> None:
        """What a ``/metrics`` scrape sees: every gauge source read now, then saturation."""
        for source in self.gauge_sources:
            with contextlib.suppress(OSError):  # one that cannot answer keeps its last
                await source()
        self.update_saturation()

    def update_saturation(self) -> None:
        for pool in self.pools:
            load = sum(m.in_flight + m.external_in_flight + m.upstream_queue
                       for m in pool.members)
            self.metrics.saturation.labels(pool.name).set(load / pool.capacity)

