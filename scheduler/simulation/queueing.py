"""Queueing model for a pool of ``c`` replicas that each serve ``mu`` requests/s at the SLO.

Below capacity, waiting is the M/M/c (Erlang C) wait: requests arrive as a Poisson
stream and each replica is one server. This is conservative for batching servers, whose
effective rate grows with queue length. Above capacity, the excess accumulates as a
fluid backlog that drains when capacity returns; a backlogged request waits
``backlog / capacity`` seconds. A request meets its SLO when its wait fits in the part of
the SLO not used by execution (half, per Nexus' batching rule).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def erlang_c(servers: int, offered: float) -> float:
    """Probability that an arrival waits, for ``offered`` = lambda / mu (< servers)."""
    if servers <= 0:
        return 1.0
    if offered <= 0:
        return 0.0
    if offered >= servers:
        return 1.0
    # Erlang B by its stable recurrence, then C from B.
    b = 1.0
    for k in range(1, servers + 1):
        b = offered * b / (k + offered * b)
    rho = offered / servers
    return b / (1 - rho + rho * b)


def mmc_wait_s(arrival: float, mu: float, servers: int) -> float:
    """Mean M/M/c queueing delay in seconds (infinite at or above capacity)."""
    if arrival <= 0:
        return 0.0
    if servers <= 0 or mu <= 0 or arrival >= servers * mu:
        return math.inf
    return erlang_c(servers, arrival / mu) / (servers * mu - arrival)


def mmc_late_fraction(arrival: float, mu: float, servers: int, budget_s: float) -> float:
    """P(wait > budget) in M/M/c."""
    if arrival <= 0:
        return 0.0
    if servers <= 0 or mu <= 0 or arrival >= servers * mu:
        return 1.0
    return erlang_c(servers, arrival / mu) * math.exp(-(servers * mu - arrival) * budget_s)


@dataclass(frozen=True)
class StepOutcome:
    served: float
    """Requests served this step."""
    on_time: float
    """Requests served within the SLO."""
    wait_s_total: float
    """Sum over this step's arrivals of their queueing delay (seconds)."""
    backlog: float
    """Requests still waiting at the end of the step."""


def pool_step(
    arrival_rps: float,
    replicas: int,
    mu: float,
    backlog: float,
    step_s: float,
    slo_s: float,
) -> StepOutcome:
    """One time step of one pool: fluid backlog plus M/M/c below capacity."""
    arrivals = arrival_rps * step_s
    capacity = replicas * mu
    work = backlog + arrivals
    served = min(work, capacity * step_s)
    left = work - served
    budget = slo_s / 2
    if arrivals <= 0:
        return StepOutcome(served, served, 0.0, left)
    if capacity <= 0:
        return StepOutcome(0.0, 0.0, arrivals * step_s, left)
    if left > 1e-9 or backlog > 1e-9:  # overloaded: FIFO behind the backlog
        delay = (backlog + left) / 2 / capacity
        on_time = served if delay <= budget else 0.0
        return StepOutcome(served, on_time, arrivals * delay, left)
    wait = mmc_wait_s(arrival_rps, mu, replicas)
    late = mmc_late_fraction(arrival_rps, mu, replicas, budget)
    return StepOutcome(served, served * (1 - late), arrivals * wait, 0.0)
