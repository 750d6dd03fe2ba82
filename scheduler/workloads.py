"""Synthetic fleets and pools, seeded, for the simulator, the benchmark and the tests.

Pools follow a simple serving model: a replica on a 1g slice sustains ``base_rps`` at the
SLO, and bigger profiles scale sub-linearly with their compute slices (batching helps,
memory bandwidth does not grow as fast). A whole non-partitioned GPU is 5% faster than
a 7g instance (no MIG overhead). Model sizes are a mix: most fit a 1g.10gb slice, some
need 2 or 4 memory slices, a few a whole GPU.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from scheduler.inventory import Fleet, GpuSpec, NodeSpec
from scheduler.pools import CapacityEntry, PoolSpec

SPEEDUP = {19: 1.0, 20: 1.0, 15: 1.05, 14: 1.95, 9: 2.85, 5: 3.7, 0: 6.3}
"""Throughput of each profile relative to a 1g slice (profile 19)."""
WHOLE_GPU_SPEEDUP = SPEEDUP[0] * 1.05

SizeMix = tuple[tuple[float, tuple[float, float]], ...]
"""(share of pools, memory GiB range) pairs."""

MODEL_SIZES: SizeMix = (
    (0.62, (1.0, 9.0)),
    (0.25, (10.0, 19.0)),
    (0.10, (20.0, 39.0)),
    (0.03, (40.0, 78.0)),
)
"""Model memory on an 80 GB-class GPU: 1, 2, 4 and 8 memory slices at least."""

SMALL_MODELS: SizeMix = ((0.85, (1.0, 9.0)), (0.12, (10.0, 19.0)), (0.03, (20.0, 39.0)))
"""A many-small-models fleet (embedding, vision, classic NLP), for the scale benchmark."""


def synthetic_fleet(
    gpus: int,
    gpus_per_node: int = 8,
    gpu_type: str = "A100-80GB",
    prefix: str = "node",
) -> Fleet:
    """``gpus`` GPUs of one type, ``gpus_per_node`` to a node, all MIG-enabled and empty."""
    nodes = []
    for start in range(0, gpus, gpus_per_node):
        count = min(gpus_per_node, gpus - start)
        nodes.append(
            NodeSpec(
                name=f"{prefix}-{start // gpus_per_node:04d}",
                labels={"nvidia.com/gpu.product": gpu_type},
                gpus=tuple(GpuSpec(index=i, type=gpu_type) for i in range(count)),
            )
        )
    return Fleet(nodes=tuple(nodes))


def pool_capacity(base_rps: float, whole_types: Sequence[str] = ()) -> tuple[CapacityEntry, ...]:
    entries = [CapacityEntry(profile=p, rps=round(base_rps * s, 3)) for p, s in SPEEDUP.items()]
    entries += [
        CapacityEntry(gpu_type=t, rps=round(base_rps * WHOLE_GPU_SPEEDUP, 3)) for t in whole_types
    ]
    return tuple(entries)


def _memory(rng: random.Random, sizes: SizeMix) -> float:
    roll = rng.random()
    for share, (low, high) in sizes:
        if roll < share:
            return round(rng.uniform(low, high), 1)
        roll -= share
    return sizes[0][1][0]


def synthetic_pools(
    count: int,
    rng: random.Random,
    load: float = 1.0,
    priorities: Sequence[int] = (0,),
    max_replicas: int = 16,
    prefix: str = "pool",
    sizes: SizeMix = MODEL_SIZES,
) -> tuple[PoolSpec, ...]:
    """``count`` pools; a pool's target is lognormal around ``load`` 1g-slices of work."""
    pools = []
    for i in range(count):
        base = round(rng.uniform(50, 400), 1)
        slices_of_work = load * rng.lognormvariate(0.0, 0.9)
        pools.append(
            PoolSpec(
                name=f"{prefix}-{i:04d}",
                model=f"model-{i % 97:02d}",
                memory_gib=_memory(rng, sizes),
                target_rps=round(base * slices_of_work, 2),
                slo_ms=rng.choice((25.0, 50.0, 100.0, 250.0)),
                min_replicas=1,
                max_replicas=max_replicas,
                priority=rng.choice(list(priorities)),
                capacity=pool_capacity(base),
            )
        )
    return tuple(pools)
