"""Routing: which pool, then which member. One rule; the Python forwarder computes it
per request, HAProxy is given it as data (``gateway/haproxy/controller.py``).

1. **The pool.** Among the pools serving the model with a routable member, those with
   a weight above 0 (canary splits), the heaviest :data:`MAX_POOLS_PER_MODEL` of them
   (:func:`ranked_pools`); one is drawn in proportion to its weight. HAProxy draws
   ``rand(1000)`` against the same weights (maps ``route<k>`` / ``cut<k>``).
2. **The member.** The least loaded routable member of that pool (of those that hold
   the model, in a pool with residency: :mod:`gateway.policy.residency`), where a member's
   load is ``(requests in flight there + 1) / weight`` and its weight falls with
   Triton's queue depth there (:func:`queue_weight`, 256 for an empty queue, halved per
   queued request; a scrape older than ``stale_after_s`` counts as an empty queue:
   stale queue data would keep steering traffic away from a member that has long since
   drained). Ties are broken at random. This is HAProxy's ``balance leastconn`` over
   server weights, which the controller sets to :func:`queue_weight` each probe round.

How HAProxy approximates it: it counts the requests it has in flight itself (each data
plane counts its own), its weights move once per probe round, not per request, and it
breaks ties in its own order rather than at random.
``tests/gateway/test_routing_parity.py`` sends the same skewed load through both planes
and compares the spread across members.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from gateway.pools import Pool, PoolMember

# Canary splits: at most this many pools per model are rendered as split ranks; a model
# assigned to more pools keeps its heaviest ones.
MAX_POOLS_PER_MODEL = 4
MAX_WEIGHT = 256  # HAProxy server weights are 0..256


def queue_weight(queue_depth: int) -> int:
    """A member's weight from Triton's queue depth: an idle member weighs the most, and
    each queued request halves the share it gets under least-connections balancing."""
    return max(1, MAX_WEIGHT // (1 + max(0, queue_depth)))


def ranked_pools(weights: Mapping[str, float] | Iterable[tuple[str, float]]
                 ) -> tuple[tuple[str, float], ...]:
    """``(pool, weight)`` with a weight above 0, heaviest first (then by name), at most
    :data:`MAX_POOLS_PER_MODEL` of them."""
    items = weights.items() if isinstance(weights, Mapping) else weights
    ranked = sorted(((p, w) for p, w in items if w > 0), key=lambda pw: (-pw[1], pw[0]))
    return tuple(ranked[:MAX_POOLS_PER_MODEL])


@dataclass(frozen=True)
class RoutingPolicy:
    stale_after_s: float = 5.0

    def weight(self, member: PoolMember, now: float) -> int:
        """The member's weight now (:func:`queue_weight` of a fresh queue depth)."""
        fresh = (now - member.queue_scraped_at) <= self.stale_after_s
        return queue_weight(member.upstream_queue if fresh else 0)

    def load(self, member: PoolMember, now: float) -> float:
        return (member.in_flight + 1) / self.weight(member, now)

    def choose_pool(self, pools: Sequence[Pool], model: str, now: float,
                    rng: random.Random, exclude: Collection[str] = (),
                    holders: Collection[str] | None = None) -> Pool | None:
        """Step 1: a pool with an available member (that holds the model, where
        ``holders`` says which do), by weight."""
        by_name = {pool.name: pool for pool in pools
                   if self._members(pool, now, exclude, holders)}
        ranked = ranked_pools((name, pool.spec.weight(model)) for name, pool in by_name.items())
        if len(ranked) <= 1:
            return by_name[ranked[0][0]] if ranked else None
        return by_name[rng.choices([p for p, _ in ranked], weights=[w for _, w in ranked])[0]]

    def choose(
        self,
        pools: Sequence[Pool],
        model: str,
        now: float,
        rng: random.Random,
        exclude: Collection[str] = (),
        holders: Collection[str] | None = None,
    ) -> PoolMember | None:
        """Step 2: the least loaded member of the chosen pool (of ``holders``, when
        given: the member keys that hold the model)."""
        pool = self.choose_pool(pools, model, now, rng, exclude, holders)
        if pool is None:
            return None
        members = self._members(pool, now, exclude, holders)
        if len(members) == 1:
            return members[0]
        loads = [self.load(m, now) for m in members]
        least = min(loads)
        return rng.choice([m for m, load in zip(members, loads, strict=True) if load == least])

    @staticmethod
    def _members(pool: Pool, now: float, exclude: Collection[str],
                 holders: Collection[str] | None = None) -> list[PoolMember]:
        return [m for m in pool.members if m.available(now) and m.key not in exclude
                and (holders is None or m.key in holders)]
