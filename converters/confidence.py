"""Confidence intervals for an agreement rate measured on a finite evaluation set.

- :func:`wilson`: the Wilson score interval for ``k`` agreeing of ``n`` independent
  samples (well-behaved near 100%, unlike the normal approximation).
- :func:`photo_bootstrap`: views cropped from the same photo are not independent; this
  percentile bootstrap resamples whole photos (clusters), so the interval is as wide as
  the number of distinct photos warrants.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Interval:
    rate: float
    low: float
    high: float
    n: int

    def describe(self) -> str:
        return f"{self.rate:.1%} [{self.low:.1%}, {self.high:.1%}]"


def wilson(agreeing: int, n: int, z: float = 1.96) -> Interval:
    if n == 0:
        return Interval(float("nan"), 0.0, 1.0, 0)
    p = agreeing / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return Interval(p, max(0.0, centre - half), min(1.0, centre + half), n)


def photo_bootstrap(matches: Sequence[bool], groups: Sequence[str], rounds: int = 2000,
                    seed: int = 0, level: float = 0.95) -> Interval:
    """Percentile interval of the agreement rate when whole groups are resampled."""
    agree = np.asarray(matches, dtype=np.float64)
    names = sorted(set(groups))
    index = {name: i for i, name in enumerate(names)}
    member = np.asarray([index[g] for g in groups])
    hits = np.bincount(member, weights=agree, minlength=len(names))
    sizes = np.bincount(member, minlength=len(names)).astype(np.float64)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(names), size=(rounds, len(names)))
    rates = hits[draws].sum(axis=1) / sizes[draws].sum(axis=1)
    tail = (1 - level) / 2
    return Interval(float(agree.mean()), float(np.quantile(rates, tail)),
                    float(np.quantile(rates, 1 - tail)), len(agree))
