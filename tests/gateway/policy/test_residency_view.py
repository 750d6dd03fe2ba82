"""The residency policy's terms: demand smoothed whether read often or rarely, the
replicas a model's demand wants, ``min_replicas`` resolved."""

from __future__ import annotations

import pytest

from gateway.policy.residency_view import resolve_min_replicas, smoothed_rate, wanted_replicas
from tests.gateway.policy.test_residency import NOW, OLD, K, _model

# --- smoothed_rate ---------------------------------------------------------------------

def test_smoothed_rate_converges_to_a_steady_rate_whether_read_often_or_rarely() -> None:
    often, rarely = 0.0, 0.0
    for second in range(1, 301):  # 20 requests a second for 5 minutes
        often = smoothed_rate(often, second - 1, 20, second, half_life_s=30)
        if second % 10 == 0:
            rarely = smoothed_rate(rarely, second - 10, 200, second, half_life_s=30)
    assert often == pytest.approx(20 * (1 - 0.5 ** 10), rel=1e-9)
    assert rarely == pytest.approx(often, rel=1e-9)


def test_smoothed_rate_halves_an_old_rate_per_half_life_without_requests() -> None:
    assert smoothed_rate(40.0, 0.0, 0, 30.0, half_life_s=30) == pytest.approx(20.0)
    assert smoothed_rate(40.0, 0.0, 0, 60.0, half_life_s=30) == pytest.approx(10.0)
    # a burst moves it part of the way: 300 requests in 10 s (30/s) from 0
    assert smoothed_rate(0.0, 0.0, 300, 10.0, half_life_s=10) == pytest.approx(15.0)


def test_smoothed_rate_keeps_the_previous_rate_when_no_time_elapsed() -> None:
    assert smoothed_rate(7.0, 5.0, 3, 5.0, half_life_s=30) == 7.0
    assert smoothed_rate(7.0, 5.0, 3, 4.0, half_life_s=30) == 7.0  # a clock read early
    assert smoothed_rate(7.0, 0.0, 30, 10.0, half_life_s=0) == 3.0  # no smoothing


# --- wanted_replicas -------------------------------------------------------------------

@pytest.mark.parametrize(("demand", "min_replicas", "last_used", "members", "wanted"), [
    (0.0, 0, None, 4, 0),  # on demand and never used: nowhere
    (0.0, 0, OLD, 4, 0),  # idle: wanted nowhere (kept where it is while room lasts)
    (0.0, 0, NOW - 10, 4, 1),  # used within min_resident_s: one
    (0.001, 0, OLD, 4, 1),  # any demand: one
    (45.0, 0, NOW, 4, 1),  # 90 % of what one replica carries (replica_lead)
    (45.1, 0, NOW, 4, 2),  # the next one loads before the first is saturated
    (120.0, 0, NOW, 4, 3),
    (1000.0, 0, NOW, 4, 4),  # capped at the available members
    (0.0, 3, None, 4, 3),  # min_replicas
    (60.0, 3, NOW, 4, 3),
    (0.0, 5, None, 4, 4),  # pinned to every member of a pool that has lost one
    (20.0, 0, NOW, 0, 0),  # no member
])
def test_wanted_replicas_is_demand_over_rps_per_replica_capped_at_available_members(
        demand: float, min_replicas: int, last_used: float | None, members: int,
        wanted: int) -> None:
    model = _model("m", demand=demand, min_replicas=min_replicas, last_used=last_used)
    assert wanted_replicas(model, members, K, NOW) == wanted


@pytest.mark.parametrize(("configured", "on_demand", "rolling", "expected"), [
    (None, False, False, 3), (None, True, False, 0), (2, True, False, 2), (5, False, False, 3),
    (None, True, True, 1), (0, False, True, 1)])
def test_resolve_min_replicas_when_configured_so(configured: int | None, on_demand: bool,
                                                 rolling: bool, expected: int) -> None:
    assert resolve_min_replicas(configured, on_demand, 3, rolling) == expected
