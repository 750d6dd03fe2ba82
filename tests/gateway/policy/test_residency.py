"""The residency policy as a pure function over a view of a pool: loads placed where
there is room, evictions of the coldest, hysteresis, the budget never exceeded (checked
over many random views), misses, preloading, the fill of free room. The helpers here
build views for the board's and the terms' tests too."""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import replace

import pytest

from gateway.policy.residency import (
    EVICTION_REASONS,
    HYSTERESIS,
    LOAD_REASONS,
    MemberView,
    ModelView,
    Move,
    Plan,
    ResidencyKnobs,
    ResidencyView,
    plan,
    used_bytes,
    wanted_replicas,
)
from gateway.policy.residency_misses import miss_room_at, place_miss

GB = 1_000_000_000
NOW = 10_000.0
OLD = NOW - 3600  # loaded (or used) long before: evictable, not recent
K = ResidencyKnobs(min_resident_s=30.0, rps_per_replica=50.0, failed_retry_s=60.0)


def _model(name: str, gb: float = 1, demand: float = 0.0, min_replicas: int = 0,
           last_used: float | None = None) -> ModelView:
    return ModelView(name, int(gb * GB), min_replicas, demand, last_used)


def _member(key: str, gb: float = 4, held: Mapping[str, float] | Iterable[str] = (),
            available: bool = True, failed: Mapping[str, float] | None = None,
            draining: Iterable[str] = ()) -> MemberView:
    held = held if isinstance(held, Mapping) else dict.fromkeys(held, OLD)
    return MemberView(key, int(gb * GB), available, dict(held), dict(failed or {}),
                      frozenset(draining))


def _view(models: Iterable[ModelView], members: Iterable[MemberView],
          now: float = NOW) -> ResidencyView:
    return ResidencyView(now, tuple(models), tuple(members))


def _apply(view: ResidencyView, p: Plan, now: float | None = None,
           models: Iterable[ModelView] | None = None) -> ResidencyView:
    """The view after the plan was carried out (evictions drained, loads begun at the
    plan's time), at ``now``, with ``models`` (their demand moved) when given."""
    members = []
    for m in view.members:
        held = {n: t for n, t in m.held.items()
                if Move(n, m.key, "room") not in p.evictions
                and Move(n, m.key, "surplus") not in p.evictions}
        held.update({mv.model: view.now for mv in p.loads if mv.member == m.key})
        members.append(MemberView(m.key, m.budget_bytes, m.available, held, m.failed,
                                  m.draining, margin_bytes=m.margin_bytes))
    return ResidencyView(view.now if now is None else now,
                         tuple(view.models if models is None else models), tuple(members))


def _holders(view: ResidencyView, p: Plan | None = None) -> dict[str, set[str]]:
    after = _apply(view, p) if p is not None else view
    out: dict[str, set[str]] = {}
    for m in after.members:
        for name in m.held:
            if m.available and name not in m.draining:
                out.setdefault(name, set()).add(m.key)
    return out


# --- plan ------------------------------------------------------------------------------

def test_plan_gives_a_hot_model_replicas_in_proportion_to_demand_capped_at_members() -> None:
    members = [_member(f"m{i}", 4, ["hot"]) if i == 0 else _member(f"m{i}", 4)
               for i in range(4)]
    for demand, replicas in ((40.0, 1), (120.0, 3), (160.0, 4), (900.0, 4)):
        view = _view([_model("hot", 1, demand, last_used=NOW)], members)
        p = plan(view, K)
        assert p.replicas["hot"] == replicas
        assert len(_holders(view, p)["hot"]) == replicas
        assert {mv.reason for mv in p.loads} <= {"demand"} and p.evictions == ()
    # a member that is not available neither counts nor gets a replica
    members[3] = _member("m3", 4, available=False)
    view = _view([_model("hot", 1, 900.0, last_used=NOW)], members)
    p = plan(view, K)
    assert p.replicas["hot"] == 3 and "m3" not in _holders(view, p)["hot"]


def test_plan_makes_no_moves_while_demand_wiggles_around_a_replica_boundary() -> None:
    """Demand crossing 100 rps (2 -> 3 replicas) loads a third replica once; wiggling
    back and forth around it afterwards moves nothing; only a fall below 70 % of what
    two replicas carry (70 rps) evicts it."""
    models = [_model("a", 1, 101.0, last_used=NOW)]
    view = _view(models, [_member("m1", 4, ["a"]), _member("m2", 4, ["a"]), _member("m3")])
    p = plan(view, K)
    assert p.loads == (Move("a", "m3", "demand"),)
    now = NOW
    for demand in (99.0, 102.0, 95.0, 105.0, 80.0, 71.0, 100.5, 98.0, 69.0):
        now += 45  # past min_resident_s: only the hysteresis keeps the replica
        view = _apply(view, p, now, [_model("a", 1, demand, last_used=now)])
        p = plan(view, K)
        if demand > 70:
            assert (p.loads, p.evictions) == ((), ()), demand
    assert p.loads == () and len(p.evictions) == 1 and p.evictions[0].reason == "surplus"


