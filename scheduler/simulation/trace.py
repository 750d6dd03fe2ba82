"""Seeded demand traces: a diurnal curve per pool, with noise and short spikes.

Each pool's ``target_rps`` is taken as its daily mean. Demand follows
``mean * (1 + amplitude * sin(2 pi (t - peak) / 24h + pi/2))`` with the peak in the
afternoon (per-pool jitter of +/- 2 h), multiplicative noise, and spikes arriving as a
Poisson process (about one per pool per day) that multiply demand by 1.5-2.5x for 5-20
minutes.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from scheduler.pools import PoolSpec


@dataclass(frozen=True)
class DemandTrace:
    step_s: float
    pools: tuple[str, ...]
    demand: tuple[tuple[float, ...], ...]
    """demand[t][i]: requests/s of pool i during step t."""

    @property
    def steps(self) -> int:
        return len(self.demand)


def diurnal_trace(
    pools: Sequence[PoolSpec],
    rng: random.Random,
    hours: float = 24.0,
    step_min: float = 5.0,
    spikes_per_day: float = 1.0,
    peak_hour: float = 14.0,
) -> DemandTrace:
    steps = int(hours * 60 / step_min)
    columns = []
    for pool in pools:
        amplitude = rng.uniform(0.3, 0.7)
        peak = peak_hour + rng.uniform(-2.0, 2.0)
        spikes = []
        t = rng.expovariate(spikes_per_day / 24.0) if spikes_per_day > 0 else math.inf
        while t < hours:
            spikes.append((t, t + rng.uniform(5, 20) / 60, rng.uniform(1.5, 2.5)))
            t += rng.expovariate(spikes_per_day / 24.0)
        column = []
        for k in range(steps):
            hour = k * step_min / 60
            level = 1 + amplitude * math.cos(2 * math.pi * (hour - peak) / 24)
            for begin, end, factor in spikes:
                if begin <= hour < end:
                    level *= factor
            noise = rng.lognormvariate(0.0, 0.05)
            column.append(max(0.0, pool.target_rps * level * noise))
        columns.append(column)
    demand = tuple(tuple(col[k] for col in columns) for k in range(steps))
    return DemandTrace(step_min * 60, tuple(p.name for p in pools), demand)
