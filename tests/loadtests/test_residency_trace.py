"""The residency benchmark's trace (loadtests/residency_trace.py): the phases'
popularity and reshuffles, the schedule (protocols included), the best fixed placement,
budgets and the static baseline's models."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from loadtests import residency_trace as rt

MODELS = [f"m{i:02d}" for i in range(36)]


# -- the schedule ---------------------------------------------------------------------

def test_zipf_weights_fall_as_rank_to_the_minus_s_and_sum_to_one() -> None:
    for s in (rt.FLAT_S, rt.STEEP_S):
        w = rt.zipf_weights(36, s)
        assert w.sum() == pytest.approx(1.0)
        assert w[0] / w[1] == pytest.approx(2 ** s)
        assert np.all(np.diff(w) < 0)
    # steep: the top ten take more than when flat
    assert rt.zipf_weights(36, 1.3)[:10].sum() > rt.zipf_weights(36, 0.9)[:10].sum() + 0.1


def test_phases_are_flat_then_steep_with_two_reshuffles() -> None:
    assert len(rt.PHASES) >= 4
    assert [p.s for p in rt.PHASES] == [0.9, 0.9, 1.3, 1.3]
    assert rt.reshuffles(60.0) == [60.0, 180.0]
    assert rt.reshuffles(30.0) == [30.0, 90.0]


def test_rankings_turn_by_half_at_each_reshuffle_so_the_popular_set_moves() -> None:
    orders = rt.rankings(MODELS, seed=1, count=3)
    assert all(sorted(o) == MODELS for o in orders)
    assert orders[0] != MODELS  # shuffled by the seed
    for before, after in zip(orders, orders[1:], strict=False):
        assert set(after[:18]) == set(before[18:])  # the least popular half leads
        assert after[:18] != before[18:]  # each half shuffled again
    assert rt.rankings(MODELS, seed=1, count=3) == orders
    assert rt.rankings(MODELS, seed=2, count=3)[0] != orders[0]


def test_popularity_keeps_the_ranking_when_only_the_exponent_changes() -> None:
    p = rt.popularity(MODELS, seed=1)
    top = [max(phase, key=lambda m: phase[m]) for phase in p]
    assert top[1] == top[2] != top[0]  # steep phase: same ranking as the one before
    assert top[3] != top[2]
    assert p[2][top[2]] > p[1][top[1]]  # steeper: the top model takes more


def test_schedule_is_poisson_at_the_rate_and_the_same_for_the_same_seed() -> None:
    arrivals = rt.schedule(MODELS, rate=40, phase_s=50, seed=3)
    assert arrivals == rt.schedule(MODELS, rate=40, phase_s=50, seed=3)
    assert arrivals != rt.schedule(MODELS, rate=40, phase_s=50, seed=4)
    assert len(arrivals) == pytest.approx(8000, rel=0.05)
    times = [a.t for a in arrivals]
    assert times == sorted(times) and times[0] > 0 and times[-1] < 200
    gaps = np.diff(times)
    assert gaps.mean() == pytest.approx(1 / 40, rel=0.05)
    assert gaps.std() == pytest.approx(gaps.mean(), rel=0.1)  # exponential: std = mean
    assert all(a.phase == int(a.t // 50) for a in arrivals)


def test_schedule_sends_half_http_half_grpc_drawn_by_the_seed() -> None:
    arrivals = rt.schedule(MODELS, rate=40, phase_s=50, seed=3)
    protocols = Counter(a.protocol for a in arrivals)
    assert set(protocols) == {"http", "grpc"}
    assert protocols["http"] / len(arrivals) == pytest.approx(0.5, abs=0.03)
    # not alternating: runs of one protocol occur
    assert any(a.protocol == b.protocol == c.protocol
               for a, b, c in zip(arrivals, arrivals[1:], arrivals[2:], strict=False))


def test_schedule_draws_models_by_each_phases_popularity() -> None:
    arrivals = rt.schedule(MODELS, rate=200, phase_s=100, seed=5)
    for phase, p in enumerate(rt.popularity(MODELS, seed=5)):
        counts = Counter(a.model for a in arrivals if a.phase == phase)
        n = sum(counts.values())
        order = sorted(p, key=lambda m: -p[m])
        assert counts[order[0]] / n == pytest.approx(p[order[0]], rel=0.1)
        top = sum(counts[m] for m in order[:10]) / n
        assert top == pytest.approx(sum(p[m] for m in order[:10]), abs=0.02)


# -- the best fixed placement ---------------------------------------------------------

def test_best_placement_packs_the_most_requested_per_byte_into_each_budget() -> None:
    p = {"a": 0.4, "b": 0.3, "c": 0.2, "d": 0.1}
    even = dict.fromkeys(p, 10)
    assert rt.best_placement(p, even, budget=20) == set(p)  # room for all
    assert rt.best_placement(p, even, budget=10) == {"a", "b"}  # one on each member
    assert rt.best_placement(p, even, budget=10, members=1) == {"a"}
    assert rt.best_placement(p, dict.fromkeys(p, 11), budget=10) == set()  # none fits
    # per byte: two small ones beat one large one more popular
    sizes = {"a": 20, "b": 10, "c": 10, "d": 10}
    assert rt.best_placement(p, sizes, budget=20, members=1) == {"b", "c"}
    assert rt.best_placement(p, sizes, budget=None) == set(p)


def test_serving_placement_keeps_one_member_the_room_of_the_largest_model_left_out(
        ) -> None:
    p = {"a": 0.4, "b": 0.3, "c": 0.2, "d": 0.1}
    sizes = {"a": 10, "b": 10, "c": 10, "d": 20}
    assert rt.best_placement(p, sizes, budget=20) == {"a", "b", "c"}
    # d (20) is left out: one member keeps 20 free, the other holds a and b
    assert rt.serving_placement(p, sizes, budget=20) == {"a", "b"}
    assert rt.best_placement(p, sizes, budget=20, kept=10) == {"a", "b", "c"}
    # nothing left out: nothing kept
    assert rt.serving_placement(p, sizes, budget=30) == set(p)
    names = [f"m{i}" for i in range(6)]
    footprints = dict.fromkeys(names, 10)
    for best, serving in zip(rt.placements(names, footprints, 20, seed=1),
                             rt.placements(names, footprints, 20, seed=1,
                                           placer=rt.serving_placement),
                             strict=True):
        assert serving < best and len(serving) == len(best) - 1


def test_placements_and_ideal_share_follow_each_phases_popularity() -> None:
    names = [f"m{i}" for i in range(4)]
    even = dict.fromkeys(names, 10)
    best = rt.placements(names, even, budget=10, seed=0)
    pops = rt.popularity(names, seed=0)
    assert len(best) == len(rt.PHASES)
    for held, p in zip(best, pops, strict=True):
        assert held == set(sorted(p, key=lambda m: -p[m])[:2])
    shares = rt.ideal_hit_share(names, even, budget=10, seed=0)
    assert shares[0] == pytest.approx(rt.zipf_weights(4, 0.9)[:2].sum())
    assert shares[2] == pytest.approx(rt.zipf_weights(4, 1.3)[:2].sum())
    assert rt.ideal_hit_share(names, even, budget=None, seed=0) == pytest.approx([1.0] * 4)


# -- budgets --------------------------------------------------------------------------

def test_budget_of_and_first_fit_take_the_catalogue_in_order() -> None:
    footprints = {"a": 40, "b": 10, "c": 30, "d": 5, "e": 15}
    assert rt.budget_of(footprints, 0.25) == 25  # ceil(100 / 4)
    assert rt.budget_of(footprints, 0.5) == 50
    assert rt.first_fit(list(footprints), footprints, 25) == ["b", "d"]
    assert rt.first_fit(list(footprints), footprints, 60) == ["a", "b", "d"]
    assert rt.first_fit(list(footprints), footprints, 1) == []
