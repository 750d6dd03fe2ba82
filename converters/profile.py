"""Latency and throughput of each variant on this machine, measured side by side.

For every batch size (powers of two up to the maximum) all variants run interleaved,
iteration by iteration, so a noisy neighbour slows them all alike and the ratios hold.
Inputs are real evaluation samples. p50/p99 per batch; throughput = batch / p50.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from converters.datasets import SampleSet
from converters.runtime import RuntimeSettings, feeds_for, open_session


@dataclass(frozen=True)
class BatchTiming:
    batch: int
    p50_ms: float
    p99_ms: float
    throughput: float  # samples per second at p50

    def to_dict(self) -> dict[str, float]:
        return {"batch": self.batch, "p50_ms": self.p50_ms, "p99_ms": self.p99_ms,
                "throughput": self.throughput}


@dataclass(frozen=True)
class VariantProfile:
    variant: str
    provider: str
    timings: tuple[BatchTiming, ...]

    def at(self, batch: int) -> BatchTiming:
        for timing in self.timings:
            if timing.batch == batch:
                return timing
        raise KeyError(batch)

    @property
    def speed(self) -> float:
        """Geometric-mean throughput over the profiled batch sizes: one number that
        rewards both batch-1 latency and large-batch throughput."""
        return math.exp(sum(math.log(t.throughput) for t in self.timings) / len(self.timings))

    def to_dict(self) -> dict[str, Any]:
        return {"variant": self.variant, "provider": self.provider,
                "speed": self.speed, "timings": [t.to_dict() for t in self.timings]}


@dataclass(frozen=True)
class ProfileTarget:
    name: str
    model: Path
    runtime: RuntimeSettings


def batch_sizes_up_to(max_batch: int) -> tuple[int, ...]:
    sizes, size = [], 1
    while size < max_batch:
        sizes.append(size)
        size *= 2
    sizes.append(max_batch)
    return tuple(sizes)


def profile_variants(
    targets: Sequence[ProfileTarget],
    samples: SampleSet,
    batch_sizes: Sequence[int],
    iterations: int = 20,
    warmup: int = 3,
    progress: Callable[[float], None] = lambda _: None,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, VariantProfile]:
    sessions = {t.name: open_session(t.model, t.runtime) for t in targets}
    times: dict[str, dict[int, list[float]]] = {t.name: {} for t in targets}
    order = [t.name for t in targets]
    for step, batch in enumerate(batch_sizes):
        feeds = samples.first_batch(batch)
        per_session = {n: feeds_for(s, feeds) for n, s in sessions.items()}
        for name in order:
            for _ in range(warmup):
                sessions[name].run(None, per_session[name])
        for iteration in range(iterations):
            # rotate who goes first so no variant always runs right after another
            rotated = order[iteration % len(order):] + order[: iteration % len(order)]
            for name in rotated:
                start = clock()
                sessions[name].run(None, per_session[name])
                times[name].setdefault(batch, []).append(clock() - start)
        progress((step + 1) / len(batch_sizes))
    return {
        t.name: VariantProfile(t.name, sessions[t.name].get_providers()[0],
                               _timings(times[t.name]))
        for t in targets
    }


def _timings(per_batch: Mapping[int, list[float]]) -> tuple[BatchTiming, ...]:
    result = []
    for batch, seconds in sorted(per_batch.items()):
        ms = np.asarray(seconds) * 1000.0
        p50 = float(np.percentile(ms, 50))
        result.append(BatchTiming(batch, p50, float(np.percentile(ms, 99)), batch / (p50 / 1e3)))
    return tuple(result)
