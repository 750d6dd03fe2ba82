"""The Python forwarder's counts for the tenancy rule (``gateway/policy/tenancy.py``):
requests in flight per pool, per tenant in each model and pool, per tenant in all.
HAProxy counts the same with ``be_conn`` and its stick tables."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from gateway.policy.tenancy import Standing, Tenancy, Tenant


@dataclass
class TenantLedger:
    pools: Counter[str] = field(default_factory=Counter)
    here: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # model, pool, tenant
    totals: Counter[str] = field(default_factory=Counter)  # tenant

    def standing(self, tenancy: Tenancy, tenant: Tenant, model: str, pool: str,
                 capacity: int, queued_elsewhere: int) -> Standing:
        load = self.pools[pool] + queued_elsewhere
        # a share is weighed only once the pool is saturated
        share = tenancy.shares(capacity)[tenant.name] if load >= capacity else 0
        return Standing(
            pool=pool, load=load, capacity=capacity,
            ceiling=tenancy.ceiling(tenant.priority, capacity),
            here=self.here[model, pool, tenant.name], share=share,
            total=self.totals[tenant.name])

    def add(self, model: str, pool: str, tenant: str, delta: int) -> None:
        self.pools[pool] += delta
        self.here[model, pool, tenant] += delta
        self.totals[tenant] += delta