def test_plan_does_not_swap_two_models_of_about_the_same_demand_for_one_slot() -> None:
    members = [_member("m1", 1, ["a"])]
    for a, b in ((10.0, 11.0), (10.0, 14.0), (12.0, 10.0), (9.0, 12.8)):
        view = _view([_model("a", 1, a, last_used=NOW), _model("b", 1, b, last_used=NOW)],
                     members)
        p = plan(view, K)
        assert (p.loads, p.evictions) == ((), ()), (a, b)
    # much hotter (a at most 70 % of b): b takes the slot
    view = _view([_model("a", 1, 7.0, last_used=NOW), _model("b", 1, 10.0, last_used=NOW)],
                 members)
    p = plan(view, K)
    assert p.evictions == (Move("a", "m1", "room"),)
    assert p.loads == (Move("b", "m1", "demand"),)


def test_plan_keeps_idle_models_resident_while_there_is_room() -> None:
    view = _view([_model("idle", 1, 0.0, last_used=OLD), _model("never", 1)],
                 [_member("m1", 4, ["idle", "never"]), _member("m2", 4, ["idle"])])
    p = plan(view, K)
    assert p.replicas["idle"] == 0
    # the second replica of an idle model is a surplus; its last one stays, room allowing
    assert p.evictions == (Move("idle", "m1", "surplus"),) and p.loads == ()
    assert _holders(view, p) == {"idle": {"m2"}, "never": {"m1"}}


def test_plan_evicts_nothing_within_min_resident_s_of_its_load() -> None:
    fresh = {"cold": NOW - 10}
    models = [_model("cold", 1, 0.0, last_used=OLD), _model("hot", 1, 500.0, last_used=NOW)]
    view = _view(models, [_member("m1", 1, fresh)])
    assert plan(view, K).evictions == ()
    assert place_miss(view, "hot", K) is None  # its only room is held by a fresh load
    later = _view(models, [_member("m1", 1, fresh)], now=NOW + 21)
    assert plan(later, K).evictions == (Move("cold", "m1", "room"),)
    # a surplus waits for min_resident_s as well
    view = _view([_model("a", 1, 0.0, last_used=OLD)],
                 [_member("m1", 4, {"a": NOW - 5}), _member("m2", 4, {"a": NOW - 5})])
    assert plan(view, K).evictions == ()


def test_plan_loads_min_replicas_first_evicting_the_coldest_and_never_below_min() -> None:
    models = [_model("pinned", 2, 0.0, min_replicas=3),
              _model("warm", 2, 5.0, last_used=NOW), _model("cool", 2, 1.0, last_used=OLD),
              _model("floor", 2, 0.0, min_replicas=1)]
    view = _view(models, [_member("m1", 4, ["warm", "cool"]), _member("m2", 4, ["floor"]),
                          _member("m3", 2, ["pinned"])])
    p = plan(view, K)
    # m2 has the room; m1 must evict for it: the coldest, not the warmer one
    assert set(p.loads) == {Move("pinned", "m1", "pinned"), Move("pinned", "m2", "pinned")}
    assert p.evictions == (Move("cool", "m1", "room"),)
    # once every member is full of models at their min_replicas, nothing is evicted
    models[0] = _model("pinned", 2, 0.0, min_replicas=2)
    view = _view(models, [_member("m1", 2, ["floor"]), _member("m2", 2, ["pinned"])])
    p = plan(view, K)
    assert p.evictions == () and p.loads == ()


def test_plan_places_a_demanded_model_on_the_member_with_most_room() -> None:
    models = [_model("x", 1, min_replicas=3), _model("y", 1, min_replicas=2),
              _model("new", 1, 10.0, last_used=NOW)]
    view = _view(models, [_member("m1", 4, ["x", "y"]), _member("m2", 4, ["x"]),
                          _member("m3", 4, ["x", "y"])])
    assert plan(view, K).loads == (Move("new", "m2", "demand"),)


