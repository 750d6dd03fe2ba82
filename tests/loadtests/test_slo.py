"""The SLO verdict: a pure judgement over a run summary, and locust's own statistics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from locust.stats import RequestStats

from loadtests.slo import RunSummary, Slo, judge, summary_from_stats, write_verdict

GENEROUS = Slo(p99_ms=1000.0, max_error_rate=0.05)


def summary(requests: int = 100, failures: int = 0, p99_ms: float = 50.0) -> RunSummary:
    return RunSummary(requests=requests, failures=failures, p50_ms=10.0, p99_ms=p99_ms, rps=20.0)


def test_judge_passes_when_within_every_limit() -> None:
    verdict = judge(summary(failures=5, p99_ms=1000.0), GENEROUS)
    assert verdict.passed and verdict.violations == ()


@pytest.mark.parametrize(
    ("run", "fragment"),
    [
        (summary(p99_ms=1000.1), "p99"),
        (summary(failures=6), "error rate"),
        (summary(requests=0, failures=0), "only 0 requests"),
    ],
)
def test_judge_fails_when_a_limit_is_exceeded(run: RunSummary, fragment: str) -> None:
    verdict = judge(run, GENEROUS)
    assert not verdict.passed
    assert any(fragment in v for v in verdict.violations)


def test_judge_reports_every_violation_when_several_limits_are_exceeded() -> None:
    verdict = judge(summary(failures=50, p99_ms=5000), GENEROUS)
    assert len(verdict.violations) == 2


def test_summary_from_locust_stats_when_requests_were_logged() -> None:
    stats = RequestStats()
    for ms in range(1, 101):  # 1..100 ms
        stats.log_request("grpc", "m", ms, 10)
    for _ in range(5):
        stats.log_error("grpc", "m", RuntimeError("boom"))
    run = summary_from_stats(stats.total)
    assert run.requests == 100 and run.failures == 5
    assert run.p50_ms == pytest.approx(50, abs=1)
    assert run.p99_ms == pytest.approx(99, abs=1)
    assert run.error_rate == pytest.approx(0.05)


def test_write_verdict_writes_json_and_markdown(tmp_path: Path) -> None:
    verdict = judge(summary(p99_ms=2000), GENEROUS)
    write_verdict(verdict, tmp_path / "run_verdict.json")
    data = json.loads((tmp_path / "run_verdict.json").read_text())
    assert data["passed"] is False and data["summary"]["p99_ms"] == 2000
    assert "FAIL" in (tmp_path / "run_verdict.md").read_text()
