"""Load scenarios as locust ``LoadTestShape`` classes: steady, ramp, spike, mixed models.

Each shape is a pure plan ``f(t) -> (users, spawn_rate) | None`` (tested without locust
running) wrapped in a thin class that reads its parameters from the command line
(``--scenario-users``, ``--scenario-duration``, ``--scenario-spawn-rate``; see
:mod:`loadtests.locust_common`). A scenario is chosen by adding one file of
``loadtests/scenarios/`` to locust's ``-f`` list, since locust uses the first shape class
it finds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from locust import LoadTestShape

Tick = tuple[int, float] | None


@dataclass(frozen=True)
class ScenarioParams:
    users: int = 8
    duration_s: float = 60.0
    spawn_rate: float = 4.0

    @classmethod
    def from_options(cls, options: Any) -> ScenarioParams:
        return cls(
            users=max(1, int(getattr(options, "scenario_users", cls.users))),
            duration_s=float(getattr(options, "scenario_duration", cls.duration_s)),
            spawn_rate=float(getattr(options, "scenario_spawn_rate", cls.spawn_rate)),
        )


def steady(t: float, p: ScenarioParams) -> Tick:
    """Ramp to ``users`` at ``spawn_rate``, hold until ``duration``."""
    return None if t >= p.duration_s else (p.users, p.spawn_rate)


def ramp(t: float, p: ScenarioParams) -> Tick:
    """From 1 user to ``users`` linearly over the whole duration (find the knee)."""
    if t >= p.duration_s:
        return None
    users = 1 + math.floor((p.users - 1) * t / p.duration_s)
    return (users, max(p.spawn_rate, 1.0))


def spike(t: float, p: ScenarioParams) -> Tick:
    """A quarter of ``users`` for 40% of the run, all of them at once for 20%, then back
    to the base: tests shedding under a burst and recovery after it."""
    if t >= p.duration_s:
        return None
    base = max(1, p.users // 4)
    frac = t / p.duration_s
    if 0.4 <= frac < 0.6:
        return (p.users, float(p.users))  # the spike arrives within a second
    return (base, float(p.users))


def mixed_phase(t: float, p: ScenarioParams, phases: int) -> int:
    """Which model the mixed scenario favours at ``t``: phases of equal length."""
    return min(phases - 1, int(phases * t / p.duration_s)) if p.duration_s > 0 else 0


class _Scenario(LoadTestShape):
    abstract = True

    def params(self) -> ScenarioParams:
        options = self.runner.environment.parsed_options if self.runner else None
        return ScenarioParams.from_options(options)


class SteadyShape(_Scenario):
    def tick(self) -> Tick:
        return steady(self.get_run_time(), self.params())


class RampShape(_Scenario):
    def tick(self) -> Tick:
        return ramp(self.get_run_time(), self.params())


class SpikeShape(_Scenario):
    def tick(self) -> Tick:
        return spike(self.get_run_time(), self.params())


class MixedModelsShape(_Scenario):
    """Steady users; the model mix (``--models``) shifts during the run: in phase i the
    i-th model gets 3x its weight, so load moves between pools (per-pool saturation and
    autoscaling). Users read the current mix from the environment: local runs only."""

    def tick(self) -> Tick:
        params = self.params()
        t = self.get_run_time()
        environment = self.runner.environment if self.runner else None
        base = getattr(environment, "infergate_base_mix", None)
        if base is not None:
            phase = mixed_phase(t, params, max(2, len(base.weights)))
            environment.infergate_mix = base.favouring(phase)  # type: ignore[union-attr]
        return steady(t, params)