def test_plan_never_evicts_a_hotter_model_for_demand_nor_a_last_replica_for_more_copies(
) -> None:
    models = [_model("hot", 2, 400.0, last_used=NOW), _model("warm", 2, 100.0, last_used=NOW),
              _model("cold", 2, 1.0, last_used=NOW)]
    view = _view(models, [_member("m1", 2, ["hot"]), _member("m2", 2, ["warm"])])
    p = plan(view, K)
    # hot wants two replicas: warm is colder by far, but its only replica stays; and
    # cold finds nobody colder than itself to make room
    assert p.replicas["hot"] == 2 and (p.loads, p.evictions) == ((), ())
    # warm's second replica is not its last: hot (400 rps, wanting all three members)
    # takes it; cold still finds nothing colder than itself
    view = _view(models, [_member("m1", 2, ["hot"]), _member("m2", 2, ["warm"]),
                          _member("m3", 2, ["warm"])])
    p = plan(view, K)
    assert p.evictions == (Move("warm", "m2", "room"),)
    assert p.loads == (Move("hot", "m2", "demand"),)


def test_plan_evicts_a_surplus_replica_before_a_colder_models_last_one() -> None:
    models = [_model("big", 2, 40.0, last_used=NOW), _model("cold", 2, 1.0, last_used=NOW),
              _model("new", 2, 30.0, last_used=NOW)]
    # big holds two replicas but wants one; 40 rps >= 70 % of 50: hysteresis keeps both
    view = _view(models, [_member("m1", 4, ["big", "cold"]), _member("m2", 2, ["big"])])
    p = plan(view, K)
    assert p.evictions == (Move("big", "m1", "room"),)
    assert p.loads == (Move("new", "m1", "demand"),)


def test_plan_avoids_a_member_a_load_failed_on_within_failed_retry_s() -> None:
    models = [_model("m", 1, 10.0, last_used=NOW)]
    members = [_member("big", 8, failed={"m": NOW - 20}), _member("small", 2),
               _member("full", 1, {"x": OLD})]
    models.append(_model("x", 1, min_replicas=1))
    assert plan(_view(models, members), K).loads == (Move("m", "small", "demand"),)
    assert place_miss(_view(models, members), "m", K) == ("small", ())
    later = _view(models, members, now=NOW + 41)  # 61 s after the failure
    assert plan(later, K).loads == (Move("m", "big", "demand"),)
    only = _view(models[:1], [members[0]])
    assert plan(only, K).loads == () and place_miss(only, "m", K) is None


def test_plan_never_places_a_model_larger_than_every_budget() -> None:
    models = [_model("huge", 9, 1000.0, min_replicas=2, last_used=NOW), _model("cold", 1)]
    view = _view(models, [_member("m1", 8, ["cold"]), _member("m2", 8)])
    p = plan(view, K)
    assert p.loads == () and p.evictions == ()
    assert place_miss(view, "huge", K) is None


def test_plan_brings_a_member_over_its_budget_back_within_it() -> None:
    models = [_model("a", 2, 5.0, last_used=NOW), _model("b", 2, 1.0, last_used=NOW),
              _model("c", 1, 0.5, last_used=NOW)]
    view = _view(models, [_member("m1", 3, ["a", "b", "c"])])  # 5 GB in a 3 GB budget
    p = plan(view, K)
    assert p.evictions == (Move("b", "m1", "room"),)  # the coldest that is enough alone
    assert used_bytes(_apply(view, p), "m1") <= 3 * GB


def test_plan_brings_a_member_over_its_budget_back_even_by_a_young_model() -> None:
    """A footprint measured larger than thought right after its load: the budget wins
    over min_resident_s (never over min_replicas)."""
    young = NOW - 5
    models = [_model("a", 2, 5.0, last_used=NOW), _model("b", 2, 1.0, last_used=NOW),
              _model("pinned", 1, 0.0, min_replicas=1)]
    view = _view(models, [_member("m1", 4, {"a": young, "b": young, "pinned": young})])
    p = plan(view, K)
    assert p.evictions == (Move("b", "m1", "room"),)  # the coldest, though young
    assert used_bytes(_apply(view, p), "m1") <= 4 * GB


def test_plan_evicts_models_the_view_no_longer_describes() -> None:
    view = _view([_model("a", 1, 5.0, last_used=NOW)],
                 [_member("m1", 4, {"a": OLD, "gone": OLD, "just": NOW - 1})])
    p = plan(view, K)
    assert p.evictions == (Move("gone", "m1", "surplus"),)


def test_plan_gives_members_that_are_not_available_no_moves() -> None:
    models = [_model("a", 1, 500.0, last_used=NOW), _model("b", 1, min_replicas=1)]
    view = _view(models, [_member("down", 4, ["b", "a"], available=False), _member("up", 1),
                          _member("full", 1, ["b"])])
    p = plan(view, K)
    assert p.loads == (Move("a", "up", "demand"),) and p.evictions == ()


