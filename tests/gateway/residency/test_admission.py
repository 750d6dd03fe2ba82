"""The miss's admission (issue 34, the quarter budget's churn): a cold miss takes the
probation share's room, never a hotter main model's, and waits for that room only while
waiting makes it (pending loads resident when expected, evictions ending)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from gateway.policy.residency import (
    WAITERS_S,
    MemberView,
    ModelView,
    Move,
    ResidencyKnobs,
    ResidencyView,
    used_bytes,
)
from gateway.policy.residency_misses import (
    HURRY_RPS,
    fits_probation,
    miss_room_at,
    place_miss,
)
from tests.gateway.residency.fakes import MB, A, Rig

GB = 1_000_000_000
NOW = 10_000.0
OLD = NOW - 3600
KNOBS = ResidencyKnobs(min_resident_s=30.0, probation_share=0.5, probation_min_s=5.0)


def _model(name: str, gb: float = 1, demand: float = 0.0) -> ModelView:
    return ModelView(name, int(gb * GB), 0, demand, None)


def _view(models: list[ModelView], member: MemberView) -> ResidencyView:
    return ResidencyView(NOW, tuple(models), (member,))


def test_place_miss_keeps_hot_main_models_when_a_draining_probation_model_fills_the_window(
) -> None:
    models = [_model("h1", demand=5), _model("h2", demand=9), _model("t1"), _model("new")]
    # main (h1, h2) over its 1 GB share, but the probation share is taken by t1 leaving
    member = MemberView("a", 3 * GB, True, {"h1": OLD, "h2": OLD, "t1": OLD}, {},
                        frozenset({"t1"}), probation=frozenset({"t1"}))
    assert place_miss(_view(models, member), "new", KNOBS) is None
    # t1 gone: its room is free, and nothing goes
    gone = MemberView("a", 3 * GB, True, {"h1": OLD, "h2": OLD}, {}, frozenset())
    assert place_miss(_view(models, gone), "new", KNOBS) == ("a", ())


def test_miss_room_at_counts_a_pending_load_when_it_is_expected_resident() -> None:
    models = [_model("h1", demand=5), _model("loading"), _model("new")]
    member = MemberView("a", 2 * GB, True, {"h1": OLD}, {}, frozenset(),
                        pending=frozenset({"loading"}), probation=frozenset({"loading"}),
                        ready_at={"loading": NOW + 2})
    view = _view(models, member)
    assert place_miss(view, "new", KNOBS) is None
    # resident at +2, then past probation_min_s; starving, once its waiters went on
    assert miss_room_at(view, "new", KNOBS) == NOW + 2 + 5
    assert miss_room_at(view, "new", KNOBS, young_probation=True) == NOW + 2 + WAITERS_S
    unknown = MemberView("a", 2 * GB, True, {"h1": OLD}, {}, frozenset(),
                         pending=frozenset({"loading"}), probation=frozenset({"loading"}))
    assert miss_room_at(_view(models, unknown), "new", KNOBS) is None


def test_place_miss_evicts_a_young_probation_model_when_colder_or_when_it_hurries() -> None:
    models = [_model("h1", demand=5), _model("t1", demand=0.5), _model("t2", demand=0.001),
              _model("new", demand=0.2)]
    member = MemberView("a", 2 * GB, True, {"h1": OLD, "t1": NOW - 1}, {}, frozenset(),
                        probation=frozenset({"t1"}))
    just = MemberView("a", 2 * GB, True, {"h1": OLD, "t1": NOW - WAITERS_S / 2}, {},
                      frozenset(), probation=frozenset({"t1"}))
    # never before its waiters went on, however urgent
    assert place_miss(_view(models, just), "new", KNOBS, hurry=True) is None
    view = _view(models, member)
    assert place_miss(view, "new", KNOBS) is None  # t1 within probation_min_s, h1 hot
    # starving: a young probation model goes only for a miss hotter than it...
    assert place_miss(view, "new", KNOBS, young_probation=True) is None
    # ... or for one whose first request gives up unless its room is made now
    assert place_miss(view, "new", KNOBS, hurry=True) == ("a", (Move("t1", "a", "room"),))
    colder = MemberView("a", 2 * GB, True, {"h1": OLD, "t2": NOW - 1}, {}, frozenset(),
                        probation=frozenset({"t2"}))
    assert place_miss(_view(models, colder), "new", KNOBS, young_probation=True) == (
        "a", (Move("t2", "a", "room"),))


def test_place_miss_keeps_a_young_hot_probation_model_when_a_cold_miss_hurries() -> None:
    """The benchmark's thrash: the reshuffle's new favourite, 131 MB and just loaded for
    its miss, unloaded 2.3 s later for a 31 MB model's one urgent request (it was the
    coldest per byte), then loaded again for its own misses."""
    models = [_model("main", 2, demand=5), _model("big", 1.3, demand=4.0),
              _model("small", 0.3, demand=0.5), _model("cold", 0.3, demand=0.0)]
    member = MemberView("a", int(3.5 * GB), True, {"main": OLD, "big": NOW - 2}, {},
                        frozenset(), probation=frozenset({"big"}))
    knobs = replace(KNOBS, probation_share=0.4)  # (main within its share)
    view = _view(models, member)
    assert place_miss(view, "cold", knobs, hurry=True) is None  # big is too hot to go
    assert place_miss(view, "cold", knobs, young_probation=True) is None
    assert HURRY_RPS < 4.0
    # a young probation model used less than HURRY_RPS goes for it, the least used first
    both = MemberView("a", int(3.8 * GB), True,
                      {"main": OLD, "big": NOW - 2, "small": NOW - 1}, {}, frozenset(),
                      probation=frozenset({"big", "small"}))
    assert place_miss(_view(models, both), "cold", knobs, hurry=True) == (
        "a", (Move("small", "a", "room"),))


def test_place_miss_never_takes_a_hotter_model_when_it_is_colder_per_byte() -> None:
    """Colder per byte is not enough for a miss to evict a main model: it must also have
    less demand than the missed one (the room a small miss needs is not worth a large
    model's requests)."""
    knobs = replace(KNOBS, probation_share=0.0)  # (no probation room: main models only)
    models = [_model("big", 4, demand=2.0), _model("new", 0.1, demand=1.0)]
    member = MemberView("a", 4 * GB, True, {"big": OLD}, {}, frozenset())
    view = _view(models, member)
    assert models[0].value_per_byte < models[1].value_per_byte
    assert place_miss(view, "new", knobs) is None
    cooler = [_model("big", 4, demand=0.5), _model("new", 0.1, demand=1.0)]
    assert place_miss(_view(cooler, member), "new", knobs) == ("a", (Move("big", "a", "room"),))


def test_place_miss_in_a_hurry_takes_a_main_model_asked_for_less_whatever_its_bytes(
) -> None:
    """A request that fails unless its room is made now outweighs a main model asked for
    less, however much more its bytes earn (its requests miss, then are served after a
    load); never one asked for more. The benchmark's 131 MB models starved so: each
    smaller main model was hotter per byte, and their requests failed at 15 s."""
    knobs = replace(KNOBS, probation_share=0.0)  # (no probation room: main models only)
    models = [_model("small", 0.3, demand=0.5), _model("big", 1.3, demand=1.0)]
    member = MemberView("a", int(1.4 * GB), True, {"small": OLD}, {}, frozenset())
    view = _view(models, member)
    assert models[0].value_per_byte > models[1].value_per_byte
    assert place_miss(view, "big", knobs) is None
    assert place_miss(view, "big", knobs, young_probation=True) is None
    assert place_miss(view, "big", knobs, hurry=True) == ("a", (Move("small", "a", "room"),))
    busier = [_model("small", 0.3, demand=1.5), _model("big", 1.3, demand=1.0)]
    assert place_miss(_view(busier, member), "big", knobs, hurry=True) is None
    # within min_resident_s of its load it stays, whatever the hurry
    young = MemberView("a", int(1.4 * GB), True, {"small": NOW - 1}, {}, frozenset())
    assert place_miss(_view(models, young), "big", knobs, hurry=True) is None


def test_miss_room_at_waits_for_an_eviction_under_way_when_told_how_long_it_takes(
) -> None:
    models = [_model("h1", demand=5), _model("t1"), _model("new")]
    member = MemberView("a", 2 * GB, True, {"h1": OLD, "t1": OLD}, {}, frozenset({"t1"}),
                        probation=frozenset({"t1"}))
    view = _view(models, member)
    assert miss_room_at(view, "new", KNOBS) is None
    assert miss_room_at(view, "new", KNOBS, drain_s=1.5) == NOW + 1.5


def test_a_miss_waiting_for_its_victims_counts_their_room_once_when_covered() -> None:
    """"big" (1.5 GB) was placed on a 2 GB member evicting v1 (gone) and v2 (1 GB, still
    leaving): the member is full (0.5 GB h1 + v2's room that is big's), not over its
    budget (counted twice, the plan would evict young models to make up a deficit that
    is not there), and a later miss finds no room there."""
    models = [_model("h1", 0.5, demand=5), _model("v2"), _model("big", 1.5),
              _model("new", 0.5)]
    member = MemberView("a", 2 * GB, True, {"h1": OLD, "v2": OLD}, {}, frozenset({"v2"}),
                        pending=frozenset({"big"}), probation=frozenset({"big"}),
                        covered={"big": 1 * GB})
    view = _view(models, member)
    assert used_bytes(view, "a") == 2 * GB
    assert place_miss(view, "new", KNOBS) is None
    assert used_bytes(_view(models, replace(member, covered={})), "a") == 3 * GB


def test_fits_probation_when_the_model_fits_a_members_probation_share() -> None:
    models = [_model("small", 1), _model("big", 1.5)]
    member = MemberView("a", 2 * GB, True, {}, {}, frozenset())
    view = _view(models, member)
    assert fits_probation(view, "small", KNOBS)
    assert not fits_probation(view, "big", KNOBS)  # only main models' room could take it
    assert not fits_probation(view, "unknown", KNOBS)


# -- the mechanism: fakes at its boundaries ------------------------------------------------

async def _rig_with_hot_main_and_young_trial() -> Rig:
    """One member: "hot" in the main segment, "trial" just loaded for a miss (probation),
    the budget full; "trial" asked for more than "cold" (the next miss)."""
    rig = Rig({"hot": 100 * MB, "trial": 100 * MB, "cold": 100 * MB}, budget=200 * MB,
              members=1, instant=True, min_resident_s=5.0, probation_share=0.5,
              probation_min_s=5.0)
    await rig.residency.round()
    await rig.core.state.wait_resident("hot", 10.0)
    for _ in range(50):
        rig.core.metrics.requests.labels("hot", "p", "http", "success", "user").inc()
    rig.clock.advance(10)
    await rig.residency.round()
    await rig.core.state.wait_resident("trial", 10.0)
    rig.core.metrics.requests.labels("trial", "p", "http", "success", "user").inc()
    rig.clock.advance(1)
    await rig.residency.round()
    holding = rig.residency.table.get(A, "trial")
    assert holding is not None and holding.segment == "probation"
    return rig


async def test_a_cold_miss_waits_for_the_probation_room_and_the_hot_model_stays() -> None:
    rig = await _rig_with_hot_main_and_young_trial()
    waiting = asyncio.ensure_future(rig.core.state.wait_resident("cold", 15.0))
    await rig.settle()
    assert not waiting.done()  # "trial" is young and hotter than "cold"; "hot" is hot
    rig.clock.advance(5)  # "trial" past probation_min_s
    await rig.residency.round()
    await asyncio.wait_for(waiting, 2)
    assert rig.members.unloads == {(A, "trial"): 1}
    assert rig.core.state.holders("hot") == {A}


async def test_a_young_probation_model_goes_when_a_waiting_request_would_give_up() -> None:
    rig = await _rig_with_hot_main_and_young_trial()
    rig.residency.actuator.load_seconds.update(hot=1.0, trial=1.0)  # loads take 1 s
    # its limit (3.15 s) is within an eviction (0.5 s before any was measured) and four
    # loads, and "trial" ages only in 4 s: unless "trial" goes now, it gives up
    await asyncio.wait_for(rig.core.state.wait_resident("cold", 3.5), 2)
    assert rig.members.unloads == {(A, "trial"): 1}
    assert rig.core.state.holders("hot") == {A}
