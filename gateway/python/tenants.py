"""The Python forwarder's counts for the tenancy rule (``gateway/policy/tenancy.py``):
requests in flight per pool, per tenant in each model and pool, per tenant in each pool
(who is active), per tenant in all. HAProxy counts the same with ``be_conn`` and its
stick tables."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field

from gateway.policy.tenancy import Standing, Tenancy, Tenant


@dataclass
class TenantLedger:
    pools: Counter[str] = field(default_factory=Counter)
    here: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # model, pool, tenant
    totals: Counter[str] = field(default_factory=Counter)  # tenant
    in_pool: Counter[tuple[str, str]] = field(default_factory=Counter)  # pool, tenant

    def active(self, pool: str, arrived: Collection[str]) -> frozenset[str]:
        """Tenants with requests in flight in ``pool``, and those that arrived lately."""
        return frozenset(arrived) | {t for (p, t), n in self.in_pool.items() if p == pool and n}

    def standing(self, tenancy: Tenancy, tenant: Tenant, model: str, pool: str,
                 capacity: int, queued_elsewhere: int, arrived: Collection[str]) -> Standing:
        load = self.pools[pool] + queued_elsewhere
        # a share is weighed only once the pool is saturated
        share = (tenancy.shares(capacity, self.active(pool, arrived))[tenant.name]
                 if load >= capacity else 0)
        return Standing(
            pool=pool, load=load, capacity=capacity,
            ceiling=tenancy.ceiling(tenant.priority, capacity),
            here=self.here[model, pool, tenant.name], share=share,
            total=self.totals[tenant.name])

    def add(self, model: str, pool: str, tenant: str | None, delta: int) -> None:
        """A request in (+1) or out (-1) of ``pool``; every request counts toward the
        pool's load (the deadline rule weighs it too), a tenant's also as its own."""
        self.pools[pool] += delta
        if tenant is None:
            return
        self.here[model, pool, tenant] += delta
        self.totals[tenant] += delta
        self.in_pool[pool, tenant] += delta
