from __future__ import annotations

from loadtests.bench_scheduler import disruption, markdown, optimality_gap


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


def test_replan_rows_report_disruption_under_the_rebuild_model_when_run_small() -> None:
    rows = {r["metric"]: r for r in disruption(gpus=8, pools=10, time_limit_s=2.0)}
    stable = rows["re-plan after a 10% demand change (stability)"]
    auto = rows["re-plan after a 10% demand change (auto)"]
    assert "instances disrupted" in stable["value"] and "GPU rebuilds" in stable["value"]
    assert stable["instances_destroyed"] <= stable["instances_disrupted"]
    assert "objective stability" in auto["detail"]