def test_preload_loads_the_most_used_models_first_up_to_the_budgets() -> None:
    """At start every member holds nothing; with the demand recorded by the last process,
    the plan loads the most used first, as many as the budgets take."""
    recorded = {"a": 120.0, "b": 30.0, "c": 8.0, "d": 2.0, "e": 0.5, "f": 0.0}
    models = [_model(n, 1, rps) for n, rps in recorded.items()]
    view = _view(models, [_member("m1", 3), _member("m2", 3)])
    p = plan(view, K)
    assert {mv.reason for mv in p.loads} == {"preload"} and p.evictions == ()
    first = [mv.model for mv in p.loads]
    assert first[:5] == ["a", "b", "c", "d", "e"]  # one replica each, hottest first
    assert first[5:] == ["a"]  # then a's second (of three wanted), up to the budgets
    assert "f" not in first
    for key in ("m1", "m2"):
        assert used_bytes(_apply(view, p), key) <= 3 * GB
    # a second plan, with everything loading, moves nothing
    again = plan(_apply(view, p), K)
    assert (again.loads, again.evictions) == ((), ())


# --- fill ------------------------------------------------------------------------------

def test_fill_loads_models_held_nowhere_smallest_first_leaving_the_largest_room() -> None:
    """Nothing asked for yet: the room fills with the smallest models first, each on the
    member with the most room, never evicting; each member keeps the largest model's room
    (3 GB, within the probation share of 0.5) free for a miss. Asked not to, it loads
    nothing."""
    models = [_model("big", 3), _model("mid", 2), _model("s1", 1), _model("s2", 1),
              _model("held", 1), _model("broken", 1)]
    view = _view(models, [_member("a", 6, held=["held"]), _member("b", 6, failed={
        "broken": OLD})])  # failed, long ago: filled nowhere (only a request retries it)
    knobs = ResidencyKnobs(min_resident_s=30.0, probation_share=0.5)
    assert plan(view, knobs) == plan(view, knobs, fill=False)
    assert (plan(view, knobs).loads, plan(view, knobs).evictions) == ((), ())
    p = plan(view, knobs, fill=True)
    assert p.evictions == ()
    assert p.loads == (Move("s1", "b", "fill"), Move("s2", "a", "fill"),
                       Move("mid", "b", "fill"))  # "big" would leave b less than 3 GB
    after = _apply(view, p)
    assert [6 * GB - used_bytes(after, k) for k in ("a", "b")] == [4 * GB, 3 * GB]
    assert plan(after, knobs, fill=True).loads == ()  # filled: nothing more fits


def test_fill_keeps_at_most_the_probation_share_free_and_follows_demanded_loads() -> None:
    """A model with demand is the plan's to load (``preload`` here); the fill follows,
    keeping free the largest model's room, but never more than the probation share (a
    quarter of 8 GB: 2 GB, where the largest model takes 5)."""
    models = [_model("huge", 5), _model("used", 2, demand=0.01), _model("s", 1),
              _model("t", 1)]
    p = plan(_view(models, [_member("a", 8)]), ResidencyKnobs(), fill=True)
    assert p.loads == (Move("used", "a", "preload"), Move("s", "a", "fill"),
                       Move("t", "a", "fill"))  # "huge" would leave less than 2 GB


def test_a_filled_model_goes_first_at_any_age_until_it_is_used() -> None:
    """A model the fill loaded a second ago, not used since, gives its room to a demanded
    model and to a miss despite min_resident_s; one used since is protected like any."""
    models = [_model("filled"), _model("hot", demand=5), _model("cold")]
    young = {"filled": NOW - 1}
    lent = MemberView("a", 1 * GB, True, young, {}, frozenset(),
                      lent=frozenset({"filled"}))
    p = plan(_view(models, [lent]), K)
    assert p.evictions == (Move("filled", "a", "room"),)
    assert p.loads == (Move("hot", "a", "demand"),)
    assert place_miss(_view(models, [lent]), "cold", K) == (
        "a", (Move("filled", "a", "room"),))
    kept = MemberView("a", 1 * GB, True, young, {}, frozenset())  # used since its load
    assert plan(_view(models, [kept]), K).evictions == ()
    assert place_miss(_view(models, [kept]), "cold", K) is None


# --- place_miss ------------------------------------------------------------------------

def test_place_miss_picks_the_member_with_most_room_and_evicts_only_the_coldest() -> None:
    models = [_model("x", 1, 9.0, last_used=NOW), _model("y", 1, 0.1, last_used=OLD),
              _model("z", 1, 3.0, last_used=NOW), _model("w", 2, 0.2, last_used=NOW),
              _model("miss", 2, 0.5)]
    # m2 has the most room (1 GB): the miss needs 2; of m2's models y is the coldest and
    # freeing y is enough, z stays
    view = _view(models, [_member("m1", 3, ["x", "w"]), _member("m2", 3, ["y", "z"])])
    assert place_miss(view, "miss", K) == ("m2", (Move("y", "m2", "room"),))
    # room enough: nothing evicted
    view = _view(models, [_member("m1", 3, ["x"]), _member("m2", 5, ["y", "z"])])
    assert place_miss(view, "miss", K) == ("m2", ())
    # already held (or loading) somewhere: that member
    view = _view(models, [_member("m1", 3, {"miss": NOW - 1}), _member("m2", 4)])
    assert place_miss(view, "miss", K) == ("m1", ())
    assert place_miss(view, "unknown", K) is None


