"""Routing policy: a pure function over a snapshot, deterministic with a seeded rng."""

from __future__ import annotations

import random

from gateway.config.pools import MemberSpec, PoolSpec
from gateway.policy.routing import RoutingPolicy
from gateway.pools import Pool, PoolMember


def _pool(name: str, n: int, weights: dict[str, float] | None = None) -> Pool:
    specs = tuple(MemberSpec(host=f"10.0.{len(name)}.{i}") for i in range(n))
    spec = PoolSpec(name=name, members=specs, weights=weights or {})
    return Pool(spec, [PoolMember(name, s) for s in specs])


def test_routing_prefers_less_loaded_member_when_two_choices() -> None:
    pool = _pool("a", 2)
    pool.members[0].in_flight = 5
    picks = {RoutingPolicy().choose([pool], "m", 0.0, random.Random(i)).key for i in range(20)}
    assert picks == {pool.members[1].key}


def test_routing_counts_upstream_queue_when_scrape_fresh() -> None:
    pool = _pool("a", 2)
    pool.members[0].upstream_queue, pool.members[0].queue_scraped_at = 10, 99.0
    pool.members[1].in_flight = 3
    chosen = RoutingPolicy(stale_after_s=5).choose([pool], "m", 100.0, random.Random(0))
    assert chosen is pool.members[1]


def test_routing_ignores_upstream_queue_when_scrape_stale() -> None:
    pool = _pool("a", 2)
    pool.members[0].upstream_queue, pool.members[0].queue_scraped_at = 10, 0.0
    pool.members[1].in_flight = 3
    chosen = RoutingPolicy(stale_after_s=5).choose([pool], "m", 100.0, random.Random(0))
    assert chosen is pool.members[0]


def test_routing_skips_ejected_and_excluded_members() -> None:
    pool = _pool("a", 3)
    pool.members[0].ejected_until = 50.0
    pool.members[1].healthy = False
    policy = RoutingPolicy()
    assert policy.choose([pool], "m", 10.0, random.Random(0)) is pool.members[2]
    assert policy.choose([pool], "m", 10.0, random.Random(0),
                         exclude=[pool.members[2].key]) is None


def test_routing_splits_by_weight_when_canary_pool() -> None:
    stable, canary = _pool("stable", 1), _pool("canary", 1, {"m": 0.1})
    rng = random.Random(7)
    picks = [RoutingPolicy().choose([stable, canary], "m", 0.0, rng).pool for _ in range(2000)]
    share = picks.count("canary") / len(picks)
    assert 0.05 < share < 0.14  # weight 0.1 against 1.0 -> about 9%
