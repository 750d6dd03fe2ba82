"""``make bench``: run every benchmark once and write one report.

    python -m loadtests.bench --out results [--only bench_batching,bench_coldstart]

Writes ``<out>/BENCHMARKS.md`` (one summary table of every ratio measured, then each
benchmark's own table and plots), ``<out>/<benchmark>.json`` (its raw rows) and the
PNG plots. The benchmarks listed in :data:`BENCHMARKS` run in that order (one not written
yet is skipped with a note), then any other ``loadtests/bench_*.py``.

The contract a benchmark module follows (``loadtests/bench_*.py``):
- ``run() -> list[dict]``: runs with its defaults, measuring side by side in one run,
  and returns rows; keys ending in ``ratio`` are the headline figures;
- optional ``markdown(rows) -> str``: its own table (a generic one otherwise);
- optional ``plot(rows, out_dir) -> list[Path]``: PNG files it wrote into ``out_dir``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import platform
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from loadtests.harness import table

BENCHMARKS = (
    ("bench_gateway", "gateway overhead vs direct Triton"),
    ("bench_dataplane", "data planes (HAProxy in both gRPC connection modes, Python) vs "
                        "direct Triton, h2load as client"),
    ("bench_batching", "dynamic batching on vs off (batch size impact)"),
    ("bench_converter", "converter: INT8 vs FP32"),
    ("bench_coldstart", "cold start: first request with vs without model_warmup"),
    ("bench_streams", "streams: time to first response and inter-response gap, gateway vs direct"),
    ("bench_tenants", "tenants and priorities at ~2x a pool's capacity: noisy neighbour, "
                      "priority classes, fairness, cost; h2load per tenant"),
    ("bench_overload", "goodput under open-loop overload (1x, 2x, 4x capacity): answers "
                       "within their deadline per second, deadline shedding on vs off"),
    ("bench_rollout", "progressive delivery: good, erroring, slow and differing candidates "
                      "rolled out under load; the gRPC detour's cost on HAProxy"),
    ("bench_scheduler", "scheduler: optimality and plan time"),
)


@dataclass
class Outcome:
    name: str
    title: str
    status: str  # "ok", "skipped", "failed"
    seconds: float = 0.0
    rows: list[dict[str, Any]] = field(default_factory=list)
    table: str = ""
    plots: list[Path] = field(default_factory=list)
    note: str = ""


def discovered(known: tuple[tuple[str, str], ...]) -> list[tuple[str, str]]:
    """The known benchmarks in order, then any other ``loadtests/bench_*.py``."""
    names = {n for n, _ in known}
    extra = sorted(p.stem for p in Path(__file__).parent.glob("bench_*.py")
                   if p.stem not in names)
    return [*known, *((name, name.removeprefix("bench_")) for name in extra)]


def load(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(f"loadtests.{name}")
    except ModuleNotFoundError as err:
        if err.name == f"loadtests.{name}":
            return None
        raise


def run_benchmark(name: str, title: str, out: Path) -> Outcome:
    module = load(name)
    if module is None:
        note = f"loadtests/{name}.py does not exist yet"
        print(f"[bench] skipped {name}: {note}", flush=True)
        return Outcome(name, title, "skipped", note=note)
    print(f"[bench] {name}: {title}", flush=True)
    started = time.monotonic()
    try:
        raw = list(module.run())
    except Exception:  # noqa: BLE001 - one broken benchmark must not hide the others
        note = traceback.format_exc(limit=3)
        print(f"[bench] {name} failed:\n{note}", flush=True)
        return Outcome(name, title, "failed", time.monotonic() - started, note=note)
    rows = [as_row(r) for r in raw]
    outcome = Outcome(name, title, "ok", time.monotonic() - started, rows)
    markdown = getattr(module, "markdown", None)
    outcome.table = markdown(raw) if markdown else generic_table(rows)
    plot = getattr(module, "plot", None)
    if plot is not None:
        try:
            outcome.plots = [Path(p) for p in plot(raw, out)]
        except Exception:  # noqa: BLE001 - a plot failure keeps the numbers
            outcome.note = "plot failed: " + traceback.format_exc(limit=2)
    (out / f"{name}.json").write_text(json.dumps(rows, indent=2, default=str) + "\n")
    return outcome


def as_row(row: Any) -> dict[str, Any]:
    """Rows may be dicts, dataclasses or named tuples."""
    if dataclasses.is_dataclass(row) and not isinstance(row, type):
        return dataclasses.asdict(row)
    if hasattr(row, "_asdict"):
        return dict(row._asdict())
    return dict(row)


def generic_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(no rows)"
    keys = list(dict.fromkeys(k for r in rows for k in r))
    return table(keys, ([fmt(r.get(k, "")) for k in keys] for r in rows))


def fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def context(row: dict[str, Any]) -> str:
    """What a row is about: its non-numeric fields and small integer settings."""
    parts = [f"{k}={v}" for k, v in row.items()
             if not k.endswith("ratio") and (isinstance(v, str | bool)
                                             or (isinstance(v, int) and v < 1000))]
    return ", ".join(parts)


def summary_table(outcomes: list[Outcome]) -> str:
    cells: list[tuple[str, ...]] = []
    for o in outcomes:
        if o.status != "ok":
            why = o.note.strip().splitlines()[-1] if o.note.strip() else ""
            cells.append((o.name, o.status, "", why))
            continue
        cells += [(o.name, key, f"{value:.2f}x", context(row)) for row in o.rows
                  for key, value in row.items()
                  if key.endswith("ratio") and isinstance(value, int | float)]
    return table(("benchmark", "figure", "ratio", "measured for"), cells)


def report(outcomes: list[Outcome]) -> str:
    parts = [
        "# infergate benchmarks",
        "",
        f"Run {time.strftime('%Y-%m-%d %H:%M:%S %Z')} on {platform.node() or 'this host'}: "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, {platform.machine()}. "
        "Every figure is a ratio of two things measured side by side in the same run "
        "(medians over rounds); absolute numbers depend on the machine and its other load.",
        "",
        "## Summary: every ratio",
        "",
        summary_table(outcomes),
    ]
    for o in outcomes:
        parts += ["", f"## {o.name}: {o.title}", ""]
        if o.status != "ok":
            parts.append(f"{o.status.upper()}: {o.note.strip()}")
            continue
        parts += [f"Took {o.seconds:.0f} s.", "", o.table]
        parts += [f"\n![{p.stem}]({p.name})" for p in o.plots]
        if o.note:
            parts.append(f"\n{o.note}")
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument("--only", default="", help="comma-separated benchmark names")
    args = parser.parse_args(argv)
    benchmarks = discovered(BENCHMARKS)
    only = {n.strip() for n in args.only.split(",") if n.strip()}
    unknown = only - {n for n, _ in benchmarks}
    if unknown:
        parser.error(f"unknown benchmarks: {sorted(unknown)}")
    args.out.mkdir(parents=True, exist_ok=True)
    outcomes = [run_benchmark(name, title, args.out) for name, title in benchmarks
                if not only or name in only]
    path = args.out / "BENCHMARKS.md"
    path.write_text(report(outcomes))
    print(f"[bench] wrote {path}", flush=True)
    return 1 if any(o.status == "failed" for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
