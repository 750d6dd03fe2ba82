"""Routing policy: a pure function over a snapshot, deterministic with a seeded rng."""

from __future__ import annotations

import random

from gateway.config.pools import MemberSpec, PoolSpec
from gateway.policy.routing import MAX_POOLS_PER_MODEL, RoutingPolicy, queue_weight, ranked_pools
from gateway.pools import Pool, PoolMember


def _pool(name: str, n: int, weights: dict[str, float] | None = None) -> Pool:
    specs = tuple(MemberSpec(host=f"10.0.{len(name)}.{i}") for i in range(n))
    spec = PoolSpec(name=name, members=specs, weights=weights or {})
    return Pool(spec, [PoolMember(name, s) for s in specs])


def test_routing_picks_the_least_loaded_member_and_breaks_ties_at_random() -> None:
    pool = _pool("a", 3)
    pool.members[0].in_flight = 5
    pool.members[1].in_flight = 1
    picks = {RoutingPolicy().choose([pool], "m", 0.0, random.Random(i)).key for i in range(20)}
    assert picks == {pool.members[2].key}  # least connections, not two random choices
    pool.members[2].in_flight = 1
    picks = {RoutingPolicy().choose([pool], "m", 0.0, random.Random(i)).key for i in range(40)}
    assert picks == {pool.members[1].key, pool.members[2].key}


def test_routing_weighs_a_queued_member_as_haproxys_leastconn_does() -> None:
    """Load is (in flight + 1) / weight, the weight halving per request queued in
    Triton: a member with 3 queued and none in flight (1/64) loses to one with an empty
    queue and 2 in flight (3/256), and wins against 4 in flight (5/256)."""
    pool = _pool("a", 2)
    queued, busy = pool.members
    queued.upstream_queue, queued.queue_scraped_at = 3, 0.0
    for in_flight, expected in ((0, busy), (2, busy), (4, queued), (9, queued)):
        busy.in_flight = in_flight
        assert RoutingPolicy().choose([pool], "m", 0.0, random.Random(0)) is expected


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


def test_queue_weight_halves_share_per_queued_request() -> None:
    assert [queue_weight(q) for q in (0, 1, 3, 1000)] == [256, 128, 64, 1]


def test_at_most_the_heaviest_pools_are_ranked_on_both_planes() -> None:
    weights = {f"p{i}": float(i) for i in range(7)}
    assert ranked_pools(weights) == (("p6", 6.0), ("p5", 5.0), ("p4", 4.0), ("p3", 3.0))
    pools = [_pool(f"p{i}", 1, {"m": float(i)}) for i in range(7)]
    rng = random.Random(3)
    chosen = {RoutingPolicy().choose_pool(pools, "m", 0.0, rng).name for _ in range(300)}
    assert len(chosen) == MAX_POOLS_PER_MODEL and chosen == {"p3", "p4", "p5", "p6"}
