"""What ONNX Runtime's spinning threads cost a CPU member: the same model served with its
intra-op threads spinning on between runs (ONNX Runtime's default) and stopping once a
run ends (``spin_between_runs`` 0, the Python-backend model's default), side by side in
one Triton.

One Triton serves two copies of EfficientNet-Lite0 from ``./model_repo`` (``make run``'s
sample, exported there once), each with today's ``model.py`` and the sample's own
``intra_op_threads`` (0: every core), differing only in ``spin_between_runs``. For each
arm, interleaved over ``--rounds``, over HTTP and gRPC:

- **paced**: one request in flight, ``--rate`` a second (an app's trickle: the threads
  are idle between requests): p50 and p99 of the answers (h2load's log), and the
  member's CPU per request (tritonserver and its stubs, from ``/proc``);
- **closed loop**: ``--in-flight`` requests at once for the same time: requests a second
  (the threads are busy back to back).

Medians over rounds; ratios stopped / spinning. Loopback only; every process started is
stopped on the way out.

    python -m loadtests.bench_spinning [--quick] [--rounds 3] [--seconds 6]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tritonclient.grpc.model_config_pb2 import ModelConfig

from converters.samples import SAMPLE_MODEL_NAME, cat_input
from infergate.triton.local import LocalTriton, TritonSettings
from loadtests.benchkit import ConfigEdit, write_variant
from loadtests.h2load import Workload, h2load_command, run_h2load, write_workload
from loadtests.harness import (
    RUNTIME_ENV,
    figure,
    median,
    num,
    percentile,
    publish,
    reporter,
    table,
)
from loadtests.proc_cpu import read_proc_stats, tree_ticks

# the two copies: ONNX Runtime's threads stop spinning once a run ends / spin on
ARMS = {"stopped": "0", "spinning": "1"}
PROTOCOLS = ("http", "grpc")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")  # the unit of /proc/<pid>/stat

say = reporter("bench_spinning")


@dataclass(frozen=True)
class Setup:
    rate: float = 13.0  # paced requests a second (bench_tenants' light tenant on this model)
    in_flight: int = 4  # the closed loop's requests at once
    seconds: float = 6.0  # each h2load run
    rounds: int = 3


def arm_model(arm: str) -> str:
    return f"{SAMPLE_MODEL_NAME}_{arm}"


def prepare(repo: Path) -> list[str]:
    """The sample model copied once per arm (:func:`loadtests.benchkit.write_variant`:
    today's ``model.py``), ``spin_between_runs`` set in its config: the arms differ in
    nothing else."""
    for arm, spin in ARMS.items():
        write_variant(repo, arm_model(arm), spinning(spin))
    return [arm_model(arm) for arm in ARMS]


def spinning(value: str) -> ConfigEdit:
    """The config edit that sets ``spin_between_runs``."""
    def edit(config: ModelConfig) -> None:
        config.parameters["spin_between_runs"].string_value = value

    return edit


def measure(work: Workload, protocol: str, target: Any, setup: Setup, ticks: Callable[[], int],
            scratch: Path) -> dict[str, float]:
    """One arm's paced run (latency, CPU per request) and closed-loop run (throughput)."""
    duration = f"{round(setup.seconds * 1000)}ms"
    before = ticks()
    paced = run_h2load(h2load_command(work, protocol, target, 1, duration,
                                      scratch / "paced.tsv", (), setup.rate),
                       setup.seconds + 60)
    cpu_s = (ticks() - before) / CLOCK_TICKS
    answered = [us / 1000 for status, us in paced.log if status == 200]
    if not answered or paced.returncode != 0:
        raise RuntimeError(f"h2load at {work.model} ({protocol}) answered nothing: {paced.gist()}")
    loop = run_h2load(h2load_command(work, protocol, target, setup.in_flight, duration, None),
                      setup.seconds + 60)
    if loop.returncode != 0:
        raise RuntimeError(f"h2load at {work.model} ({protocol}) failed: {loop.gist()}")
    return {"p50_ms": percentile(answered, 50), "p99_ms": percentile(answered, 99),
            "cpu_ms_per_request": 1000 * cpu_s / len(answered),
            "closed_loop_per_s": loop.summary().req_per_s}


FIGURES = ("p50_ms", "p99_ms", "cpu_ms_per_request", "closed_loop_per_s")


def rows_of(rounds: Sequence[Mapping[tuple[str, str], Mapping[str, float]]],
            setup: Setup) -> list[dict[str, Any]]:
    """Per protocol, each arm's medians over rounds and the ratios stopped / spinning."""
    rows = []
    for protocol in PROTOCOLS:
        arms = {arm: {f: median(r[(arm, protocol)][f] for r in rounds) for f in FIGURES}
                for arm in ARMS}
        row: dict[str, Any] = {"protocol": protocol, "rounds": len(rounds),
                               "rate_per_s": setup.rate, "in_flight": setup.in_flight}
        for arm, figures in arms.items():
            row.update({f"{arm}_{f}": v for f, v in figures.items()})
        for f in FIGURES:
            row[f"{f}_ratio"] = arms["stopped"][f] / max(arms["spinning"][f], 1e-9)
        rows.append(row)
    return rows


def markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    header = ["protocol", "threads between runs", "paced p50 ms", "paced p99 ms",
              "member CPU ms / request (paced)", "closed loop req/s"]
    lines = []
    for row in rows:
        for arm in ARMS:
            lines.append([row["protocol"], arm, num(row[f"{arm}_p50_ms"], ".1f"),
                          num(row[f"{arm}_p99_ms"], ".1f"),
                          num(row[f"{arm}_cpu_ms_per_request"], ".1f"),
                          num(row[f"{arm}_closed_loop_per_s"], ".0f")])
        lines.append([row["protocol"], "**stopped / spinning**",
                      *(f"{row[f'{f}_ratio']:.2f}x" for f in FIGURES)])
    first = rows[0] if rows else {}
    return (f"EfficientNet-Lite0 in one Triton, paced at {first.get('rate_per_s', 0):g}/s "
            f"with one request in flight, closed loop at {first.get('in_flight', 0)}; "
            f"medians of {first.get('rounds', 0)} rounds.\n\n" + table(header, lines))


def plot(rows: Sequence[Mapping[str, Any]], out: Path) -> list[Path]:
    """Member CPU per request and paced p50, per protocol and arm."""
    path = out / "bench_spinning.png"
    with figure(path, 1, 2, figsize=(9, 3.5)) as (_, (cpu, p50)):
        for axes, key, title in ((cpu, "cpu_ms_per_request", "member CPU ms per request"),
                                 (p50, "p50_ms", "paced p50, ms")):
            for i, arm in enumerate(ARMS):
                axes.bar([j + 0.4 * i for j in range(len(rows))],
                         [row[f"{arm}_{key}"] for row in rows], width=0.4, label=arm)
            axes.set_xticks([j + 0.2 for j in range(len(rows))], [r["protocol"] for r in rows])
            axes.set_title(title)
        cpu.legend()
    return [path]


def run(setup: Setup | None = None) -> list[dict[str, Any]]:
    setup = setup or Setup()
    with tempfile.TemporaryDirectory(prefix="bench_spinning-") as tmp:
        scratch = Path(tmp)
        repo = scratch / "repo"
        repo.mkdir()
        names = prepare(repo)
        works = {arm: write_workload(scratch, arm_model(arm), cat_input(), "input", "logits")
                 for arm in ARMS}
        rounds = []
        with LocalTriton(TritonSettings(model_repository=repo, runtime_env=RUNTIME_ENV,
                                        log_file=scratch / "triton.log",
                                        models=tuple(names))) as server:
            assert server.endpoints is not None and server.pid is not None
            pid = server.pid

            def ticks() -> int:
                return tree_ticks(pid, read_proc_stats())

            for r in range(setup.rounds):
                order = list(ARMS) if r % 2 == 0 else list(reversed(ARMS))
                measured = {}
                for protocol in PROTOCOLS:
                    for arm in order:
                        measured[(arm, protocol)] = m = measure(
                            works[arm], protocol, server.endpoints, setup, ticks, scratch)
                        say(f"round {r + 1}/{setup.rounds} {protocol} {arm}: p50 "
                            f"{m['p50_ms']:.1f} ms, p99 {m['p99_ms']:.1f} ms, "
                            f"{m['cpu_ms_per_request']:.1f} CPU-ms a request, closed loop "
                            f"{m['closed_loop_per_s']:.0f}/s")
                rounds.append(measured)
    return rows_of(rounds, setup)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one round of 3 s runs")
    parser.add_argument("--rounds", type=int, default=None, help="default 3 (--quick: 1)")
    parser.add_argument("--seconds", type=float, default=None,
                        help="each h2load run (default 6; --quick: 3)")
    parser.add_argument("--rate", type=float, default=13.0,
                        help="paced requests a second, one in flight")
    parser.add_argument("--in-flight", type=int, default=4,
                        help="the closed loop's requests at once")
    parser.add_argument("--out", type=Path, default=None,
                        help="also write bench_spinning.json/.md/.png into this folder")
    args = parser.parse_args(argv)
    setup = Setup(rate=args.rate, in_flight=args.in_flight,
                  seconds=args.seconds or (3.0 if args.quick else 6.0),
                  rounds=args.rounds or (1 if args.quick else 3))
    publish(run(setup), markdown, plot, args.out, "bench_spinning", say)


if __name__ == "__main__":
    main()
