"""Triton's priority levels: what they cost and what they buy, measured on the sample
model in a real Triton (issue 36: "measure before making it a default").

Two copies of EfficientNet-Lite0 are loaded side by side in one Triton: ``*_plain`` (the
sample's config, its dynamic batcher) and ``*_levels`` (the same with three priority
levels, default 2: the levels ``gateway.policy.triton_priority.level`` maps the
classes to; Triton turns the batcher's prefetching off for a model with levels).

- **Cost**: the same closed-loop gRPC load at 1, 4 and 16 clients, no request asking a
  level, both copies interleaved round by round: images/s, p50 and p99, levels / plain.
- **Value**: a flood of 16 clients and one light client at once on each copy; on
  ``*_levels`` the light client asks level 1 (critical) and the flood level 3
  (sheddable), on ``*_plain`` neither asks. The light client's p50 and p99 and the
  flood's images/s, levels / plain.

Medians over ``rounds``. The clients are Python threads on the same cores as Triton (as
in ``bench_batching``): both copies run under the same load, so the ratios compare them,
not the absolute figures. On this host the model runs in Triton's Python backend; a GPU
host's onnxruntime or TensorRT backend batches differently, so the cost there is for
that host's run of this benchmark to say.

    python -m loadtests.bench_priority [--rounds 5] [--seconds 2]
"""

from __future__ import annotations

import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from converters.samples import cat_input
from gateway.config.tenancy import Priority
from gateway.policy.triton_priority import LEVELS as CLASS_LEVELS
from gateway.policy.triton_priority import level
from loadtests.benchkit import LoadResult, closed_loop, rounds_main, write_variant
from loadtests.harness import median, table, triton

PLAIN, LEVELS = "effnet_plain", "effnet_levels"
COST_CLIENTS = (1, 4, 16)
FLOOD_CLIENTS = 16
CRITICAL = level(Priority.CRITICAL, len(CLASS_LEVELS))
SHEDDABLE = level(Priority.SHEDDABLE, len(CLASS_LEVELS))


def with_levels(config: mc.ModelConfig) -> None:
    """Three levels, the default the middle one (a request that asks none is standard)."""
    config.dynamic_batching.priority_levels = len(CLASS_LEVELS)
    config.dynamic_batching.default_priority_level = level(
        Priority.STANDARD, len(CLASS_LEVELS)) or 0


def beside(url: str, model: str, x: np.ndarray, seconds: float, light: int,
           flood: int) -> tuple[LoadResult, LoadResult]:
    """(light client, flood) run at once on ``model``, asking levels ``light`` and
    ``flood`` (0: none)."""
    with ThreadPoolExecutor(2) as pool:
        flooding = pool.submit(closed_loop, url, model, x, FLOOD_CLIENTS, seconds + 1.0,
                               priority=flood)
        lighter = pool.submit(closed_loop, url, model, x, 1, seconds, priority=light)
        return lighter.result(), flooding.result()


def run(rounds: int = 5, seconds: float = 2.0) -> list[dict[str, Any]]:
    assert CRITICAL is not None and SHEDDABLE is not None
    x = cat_input()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        repo.mkdir()
        write_variant(repo, PLAIN, lambda c: None)
        write_variant(repo, LEVELS, with_levels)
        with triton(repo, Path(tmp), (PLAIN, LEVELS)) as member:
            url = member.grpc_url
            for clients in COST_CLIENTS:
                figures: dict[str, list[LoadResult]] = {PLAIN: [], LEVELS: []}
                for r in range(rounds):
                    for variant in (PLAIN, LEVELS) if r % 2 == 0 else (LEVELS, PLAIN):
                        figures[variant].append(closed_loop(url, variant, x, clients, seconds))
                rows.append(_cost_row(clients, figures))
                print(f"[bench_priority] cost at {clients} clients: "
                      f"{rows[-1]['throughput_ratio']:.2f}x throughput, "
                      f"{rows[-1]['p99_ratio']:.2f}x p99", flush=True)
            pairs: dict[str, list[tuple[LoadResult, LoadResult]]] = {PLAIN: [], LEVELS: []}
            for r in range(rounds):
                for variant in (PLAIN, LEVELS) if r % 2 == 0 else (LEVELS, PLAIN):
                    levels = (CRITICAL, SHEDDABLE) if variant == LEVELS else (0, 0)
                    pairs[variant].append(beside(url, variant, x, seconds, *levels))
            rows.append(_value_row(pairs))
            print(f"[bench_priority] light beside a flood of {FLOOD_CLIENTS}: p99 "
                  f"{rows[-1]['light_p99_ratio']:.2f}x, flood "
                  f"{rows[-1]['flood_throughput_ratio']:.2f}x", flush=True)
    return rows


