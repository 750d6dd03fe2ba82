"""Load scenarios: the pure plans behind the LoadTestShape classes."""

from __future__ import annotations

import pytest

from loadtests.shapes import ScenarioParams, mixed_phase, ramp, spike, steady
from loadtests.workload import ModelMix

P = ScenarioParams(users=20, duration_s=100.0, spawn_rate=5.0)


def test_steady_holds_users_until_the_duration_when_running() -> None:
    assert steady(0.0, P) == (20, 5.0)
    assert steady(99.9, P) == (20, 5.0)
    assert steady(100.0, P) is None


def test_ramp_grows_from_one_user_to_peak_when_time_passes() -> None:
    users = [ramp(t, P)[0] for t in range(0, 100, 10)]  # type: ignore[index]
    assert users[0] == 1 and users == sorted(users) and max(users) >= 18
    assert ramp(100.0, P) is None


def test_spike_jumps_to_peak_in_the_middle_and_returns_to_base() -> None:
    assert spike(10.0, P) == (5, 20.0)
    assert spike(50.0, P) == (20, 20.0)
    assert spike(80.0, P) == (5, 20.0)
    assert spike(100.0, P) is None


@pytest.mark.parametrize(("t", "phase"), [(0.0, 0), (49.0, 0), (50.0, 1), (99.0, 1), (150.0, 1)])
def test_mixed_phase_moves_through_models_when_time_passes(t: float, phase: int) -> None:
    assert mixed_phase(t, P, 2) == phase


def test_model_mix_favouring_weights_one_model_up() -> None:
    mix = ModelMix.parse("a:1,b:1")
    assert mix.favouring(1).weights == (("a", 1.0), ("b", 3.0))
    assert mix.favouring(2).weights == (("a", 3.0), ("b", 1.0))
