"""The holding's state machine: only the allowed transitions, a stale record refused,
age from resident, and the routing published in the same step as a transition into or
out of resident."""

from __future__ import annotations

import logging

import pytest

from gateway.core import Core
from gateway.residency.holdings import (
    ALLOWED,
    PROBATION,
    HoldingTable,
    Phase,
    StaleTransition,
)
from tests.gateway.residency.fakes import FakeClock, config

A = "127.0.0.1:9001"


def _table() -> tuple[HoldingTable, FakeClock, Core, list[tuple[object, object]]]:
    clock = FakeClock()
    core = Core.for_config(config({"m": 1}, budget=10), clock=clock)
    seen: list[tuple[object, object]] = []
    return HoldingTable(core.state, clock, lambda b, a: seen.append((b, a))), clock, core, seen


def test_a_load_walks_queued_to_resident_and_routes_when_warm() -> None:
    table, clock, core, seen = _table()
    queued = table.queue(A, "m", "miss")
    clock.advance(7)  # waited for its slot
    loading = table.advance(queued, Phase.LOADING)
    assert loading is not None and core.state.holders("m") == frozenset()
    warming = table.advance(loading, Phase.WARMING)
    assert warming is not None
    clock.advance(2)
    held = table.advance(warming, Phase.RESIDENT)
    assert held is not None and held.resident_since == clock.now and held.queued_at == 1000
    assert core.state.holders("m") == {A}
    assert [getattr(a, "phase", None) for _, a in seen] == [
        Phase.QUEUED, Phase.LOADING, Phase.WARMING, Phase.RESIDENT]


def test_each_transition_is_logged_with_its_reason_when_info_is_on(
        caplog: pytest.LogCaptureFixture) -> None:
    table, _, _, _ = _table()
    with caplog.at_level(logging.INFO, logger="gateway.residency.holdings"):
        queued = table.queue(A, "m", "miss", PROBATION)
        table.advance(queued, Phase.FAILED, "out of memory")
    assert [r.getMessage() for r in caplog.records] == [
        f"m on {A}: new -> queued (miss, probation)",
        f"m on {A}: queued -> failed (out of memory, probation)"]


def test_leaving_resident_unroutes_before_the_unload_when_evicted() -> None:
    table, _, core, _ = _table()
    held = table.adopt(A, "m")
    assert core.state.holders("m") == {A}
    draining = table.advance(held, Phase.DRAINING, "room")
    assert core.state.holders("m") == frozenset() and draining is not None
    unloading = table.advance(draining, Phase.UNLOADING)
    assert unloading is not None and table.advance(unloading, None) is None
    assert table.get(A, "m") is None and table.gone_since(A, "m", 0.0)


def test_a_transition_is_refused_when_the_record_changed_since() -> None:
    table, _, _, _ = _table()
    first = table.queue(A, "m", "miss")
    loading = table.advance(first, Phase.LOADING)
    assert loading is not None
    table.drop(loading)  # the member restarted
    again = table.queue(A, "m", "demand")
    with pytest.raises(StaleTransition):
        table.advance(loading, Phase.RESIDENT)  # the old load's completion
    assert table.get(A, "m") == again


@pytest.mark.parametrize("phase", list(Phase))
def test_only_allowed_transitions_pass_when_a_holding_is_in_each_phase(phase: Phase) -> None:
    for target in [*Phase, None]:
        table, _, _, _ = _table()
        held = table.queue(A, "m", "miss")
        path = {Phase.QUEUED: [], Phase.LOADING: [Phase.LOADING],
                Phase.WARMING: [Phase.LOADING, Phase.WARMING],
                Phase.RESIDENT: [Phase.LOADING, Phase.RESIDENT],
                Phase.DRAINING: [Phase.LOADING, Phase.RESIDENT, Phase.DRAINING],
                Phase.UNLOADING: [Phase.LOADING, Phase.RESIDENT, Phase.DRAINING,
                                  Phase.UNLOADING],
                Phase.FAILED: [Phase.FAILED]}[phase]
        for step in path:
            held = table.advance(held, step)  # type: ignore[assignment]
        if target in ALLOWED[phase]:
            table.advance(held, target)
        else:
            with pytest.raises(StaleTransition):
                table.advance(held, target)


def test_queue_is_refused_when_the_model_is_held_there_already() -> None:
    table, _, _, _ = _table()
    table.adopt(A, "m")
    with pytest.raises(StaleTransition):
        table.queue(A, "m", "demand")