def test_place_miss_falls_back_to_a_member_with_less_room_it_can_free() -> None:
    models = [_model("a", 1), _model("b", 1), _model("c", 2), _model("miss", 2)]
    view = _view(models, [_member("m1", 3, {"a": NOW - 1, "b": NOW - 1}),
                          _member("m2", 3, ["c"])])
    # m1 has room 1 but both its models are fresh; m2 (room 1) evicts c
    assert place_miss(view, "miss", K) == ("m2", (Move("c", "m2", "room"),))


def test_place_miss_never_evicts_a_hotter_model_for_a_colder_one() -> None:
    """A cold model's miss waits for room rather than evicting a hot model (which would
    miss next: the pool would thrash); it may evict a colder one, or an idle one."""
    models = [_model("hot", 2, 5.0, last_used=NOW), _model("idle", 2, 0.0, last_used=OLD),
              _model("cold", 2, 0.2, last_used=NOW - 5)]
    assert place_miss(_view(models, [_member("m1", 2, ["hot"])]), "cold", K) is None
    assert place_miss(_view(models, [_member("m1", 2, ["idle"])]), "cold", K) == \
        ("m1", (Move("idle", "m1", "room"),))
    # a model never asked for counts as one request a minute: an idle one may go for it
    new = [*models, _model("new", 2, 0.0)]
    assert place_miss(_view(new, [_member("m1", 2, ["idle"])]), "new", K) == \
        ("m1", (Move("idle", "m1", "room"),))
    assert place_miss(_view(new, [_member("m1", 2, ["cold"])]), "new", K) is None


def test_place_miss_never_evicts_below_min_replicas() -> None:
    models = [_model("p", 2, min_replicas=1), _model("miss", 2)]
    view = _view(models, [_member("m1", 2, ["p"])])
    assert place_miss(view, "miss", K) is None


# --- properties over random views ------------------------------------------------------

def _random_view(rng: random.Random) -> tuple[ResidencyView, ResidencyKnobs]:
    knobs = ResidencyKnobs(min_resident_s=rng.choice([0.0, 10.0, 30.0]),
                           rps_per_replica=rng.choice([5.0, 20.0, 50.0]),
                           failed_retry_s=rng.choice([0.0, 60.0]))
    n_members = rng.randint(1, 5)
    models = []
    for i in range(rng.randint(1, 8)):
        size = rng.choice([1, 1, 2, 3, 4, 6, 12])  # 12: larger than every budget
        min_replicas = rng.choice([0, 0, 0, 1, 2, n_members])
        demand = rng.choice([0.0, 0.0, rng.uniform(0, 5), rng.uniform(0, 120)])
        last_used = rng.choice([None, NOW - rng.uniform(0, 120)])
        models.append(ModelView(f"m{i}", size, min_replicas, demand, last_used))
    members = []
    for j in range(n_members):
        budget = rng.randint(2, 10)
        held: dict[str, float] = {}
        failed: dict[str, float] = {}
        draining: set[str] = set()
        used = 0
        for model in rng.sample(models, len(models)):
            roll = rng.random()
            if roll < 0.5 and used + model.footprint_bytes <= budget:
                used += model.footprint_bytes
                held[model.name] = NOW - rng.uniform(0, 100)
                if rng.random() < 0.1:
                    draining.add(model.name)
            elif roll < 0.6:
                failed[model.name] = NOW - rng.uniform(0, 120)
        members.append(MemberView(f"k{j}", budget, rng.random() < 0.85, held, failed,
                                  frozenset(draining), margin_bytes=rng.choice([0, 0, 1])))
    return ResidencyView(NOW, tuple(models), tuple(members)), knobs


def _fits_somewhere(view: ResidencyView, after: ResidencyView, model: ModelView,
                    knobs: ResidencyKnobs) -> bool:
    """A member where the model could load after the plan without evicting anything."""
    for m in after.members:  # (not one it was evicted from: no churn within a plan)
        fail = m.failed.get(model.name)
        before = next(b for b in view.members if b.key == m.key)
        if (m.available and model.name not in before.held and model.name not in m.held
                and model.name not in m.draining
                and (fail is None or view.now - fail >= knobs.failed_retry_s)
                and used_bytes(after, m.key) + model.footprint_bytes + max(0, min(
                    m.margin_bytes, m.budget_bytes - model.footprint_bytes)) <= m.budget_bytes):
            return True
    return False


