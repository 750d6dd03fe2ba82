"""SLO verdicts for load-test runs: p99 latency and error rate against stated limits.

The judgement is a pure function over a :class:`RunSummary`, so it is tested without
sockets; :mod:`loadtests.locust_common` builds the summary from locust's statistics at
the end of a headless run, writes the verdict next to the CSV/HTML reports, and sets
locust's exit code (non-zero on violation).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True)
class Slo:
    p99_ms: float
    max_error_rate: float
    # A run that sent (almost) nothing proves nothing: it fails.
    min_requests: int = 1


@dataclass(frozen=True)
class RunSummary:
    requests: int
    failures: int
    p50_ms: float
    p99_ms: float
    rps: float

    @property
    def error_rate(self) -> float:
        return self.failures / self.requests if self.requests else 1.0


@dataclass(frozen=True)
class Verdict:
    passed: bool
    violations: tuple[str, ...]
    slo: Slo
    summary: RunSummary

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "violations": list(self.violations),
            "slo": asdict(self.slo),
            "summary": {**asdict(self.summary), "error_rate": self.summary.error_rate},
        }

    def markdown(self) -> str:
        s, slo = self.summary, self.slo
        status = "PASS" if self.passed else "FAIL"
        lines = [
            f"**SLO verdict: {status}**",
            "",
            "| figure | measured | SLO |",
            "|---|---|---|",
            f"| p99 latency | {s.p99_ms:.1f} ms | <= {slo.p99_ms:g} ms |",
            f"| error rate | {s.error_rate:.2%} ({s.failures}/{s.requests}) "
            f"| <= {slo.max_error_rate:.2%} |",
            f"| requests | {s.requests} | >= {slo.min_requests} |",
            f"| p50 latency | {s.p50_ms:.1f} ms | |",
            f"| throughput | {s.rps:.1f} req/s | |",
        ]
        lines += [f"- violation: {v}" for v in self.violations]
        return "\n".join(lines) + "\n"


def judge(summary: RunSummary, slo: Slo) -> Verdict:
    violations = []
    if summary.requests < slo.min_requests:
        violations.append(f"only {summary.requests} requests (< {slo.min_requests})")
    if summary.p99_ms > slo.p99_ms:
        violations.append(f"p99 {summary.p99_ms:.1f} ms > {slo.p99_ms:g} ms")
    if summary.error_rate > slo.max_error_rate:
        violations.append(
            f"error rate {summary.error_rate:.2%} > {slo.max_error_rate:.2%}"
        )
    return Verdict(not violations, tuple(violations), slo, summary)


class StatsEntryLike(Protocol):
    """The part of ``locust.stats.StatsEntry`` a summary needs."""

    @property
    def num_requests(self) -> int: ...

    @property
    def num_failures(self) -> int: ...

    @property
    def total_rps(self) -> float: ...

    def get_response_time_percentile(self, percent: float) -> float: ...


def summary_from_stats(entry: StatsEntryLike) -> RunSummary:
    empty = entry.num_requests == 0
    return RunSummary(
        requests=entry.num_requests,
        failures=entry.num_failures,
        p50_ms=0.0 if empty else float(entry.get_response_time_percentile(0.5)),
        p99_ms=0.0 if empty else float(entry.get_response_time_percentile(0.99)),
        rps=float(entry.total_rps),
    )


def write_verdict(verdict: Verdict, json_path: Path) -> None:
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(verdict.to_json(), indent=2) + "\n")
    json_path.with_suffix(".md").write_text(verdict.markdown())
