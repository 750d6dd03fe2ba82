"""The residency benchmark's trace and what a fixed placement holds (pure: no processes,
no network): the phases and each one's Zipf popularity over a ranking that a reshuffle
turns, the open-loop schedule of requests every arm sends (:func:`schedule`), the best
fixed placement known in advance (:func:`best_placement`) and a member's budget with the
static baseline's models (:func:`first_fit`).

``tests.gateway.residency.simulate`` replays the same trace in virtual time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

FLAT_S, STEEP_S = 0.9, 1.3
PROTOCOLS = ("http", "grpc")


# -- the schedule ---------------------------------------------------------------------

@dataclass(frozen=True)
class Phase:
    label: str
    s: float  # Zipf exponent
    ranking: int  # which popularity order: a new one is a reshuffle


PHASES = (Phase("flat", FLAT_S, 0), Phase("flat, reshuffled", FLAT_S, 1),
          Phase("steep", STEEP_S, 1), Phase("steep, reshuffled", STEEP_S, 2))


def zipf_weights(n: int, s: float) -> np.ndarray:
    """Probability of each rank 1..n under Zipf's law with exponent ``s``."""
    w = np.arange(1, n + 1, dtype=np.float64) ** -s
    return w / w.sum()


def rankings(models: Sequence[str], seed: int, count: int) -> list[list[str]]:
    """``count`` popularity orders: a shuffle of ``models``, then each the last turned by
    half (its least popular half leads, each half shuffled again): every reshuffle puts
    models that were unpopular on top."""
    rng = np.random.default_rng([seed, 1])  # apart from the arrivals' generator
    order = [models[i] for i in rng.permutation(len(models))]
    out = [order]
    for _ in range(count - 1):
        half = len(order) // 2
        top, bottom = order[:half], order[half:]
        order = ([bottom[i] for i in rng.permutation(len(bottom))]
                 + [top[i] for i in rng.permutation(len(top))])
        out.append(order)
    return out


def popularity(models: Sequence[str], seed: int,
               phases: Sequence[Phase] = PHASES) -> list[dict[str, float]]:
    """Per phase, each model's probability of being asked for."""
    orders = rankings(models, seed, max(p.ranking for p in phases) + 1)
    return [dict(zip(orders[p.ranking], zipf_weights(len(models), p.s), strict=True))
            for p in phases]


def reshuffles(phase_s: float, phases: Sequence[Phase] = PHASES) -> list[float]:
    """Seconds of schedule at which the ranking changes."""
    return [i * phase_s for i in range(1, len(phases))
            if phases[i].ranking != phases[i - 1].ranking]


@dataclass(frozen=True)
class Arrival:
    t: float  # seconds after the schedule's start
    model: str
    phase: int  # index into the phases
    protocol: str  # http | grpc


def schedule(models: Sequence[str], rate: float, phase_s: float, seed: int,
             phases: Sequence[Phase] = PHASES) -> list[Arrival]:
    """Poisson arrivals at ``rate`` per second for every phase of ``phase_s``; each
    request's model drawn by its phase's popularity, its protocol by a coin. The same
    arguments give the same schedule (every arm runs the same traffic)."""
    rng = np.random.default_rng(seed)
    tables = [(list(p), np.fromiter(p.values(), dtype=np.float64))
              for p in popularity(models, seed, phases)]
    out: list[Arrival] = []
    t = float(rng.exponential(1 / rate))
    while t < len(phases) * phase_s:
        phase = int(t // phase_s)
        names, weights = tables[phase]
        model = names[int(rng.choice(len(names), p=weights))]
        out.append(Arrival(t, model, phase, PROTOCOLS[int(rng.random() < 0.5)]))
        t += float(rng.exponential(1 / rate))
    return out


# -- the best fixed placement ---------------------------------------------------------

def best_placement(p: Mapping[str, float], footprints: Mapping[str, int],
                   budget: int | None, members: int = 2, kept: int = 0) -> frozenset[str]:
    """What a placement that knew the popularity ``p`` in advance holds, never moving:
    the models most requested per byte first, each on the first member it still fits
    (a greedy knapsack per member); ``kept`` bytes of the first member's budget left
    free. Every model when ``budget`` is None."""
    if budget is None:
        return frozenset(p)
    room, held = [budget - kept] + [budget] * (members - 1), set()
    for m in sorted(p, key=lambda m: (-p[m] / footprints[m], m)):
        slot = next((i for i, r in enumerate(room) if footprints[m] <= r), None)
        if slot is not None:
            room[slot] -= footprints[m]
            held.add(m)
    return frozenset(held)


Placer = Callable[[Mapping[str, float], Mapping[str, int], int | None], frozenset[str]]


def placements(models: Sequence[str], footprints: Mapping[str, int], budget: int | None,
               seed: int, phases: Sequence[Phase] = PHASES,
               placer: Placer = best_placement) -> list[frozenset[str]]:
    """The best fixed placement of each phase (``placer``: another such placement, as
    :func:`serving_placement`)."""
    return [placer(p, footprints, budget) for p in popularity(models, seed, phases)]


def serving_placement(p: Mapping[str, float], footprints: Mapping[str, int],
                      budget: int | None, members: int = 2) -> frozenset[str]:
    """The best fixed placement that still serves every model: one member keeps free
    the room of the largest model the best fixed placement leaves out, where those
    models load when asked. A reference, not a bound: it is what any placement serving
    them holds while such a room is taken: all the time on a host whose loads follow
    one another (100-130 a minute on two members at a quarter budget here)."""
    best = best_placement(p, footprints, budget, members)
    kept = max((footprints[m] for m in p if m not in best), default=0)
    return best_placement(p, footprints, budget, members, kept)


def ideal_hit_share(models: Sequence[str], footprints: Mapping[str, int],
                    budget: int | None, seed: int,
                    phases: Sequence[Phase] = PHASES) -> list[float]:
    """Per phase, the share of requests the best fixed placement takes, expected."""
    return [float(sum(p[m] for m in best_placement(p, footprints, budget)))
            for p in popularity(models, seed, phases)]


# -- budgets --------------------------------------------------------------------------

def budget_of(footprints: Mapping[str, int], fraction: float) -> int:
    """A member's budget: ``fraction`` of every model's footprint together."""
    return math.ceil(fraction * sum(footprints.values()))


def first_fit(models: Sequence[str], footprints: Mapping[str, int], budget: int) -> list[str]:
    """The static baseline's models: in catalogue order, each that still fits ``budget``."""
    kept, used = [], 0
    for m in models:
        if used + footprints[m] <= budget:
            kept.append(m)
            used += footprints[m]
    return kept