def _check_plan(view: ResidencyView, knobs: ResidencyKnobs, p: Plan) -> None:
    members = {m.key: m for m in view.members}
    after = _apply(view, p)
    for mv in p.evictions:
        m = members[mv.member]
        assert mv.reason in EVICTION_REASONS
        assert m.available and mv.model in m.held and mv.model not in m.draining
        # min_resident_s, but for a member over its budget (the budget is the harder rule)
        assert view.now - m.held[mv.model] >= knobs.min_resident_s \
            or used_bytes(view, m.key) > m.budget_bytes
    for mv in p.loads:
        m = members[mv.member]
        fail = m.failed.get(mv.model)
        assert mv.reason in LOAD_REASONS
        assert m.available and mv.model not in m.held and mv.model not in m.draining
        assert fail is None or view.now - fail >= knobs.failed_retry_s
    assert len(set(p.loads)) == len(p.loads) and len(set(p.evictions)) == len(p.evictions)
    for m in view.members:  # the budget, when the member was within it before
        if used_bytes(view, m.key) <= m.budget_bytes:
            assert used_bytes(after, m.key) <= m.budget_bytes, m.key
        # the margin, when the member kept it before: a load leaves it free (but a model
        # too large to, alone on its member), and nothing is evicted for it
        loaded = {mv.model for mv in p.loads if mv.member == m.key}
        alone = set(next(a for a in after.members if a.key == m.key).held) == loaded
        used = used_bytes(view, m.key)
        if used <= m.budget_bytes - m.margin_bytes and loaded and not (
                alone and len(loaded) == 1):
            assert used_bytes(after, m.key) <= m.budget_bytes - m.margin_bytes, m.key
        if m.budget_bytes - m.margin_bytes < used <= m.budget_bytes and not loaded:
            assert not any(mv.member == m.key and mv.reason == "room"
                           for mv in p.evictions), m.key
    holders = _holders(after)
    available = sum(m.available for m in view.members)
    for model in view.models:
        count = len(holders.get(model.name, ()))
        before = len(_holders(view).get(model.name, ()))
        wanted = p.replicas[model.name]
        assert wanted == wanted_replicas(model, available, knobs, view.now)
        if count < min(before, model.min_replicas):
            pytest.fail(f"{model.name} evicted below its min_replicas")
        if count < wanted:  # min_replicas (and demand) met where there is room
            assert not _fits_somewhere(view, after, model, knobs), model.name
        if count < before:  # a surplus only beyond what the demand needs, with hysteresis
            surplus = [mv for mv in p.evictions
                       if mv.model == model.name and mv.reason == "surplus"]
            if surplus:
                kept = before - len(surplus)
                assert kept >= max(1, wanted)
                assert model.demand_rps < HYSTERESIS * kept * knobs.rps_per_replica


def test_plan_over_random_views_keeps_budgets_min_resident_s_and_min_replicas() -> None:
    for seed in range(3000):
        rng = random.Random(seed)
        view, knobs = _random_view(rng)
        p = plan(view, knobs)
        try:
            _check_plan(view, knobs, p)
            # the fill only adds loads of models held nowhere, into room left free
            filled = plan(view, knobs, fill=True)
            _check_plan(view, knobs, filled)
            extra = [mv for mv in filled.loads if mv not in p.loads]
            assert filled.evictions == p.evictions and filled.segments == p.segments
            assert filled.loads[:len(p.loads)] == p.loads
            assert all(mv.reason == "fill" and mv.model not in _holders(view, p)
                       for mv in extra)
            for key in {mv.member for mv in extra}:  # a miss's room left free there
                budget = next(m.budget_bytes for m in view.members if m.key == key)
                largest = max(m.footprint_bytes for m in view.models
                              if m.footprint_bytes <= budget)
                assert budget - used_bytes(_apply(view, filled), key) >= min(
                    largest, int(knobs.probation_share * budget))
            # deterministic: the order the view lists things in does not matter
            shuffled = ResidencyView(view.now, tuple(rng.sample(view.models, len(view.models))),
                                     tuple(rng.sample(view.members, len(view.members))))
            assert plan(shuffled, knobs) == p
            # the next round, nothing changed but the moves done: no more moves (with
            # min_resident_s 0 a load may be evicted the next round, as configured)
            again = plan(_apply(view, p), knobs)
            if knobs.min_resident_s > 0:
                assert (again.loads, again.evictions) == ((), ())
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}: {view} -> {p}") from exc


