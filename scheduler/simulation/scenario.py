"""The default simulated setting: one fleet, many pools, one day of diurnal demand."""

from __future__ import annotations

import random
from dataclasses import dataclass

from scheduler.inventory import Fleet
from scheduler.pools import PoolSpec
from scheduler.request import PlannerOptions
from scheduler.simulation.simulator import StrategyResult, simulate
from scheduler.simulation.strategies import (
    CountFirstFit,
    PlannedMig,
    StaticUniformLayout,
    Strategy,
    WholeGpuPerPool,
)
from scheduler.simulation.trace import DemandTrace, diurnal_trace
from scheduler.workloads import MODEL_SIZES, SMALL_MODELS, synthetic_fleet, synthetic_pools


@dataclass(frozen=True)
class Scenario:
    """48 A100-80GB, 60 pools of mostly small models whose mean load is about 1.7
    1g-slices of work each; re-planned every 15 minutes with 15% headroom."""

    gpus: int = 48
    pools: int = 60
    hours: float = 24.0
    step_min: float = 5.0
    replan_min: float = 15.0
    headroom: float = 1.15
    load: float = 1.2
    seed: int = 7
    gpu_type: str = "A100-80GB"
    small_models: bool = True


def build(scenario: Scenario) -> tuple[Fleet, tuple[PoolSpec, ...], DemandTrace]:
    rng = random.Random(scenario.seed)
    fleet = synthetic_fleet(scenario.gpus, gpu_type=scenario.gpu_type)
    sizes = SMALL_MODELS if scenario.small_models else MODEL_SIZES
    pools = synthetic_pools(
        scenario.pools, rng, load=scenario.load, priorities=(0, 100, 1000), sizes=sizes
    )
    trace = diurnal_trace(pools, rng, hours=scenario.hours, step_min=scenario.step_min)
    return fleet, pools, trace


def strategies(scenario: Scenario, fleet: Fleet, pools: tuple[PoolSpec, ...]) -> list[Strategy]:
    # Both objectives explicitly: the default (auto) would pack the empty fleet once for
    # efficiency, then re-plan for stability.
    ours = PlannerOptions(
        solver="heuristic", objective="efficiency", headroom=scenario.headroom, seed=scenario.seed
    )
    return [
        PlannedMig(fleet, pools, ours),
        PlannedMig(
            fleet,
            pools,
            ours.model_copy(update={"objective": "stability"}),
            name="MIG planner, stability objective",
        ),  # fmt: skip
        WholeGpuPerPool(fleet, pools, scenario.headroom),
        StaticUniformLayout(fleet, pools, "all-1g", scenario.headroom),
        StaticUniformLayout(fleet, pools, "all-balanced", scenario.headroom),
        CountFirstFit(fleet, pools, scenario.headroom),
    ]


def run(scenario: Scenario) -> list[StrategyResult]:
    fleet, pools, trace = build(scenario)
    replan_every = max(1, round(scenario.replan_min / scenario.step_min))
    return simulate(strategies(scenario, fleet, pools), pools, trace, replan_every)
