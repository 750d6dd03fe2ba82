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

    def choose(
        self,
        pools: Sequence[Pool],
        model: str,
        now: float,
        rng: random.Random,
        exclude: Collection[str] = (),
    ) -> PoolMember | None:
        candidates = []
        for pool in pools:
            members = [m for m in pool.members if m.available(now) and m.key not in exclude]
            if members and pool.spec.weight(model) > 0:
                candidates.append((pool, members))
        if not candidates:
            return None
        weights = [pool.spec.weight(model) for pool, _ in candidates]
        _, members = rng.choices(candidates, weights=weights)[0] if len(candidates) > 1 else (
            candidates[0]
        )
        if len(members) == 1:
            return members[0]
        first, second = rng.sample(members, 2)
        return first if self.load(first, now) <= self.load(second, now) else second