def test_place_miss_over_random_views_makes_room_within_the_budget() -> None:
    placed = 0
    for seed in range(1500):
        rng = random.Random(seed)
        view, knobs = _random_view(rng)
        model = rng.choice(view.models)
        members = {m.key: m for m in view.members}
        got = place_miss(view, model.name, knobs)
        held = [m for m in view.members if m.available and model.name in m.held
                and model.name not in m.draining]
        if got is None:
            assert not held
            continue
        key, evictions = got
        member = members[key]
        assert member.available
        if held:
            assert member in held and evictions == ()
            continue
        placed += 1
        fail = member.failed.get(model.name)
        assert fail is None or view.now - fail >= knobs.failed_retry_s, seed
        for mv in evictions:
            assert mv.member == key and mv.reason == "room"
            assert view.now - member.held[mv.model] >= knobs.min_resident_s, seed
        p = Plan((Move(model.name, key, "miss"),), evictions, {})
        after = _apply(view, p)
        assert used_bytes(after, key) <= max(member.budget_bytes,
                                             used_bytes(view, key)), seed
        freed = sum(next(m.footprint_bytes for m in view.models if m.name == mv.model)
                    for mv in evictions)
        if used_bytes(view, key) <= member.budget_bytes - member.margin_bytes and set(
                next(a for a in after.members if a.key == key).held) != {model.name}:
            assert used_bytes(after, key) <= member.budget_bytes - member.margin_bytes, seed
        for mv in evictions:  # no more evicted than needed
            size = next(m.footprint_bytes for m in view.models if m.name == mv.model)
            assert (used_bytes(view, key) - freed + size + model.footprint_bytes + min(
                member.margin_bytes, member.budget_bytes - model.footprint_bytes)
                    > member.budget_bytes), seed
    assert placed > 300  # the views exercise placements, not only refusals


def test_random_views_are_within_budget_and_varied() -> None:
    """The generator itself: every member starts within its budget, some members are
    full, some models are larger than every budget (so the properties above are about
    views that test them)."""
    full = too_big = 0
    for seed in range(200):
        view, _ = _random_view(random.Random(seed))
        for m in view.members:
            assert used_bytes(view, m.key) <= m.budget_bytes
            full += used_bytes(view, m.key) == m.budget_bytes
        budgets = max(m.budget_bytes for m in view.members)
        too_big += any(m.footprint_bytes > budgets for m in view.models)
    assert full > 20 and too_big > 20


# --- issue 34: pending loads, probation, value per byte, rollouts ------------------------
def test_a_placement_leaves_the_margin_free_and_only_the_whole_budget_evicts() -> None:
    """A member's ``margin_bytes`` is room for its models measured again larger: a load,
    a miss and the fill leave it free; only a member past its whole budget loses a
    model; a model too large to leave it still loads alone."""
    margin = 10_000_000

    def member(key: str, gb: float, held: Iterable[str] = (), extra: int = 0) -> MemberView:
        return replace(_member(key, gb, held), margin_bytes=margin,
                       budget_bytes=int(gb * GB) + extra)

    models = [_model("a", demand=1, last_used=OLD), _model("b", demand=1, last_used=OLD),
              _model("c", demand=5, last_used=NOW)]
    # c fits a's and b's member to the byte, not with the margin: it goes to the other
    view = _view(models, [member("m1", 3, ["a", "b"]), member("m2", 3)])
    assert plan(view, K).loads == (Move("c", "m2", "demand"),)
    # with no other member, the coldest makes room for it; a miss does the same
    view = _view(models, [member("m1", 3, ["a", "b"])])
    assert plan(view, K).evictions == (Move("a", "m1", "room"),)
    assert place_miss(view, "c", K) == ("m1", (Move("a", "m1", "room"),))
    # the margin itself taken (a footprint measured larger): nothing goes ...
    full = _view(models, [member("m1", 3, ["a", "b", "c"])])
    assert plan(full, K) == plan(replace(full, members=(
        replace(full.members[0], margin_bytes=0),)), K)
    assert plan(full, K).evictions == ()
    # ... until the budget is: then the coldest
    over = _view(models, [member("m1", 3, ["a", "b", "c"], extra=-1)])
    assert plan(over, K).evictions == (Move("a", "m1", "room"),)
    # a model larger than the budget less the margin loads alone
    assert plan(_view([_model("big", 3, demand=5)], [member("m1", 3)]), K).loads == (
        Move("big", "m1", "preload"),)
    # the fill keeps a miss's room (a quarter of the budget here) and the margin
    filled = _view([_model("x", 0.75)], [member("m1", 1)])
    assert plan(filled, ResidencyKnobs(), fill=True).loads == ()
    assert plan(replace(filled, members=(replace(filled.members[0], margin_bytes=0),)),
                ResidencyKnobs(), fill=True).loads == (Move("x", "m1", "fill"),)