def _cost_row(clients: int, figures: dict[str, list[LoadResult]]) -> dict[str, Any]:
    def of(variant: str, figure: str) -> float:
        return median([float(getattr(r, figure)) for r in figures[variant]])

    row: dict[str, Any] = {"part": "cost", "clients": clients}
    for variant, side in ((PLAIN, "plain"), (LEVELS, "levels")):
        for figure, key in (("images_per_s", "ips"), ("p50_ms", "p50_ms"),
                            ("p99_ms", "p99_ms")):
            row[f"{side}_{key}"] = of(variant, figure)
    row.update(throughput_ratio=row["levels_ips"] / row["plain_ips"],
               p50_ratio=row["levels_p50_ms"] / row["plain_p50_ms"],
               p99_ratio=row["levels_p99_ms"] / row["plain_p99_ms"])
    return row


def _value_row(pairs: dict[str, list[tuple[LoadResult, LoadResult]]]) -> dict[str, Any]:
    row: dict[str, Any] = {"part": "value", "clients": 1 + FLOOD_CLIENTS}
    for variant, side in ((PLAIN, "plain"), (LEVELS, "levels")):
        row[f"{side}_light_p50_ms"] = median([light.p50_ms for light, _ in pairs[variant]])
        row[f"{side}_light_p99_ms"] = median([light.p99_ms for light, _ in pairs[variant]])
        row[f"{side}_flood_ips"] = median([flood.images_per_s for _, flood in pairs[variant]])
    row.update(light_p50_ratio=row["levels_light_p50_ms"] / row["plain_light_p50_ms"],
               light_p99_ratio=row["levels_light_p99_ms"] / row["plain_light_p99_ms"],
               flood_throughput_ratio=row["levels_flood_ips"] / row["plain_flood_ips"])
    return row


def markdown(rows: list[dict[str, Any]]) -> str:
    cost = table(
        ("clients", "images/s plain", "images/s levels", "p50 ms plain", "p50 ms levels",
         "p99 ms plain", "p99 ms levels", "throughput levels/plain", "p99 levels/plain"),
        ([r["clients"], f"{r['plain_ips']:.1f}", f"{r['levels_ips']:.1f}",
          f"{r['plain_p50_ms']:.1f}", f"{r['levels_p50_ms']:.1f}",
          f"{r['plain_p99_ms']:.1f}", f"{r['levels_p99_ms']:.1f}",
          f"{r['throughput_ratio']:.2f}x", f"{r['p99_ratio']:.2f}x"]
         for r in rows if r["part"] == "cost"))
    value = table(
        ("light client beside a flood of", "light p50 ms plain / levels",
         "light p99 ms plain / levels", "light p99 levels/plain",
         "flood images/s plain / levels", "flood levels/plain"),
        ([f"{r['clients'] - 1} clients",
          f"{r['plain_light_p50_ms']:.1f} / {r['levels_light_p50_ms']:.1f}",
          f"{r['plain_light_p99_ms']:.1f} / {r['levels_light_p99_ms']:.1f}",
          f"{r['light_p99_ratio']:.2f}x",
          f"{r['plain_flood_ips']:.1f} / {r['levels_flood_ips']:.1f}",
          f"{r['flood_throughput_ratio']:.2f}x"]
         for r in rows if r["part"] == "value"))
    return (f"Cost (no request asks a level):\n\n{cost}\n\nValue (levels: light critical, "
            f"flood sheddable; plain: no levels):\n\n{value}")


def main() -> None:
    rounds_main(__doc__ or "", run, markdown)


if __name__ == "__main__":
    main()
