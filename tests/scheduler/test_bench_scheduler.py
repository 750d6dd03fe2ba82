from __future__ import annotations

from loadtests.bench_scheduler import markdown, optimality_gap


def test_optimality_gap_reports_zero_when_heuristic_matches_optimum_on_tiny_instances() -> None:
    (row,) = optimality_gap(instances=2, seed=0, time_limit_s=5.0)
    assert row["goal"] == "0" and row["value"].startswith("median")
    assert "2 instances" in row["detail"]


def test_markdown_renders_met_column_when_rows_given() -> None:
    rows = [
        {"metric": "m", "value": "1", "goal": "<= 2", "met": True, "detail": "d"},
        {"metric": "n", "value": "3", "goal": "low", "met": None, "detail": ""},
    ]
    lines = markdown(rows).splitlines()
    assert lines[2] == "| m | 1 | <= 2 | yes | d |" and lines[3].endswith("| - |  |")
