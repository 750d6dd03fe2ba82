"""Run headless locust load tests against a running gateway and judge them against an SLO.

    python -m loadtests.run                      # what `make loadtest` runs
    python -m loadtests.run --protocol grpc --scenario spike --users 32 --duration 120 \
        --slo-p99-ms 250 --slo-max-error-rate 0.001 --out results/loadtest

Defaults target the `make run` stack (HTTP 127.0.0.1:8000, gRPC 127.0.0.1:8001). Each
(protocol, scenario) run writes, under ``--out/<protocol>-<scenario>/``: locust's CSV
files (``locust_stats.csv``, ``locust_stats_history.csv``, ``locust_failures.csv``,
``locust_exceptions.csv``), ``report.html``, and ``locust_verdict.json`` /
``locust_verdict.md``. The exit status is non-zero when any run violates the SLO.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
LOCUSTFILES = {
    "http-json": HERE / "locustfile_http_json.py",
    "http-binary": HERE / "locustfile_http_binary.py",
    "grpc": HERE / "locustfile_grpc.py",
}
SCENARIOS = ("steady", "ramp", "spike", "mixed")


@dataclass(frozen=True)
class LoadTestSettings:
    protocols: tuple[str, ...]
    scenario: str
    http: str
    grpc: str
    users: int
    duration_s: float
    spawn_rate: float
    models: str
    batch_size: int
    slo_p99_ms: float
    slo_max_error_rate: float
    out: Path


@dataclass(frozen=True)
class RunResult:
    protocol: str
    exit_code: int
    directory: Path

    def verdict(self) -> dict[str, object] | None:
        path = self.directory / "locust_verdict.json"
        return json.loads(path.read_text()) if path.is_file() else None


def locust_command(settings: LoadTestSettings, protocol: str, directory: Path) -> list[str]:
    return [
        sys.executable, "-m", "locust",
        "-f", f"{LOCUSTFILES[protocol]},{HERE / 'scenarios' / f'{settings.scenario}.py'}",
        "--headless", "--only-summary", "--loglevel", "WARNING",
        "--host", f"http://{settings.http}",
        "--grpc-host", settings.grpc,
        "--csv", str(directory / "locust"),
        "--html", str(directory / "report.html"),
        "--models", settings.models,
        "--batch-size", str(settings.batch_size),
        "--scenario-users", str(settings.users),
        "--scenario-duration", str(settings.duration_s),
        "--scenario-spawn-rate", str(settings.spawn_rate),
        "--slo-p99-ms", str(settings.slo_p99_ms),
        "--slo-max-error-rate", str(settings.slo_max_error_rate),
        "--stop-timeout", "10",
    ]


def run_one(settings: LoadTestSettings, protocol: str) -> RunResult:
    directory = settings.out / f"{protocol}-{settings.scenario}"
    directory.mkdir(parents=True, exist_ok=True)
    cmd = locust_command(settings, protocol, directory)
    print(f"[loadtest] {protocol} / {settings.scenario}: {settings.users} users, "
          f"{settings.duration_s:g} s -> {directory}", flush=True)
    try:
        code = subprocess.run(cmd, cwd=ROOT, timeout=settings.duration_s + 90).returncode
    except subprocess.TimeoutExpired:
        print(f"[loadtest] {protocol}: locust did not finish in time", flush=True)
        code = 124
    return RunResult(protocol, code, directory)


def parse_args(argv: list[str] | None = None) -> LoadTestSettings:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--protocol", default="all", choices=[*LOCUSTFILES, "all"])
    parser.add_argument("--scenario", default="steady", choices=SCENARIOS)
    parser.add_argument("--http", default="127.0.0.1:8000", help="gateway HTTP host:port")
    parser.add_argument("--grpc", default="127.0.0.1:8001", help="gateway gRPC host:port")
    parser.add_argument("--users", type=int, default=8, help="peak concurrent users")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds per run")
    parser.add_argument("--spawn-rate", type=float, default=4.0)
    parser.add_argument("--models", default="efficientnet_lite0", help="name[:weight],...")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--slo-p99-ms", type=float, default=1000.0)
    parser.add_argument("--slo-max-error-rate", type=float, default=0.01)
    parser.add_argument("--out", type=Path, default=Path("results/loadtest"))
    args = parser.parse_args(argv)
    protocols = tuple(LOCUSTFILES) if args.protocol == "all" else (args.protocol,)
    return LoadTestSettings(
        protocols=protocols, scenario=args.scenario, http=args.http, grpc=args.grpc,
        users=args.users, duration_s=args.duration, spawn_rate=args.spawn_rate,
        models=args.models, batch_size=args.batch_size, slo_p99_ms=args.slo_p99_ms,
        slo_max_error_rate=args.slo_max_error_rate, out=args.out,
    )


def main(argv: list[str] | None = None) -> int:
    settings = parse_args(argv)
    results = [run_one(settings, protocol) for protocol in settings.protocols]
    print("\n| protocol | scenario | verdict | p99 ms | error rate | req/s | report |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        v = r.verdict()
        if v is None:
            print(f"| {r.protocol} | {settings.scenario} | no verdict (exit {r.exit_code}) "
                  "| | | | |")
            continue
        s = v["summary"]
        assert isinstance(s, dict)
        print(f"| {r.protocol} | {settings.scenario} | {'PASS' if v['passed'] else 'FAIL'} "
              f"| {s['p99_ms']:.0f} | {s['error_rate']:.2%} | {s['rps']:.1f} "
              f"| {r.directory / 'report.html'} |")
    return 0 if all(r.exit_code == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
