"""Routing policy: a pure function over a snapshot of pools (no I/O, injected clock/rng).

1. Pick a pool among those serving the model, by weight (canary splits), skipping
   pools with no available member.
2. Inside the pool, power-of-two-choices on a load score: the gateway's own in-flight
   count plus the member's queue depth scraped from Triton's metrics
   (``nv_inference_pending_request_count``). A scrape older than ``stale_after_s`` is
   ignored: stale queue data would keep steering traffic away from a member that has
   long since drained.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from gateway.pools import Pool, PoolMember


@dataclass(frozen=True)
class RoutingPolicy:
    stale_after_s: float = 5.0

    def load(self, member: PoolMember, now: float) -> float:
        fresh = (now - member.queue_scraped_at) <= self.stale_after_s
        return member.in_flight + (member.upstream_queue if fresh else 0)

    def choose_pool(self, pools: Sequence[Pool], model: str, now: float,
                    rng: random.Random, exclude: Collection[str] = ()) -> Pool | None:
        """Step 1: a pool with an available member, by weight."""
        candidates = [pool for pool in pools
                      if pool.spec.weight(model) > 0 and self._members(pool, now, exclude)]
        if len(candidates) <= 1:
            return candidates[0] if candidates else None
        return rng.choices(candidates, weights=[p.spec.weight(model) for p in candidates])[0]

    def choose(
        self,
        pools: Sequence[Pool],
        model: str,
        now: float,
        rng: random.Random,
        exclude: Collection[str] = (),
    ) -> PoolMember | None:
        pool = self.choose_pool(pools, model, now, rng, exclude)
        if pool is None:
            return None
        members = self._members(pool, now, exclude)
        if len(members) == 1:
            return members[0]
        first, second = rng.sample(members, 2)
        return first if self.load(first, now) <= self.load(second, now) else second

    @staticmethod
    def _members(pool: Pool, now: float, exclude: Collection[str]) -> list[PoolMember]:
        return [m for m in pool.members if m.available(now) and m.key not in exclude]
