"""Replay a demand trace under each strategy, re-planning periodically, and measure.

Every ``replan_every`` steps a strategy allocates replicas for the demand seen at that
moment plus what drains the backlog within one period (times its headroom); between
re-plans the allocation is fixed and each pool runs through
:func:`scheduler.simulation.queueing.pool_step`. Measured:

- utilisation: busy compute slices over the compute slices of GPUs in use (a busy
  replica contributes its compute slices times its load fraction);
- GPUs in use (mean and peak);
- SLO attainment: requests served within their SLO over all requests;
- queueing: mean wait per request (M/M/c below capacity, fluid backlog above);
- pending replica-minutes: replicas wanted but not placed, times how long;
- repartitions and instances the driver refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scheduler.pools import PoolSpec
from scheduler.profiles import COMPUTE_SLICES
from scheduler.simulation.queueing import pool_step
from scheduler.simulation.strategies import Allocation, Strategy
from scheduler.simulation.trace import DemandTrace


@dataclass(frozen=True)
class StrategyResult:
    name: str
    utilisation: float
    gpus_used_mean: float
    gpus_used_peak: int
    slo_attainment: float
    mean_queue_ms: float
    pending_replica_minutes: float
    repartitions: int
    refused_instances: int

    def as_row(self) -> dict[str, float | int | str]:
        return {
            "strategy": self.name,
            "utilisation": round(self.utilisation, 3),
            "gpus_mean": round(self.gpus_used_mean, 1),
            "gpus_peak": self.gpus_used_peak,
            "slo_attainment": round(self.slo_attainment, 4),
            "mean_queue_ms": round(self.mean_queue_ms, 1),
            "pending_replica_min": round(self.pending_replica_minutes, 0),
            "repartitions": self.repartitions,
            "refused": self.refused_instances,
        }


def run_strategy(
    strategy: Strategy,
    pools: Sequence[PoolSpec],
    trace: DemandTrace,
    replan_every: int,
) -> StrategyResult:
    slo = {p.name: p.slo_ms / 1000 for p in pools}
    backlog = dict.fromkeys(trace.pools, 0.0)
    allocation = Allocation({}, 0)
    busy = provisioned = arrivals = on_time = wait = pending_min = 0.0
    gpus: list[int] = []
    repartitions = refused = 0
    for k, row in enumerate(trace.demand):
        if k % replan_every == 0:
            # Demand now, plus what it takes to drain the backlog within one period.
            drain = replan_every * trace.step_s
            forecast: Mapping[str, float] = {
                name: rate + backlog[name] / drain
                for name, rate in zip(trace.pools, row, strict=True)
            }
            allocation = strategy.allocate(forecast)
            repartitions += allocation.repartitioned
            refused += allocation.refused
        gpus.append(allocation.gpus_used)
        provisioned += COMPUTE_SLICES * allocation.gpus_used * trace.step_s
        pending_min += allocation.pending * trace.step_s / 60
        for name, rate in zip(trace.pools, row, strict=True):
            alloc = allocation.pools.get(name)
            replicas, mu = (alloc.replicas, alloc.mu) if alloc else (0, 0.0)
            out = pool_step(rate, replicas, mu, backlog[name], trace.step_s, slo[name])
            backlog[name] = out.backlog
            arrivals += rate * trace.step_s
            on_time += out.on_time
            wait += out.wait_s_total
            if alloc and replicas * mu > 0:
                load = out.served / (replicas * mu * trace.step_s)
                busy += load * replicas * alloc.compute_slices * trace.step_s
    return StrategyResult(
        name=strategy.name,
        utilisation=busy / provisioned if provisioned else 0.0,
        gpus_used_mean=sum(gpus) / len(gpus) if gpus else 0.0,
        gpus_used_peak=max(gpus, default=0),
        slo_attainment=on_time / arrivals if arrivals else 1.0,
        mean_queue_ms=1000 * wait / arrivals if arrivals else 0.0,
        pending_replica_minutes=pending_min,
        repartitions=repartitions,
        refused_instances=refused,
    )


def simulate(
    strategies: Sequence[Strategy],
    pools: Sequence[PoolSpec],
    trace: DemandTrace,
    replan_every: int,
) -> list[StrategyResult]:
    return [run_strategy(s, pools, trace, replan_every) for s in strategies]