def test_plan_never_evicts_a_pending_model_when_a_hotter_one_needs_its_room() -> None:
    view = _view([_model("loading", demand=0.1), _model("hot", demand=40)],
                 [MemberView("a", 1 * GB, True, {}, {}, frozenset(),
                             pending=frozenset({"loading"}))])
    p = plan(view, K)
    assert p.evictions == () and p.loads == ()


def test_plan_counts_pending_loads_in_use_when_it_places_others() -> None:
    view = _view([_model("q", demand=1), _model("x", demand=1)],
                 [MemberView("a", 1 * GB, True, {}, {}, frozenset(), pending=frozenset({"q"}))])
    assert plan(view, K).loads == ()  # the queued load holds the whole budget
    assert used_bytes(view, "a") == GB


def test_place_miss_evicts_probation_before_colder_main_models_when_both_could_go() -> None:
    models = [_model("main", demand=0.001), _model("trial", demand=5), _model("new")]
    member = MemberView("a", 2 * GB, True, {"main": OLD, "trial": OLD}, {}, frozenset(),
                        probation=frozenset({"trial"}))
    assert place_miss(_view(models, [member]), "new", K) == ("a", (Move("trial", "a", "room"),))


def test_place_miss_takes_the_coldest_hot_model_when_probation_share_allows() -> None:
    models = [_model("h1", demand=5), _model("h2", demand=9), _model("new")]
    member = _member("a", gb=2, held=["h1", "h2"])
    knobs = ResidencyKnobs(min_resident_s=30.0, probation_share=0.5)
    assert place_miss(_view(models, [member]), "new", knobs) == ("a", (Move("h1", "a", "room"),))
    closed = ResidencyKnobs(min_resident_s=30.0, probation_share=0.0)
    assert place_miss(_view(models, [member]), "new", closed) is None  # the hot are kept


def test_place_miss_keeps_probation_within_its_share_when_it_is_full() -> None:
    models = [_model("h1", demand=5), _model("t1", demand=0.01), _model("new")]
    member = MemberView("a", 2 * GB, True, {"h1": OLD, "t1": NOW - 0.5}, {}, frozenset(),
                        probation=frozenset({"t1"}))
    knobs = ResidencyKnobs(min_resident_s=30.0, probation_share=0.5, probation_min_s=1.0)
    view = _view(models, [member])
    assert place_miss(view, "new", knobs) is None  # t1 too young, h1 hot, the window full
    assert miss_room_at(view, "new", knobs) == NOW + 0.5  # t1 past probation_min_s
    assert place_miss(view, "new", knobs, strict=False) == ("a", (Move("h1", "a", "room"),))


def test_miss_room_at_is_none_when_waiting_frees_nothing() -> None:
    models = [_model("pinned", min_replicas=1), _model("new")]
    view = _view(models, [_member("a", gb=1, held=["pinned"])])
    assert miss_room_at(view, "new", K) is None


def test_plan_prefers_demand_per_byte_when_a_small_model_earns_more_per_byte() -> None:
    models = [_model("big", gb=2, demand=3), _model("small", gb=0.5, demand=2)]
    p = plan(_view(models, [_member("a", gb=2)]), K)
    assert [mv.model for mv in p.loads] == ["small"]  # 4 rps/GB before 1.5


def test_plan_promotes_a_probation_holding_when_it_earns_more_per_byte_than_main() -> None:
    models = [_model("main", demand=1), _model("trial", demand=3), _model("idle")]
    member = MemberView("a", 4 * GB, True, {"main": OLD, "trial": OLD, "idle": OLD}, {},
                        frozenset(), probation=frozenset({"trial", "idle"}))
    assert plan(_view(models, [member]), K).segments == (Move("trial", "a", "promote"),)


def test_plan_swaps_segments_when_a_probation_model_beats_a_colder_main_one() -> None:
    models = [_model("main", demand=0.1), _model("trial", demand=3)]
    member = MemberView("a", 2 * GB, True, {"main": OLD, "trial": OLD}, {}, frozenset(),
                        probation=frozenset({"trial"}))
    knobs = ResidencyKnobs(min_resident_s=30.0, probation_share=0.5)  # main: 1 GB
    assert plan(_view(models, [member]), knobs).segments == (
        Move("main", "a", "demote"), Move("trial", "a", "promote"))


def test_plan_leaves_a_model_under_rollout_where_it_is_when_demand_moves() -> None:
    frozen = ModelView("r", GB, 1, 0.0, None, frozen=True)
    view = _view([frozen, _model("hot", demand=40)], [_member("a", gb=1, held=["r"]),
                                                      _member("b", gb=1)])
    p = plan(view, K)
    assert all(mv.model != "r" for mv in (*p.loads, *p.evictions))
