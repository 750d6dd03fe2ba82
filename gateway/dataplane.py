"""The transport-free core of the gateway.

``DataPlane.forward`` is what both the HTTP and the gRPC adapters call for every model
request: it resolves the pools serving the model, picks a member with the routing
policy, tracks in-flight counts, retries an idempotent request once on another member
when the first fails with :class:`Unavailable`, and records metrics. The adapters supply
the actual upstream call (bytes in, bytes out) as a coroutine taking the chosen member.

This module imports neither ``fastapi`` nor ``grpc``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from gateway.errors import GatewayError, ModelNotFound, Unavailable
from gateway.metrics import GatewayMetrics
from gateway.pools import Pool, PoolMember, pools_for_model
from gateway.routing import RoutingPolicy

T = TypeVar("T")

UpstreamCall = Callable[[PoolMember], Awaitable[T]]


@dataclass(frozen=True)
class EjectionPolicy:
    """Passive outlier ejection: after ``failures`` consecutive connection failures a
    member sits out ``base_s * 2**k`` seconds (capped), then gets traffic again."""

    failures: int = 1
    base_s: float = 1.0
    max_s: float = 30.0

    def ejection_s(self, consecutive_failures: int) -> float:
        steps = max(0, consecutive_failures - self.failures)
        return float(min(self.max_s, self.base_s * (2**steps)))


@dataclass
class DataPlane:
    pools: list[Pool]
    metrics: GatewayMetrics
    policy: RoutingPolicy = field(default_factory=RoutingPolicy)
    ejection: EjectionPolicy = field(default_factory=EjectionPolicy)
    clock: Callable[[], float] = time.monotonic
    rng: random.Random = field(default_factory=random.Random)
    draining: bool = False

    # -- lookups -----------------------------------------------------------------------
    def pools_for(self, model: str) -> list[Pool]:
        pools = pools_for_model(self.pools, model)
        if not pools:
            raise ModelNotFound(f"Request for unknown model: '{model}' is not found")
        return pools

    def members(self) -> list[PoolMember]:
        return [m for p in self.pools for m in p.members]

    def ready(self) -> bool:
        """Ready when not draining and every pool has at least one available member."""
        now = self.clock()
        return not self.draining and all(
            any(m.available(now) for m in p.members) for p in self.pools
        )

    # -- the request path --------------------------------------------------------------
    async def forward(
        self,
        model: str,
        call: UpstreamCall[T],
        *,
        protocol: str,
        idempotent: bool = True,
        outcome: Callable[[T], str] = lambda _: "success",
        traffic: str = "user",
    ) -> T:
        pools = self.pools_for(model)
        tried: list[str] = []
        started = self.clock()
        attempts = 2 if idempotent else 1
        for attempt in range(attempts):
            member = self.policy.choose(pools, model, self.clock(), self.rng, exclude=tried)
            if member is None:
                self._count(model, "-", protocol, "unavailable", traffic)
                raise Unavailable(f"no healthy Triton member serves model '{model}'")
            tried.append(member.key)
            try:
                result = await self._call_member(member, model, call)
            except Unavailable:
                self._record_failure(member)
                if attempt + 1 < attempts:
                    continue
                self._count(model, member.pool, protocol, "unavailable", traffic)
                raise
            except GatewayError as err:
                self._count(model, member.pool, protocol, type(err).__name__.lower(), traffic)
                raise
            member.consecutive_failures = 0
            self._count(model, member.pool, protocol, outcome(result), traffic)
            self.metrics.latency.labels(model, member.pool, protocol, traffic).observe(
                self.clock() - started
            )
            return result
        raise AssertionError("unreachable")  # pragma: no cover

    async def _call_member(self, member: PoolMember, model: str, call: UpstreamCall[T]) -> T:
        gauge = self.metrics.in_flight.labels(model, member.pool)
        member.in_flight += 1
        gauge.inc()
        try:
            return await call(member)
        finally:
            member.in_flight -= 1
            gauge.dec()

    def _record_failure(self, member: PoolMember) -> None:
        member.consecutive_failures += 1
        self.metrics.upstream_errors.labels(member.pool, member.key).inc()
        if member.consecutive_failures >= self.ejection.failures:
            member.ejected_until = self.clock() + self.ejection.ejection_s(
                member.consecutive_failures
            )
            self.metrics.member_healthy.labels(member.pool, member.key).set(0)

    def _count(self, model: str, pool: str, protocol: str, outcome: str, traffic: str) -> None:
        self.metrics.requests.labels(model, pool, protocol, outcome, traffic).inc()

    # -- server-level calls ------------------------------------------------------------
    def any_member(self, pools: Sequence[Pool] | None = None) -> PoolMember:
        now = self.clock()
        for pool in pools or self.pools:
            for member in sorted(pool.members, key=lambda m: m.in_flight):
                if member.available(now):
                    return member
        raise Unavailable("no healthy Triton member")

    def update_saturation(self) -> None:
        for pool in self.pools:
            load = sum(m.in_flight + m.upstream_queue for m in pool.members)
            self.metrics.saturation.labels(pool.name).set(load / pool.capacity)
