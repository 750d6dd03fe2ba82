from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from scheduler.cli import app
from scheduler.plan import PlanRecord

EXAMPLES = Path(__file__).resolve().parents[2] / "scheduler" / "examples"
FLEET = str(EXAMPLES / "fleet.yaml")
POOLS = str(EXAMPLES / "pools.yaml")
runner = CliRunner()


def test_plan_prints_json_plan_when_asked() -> None:
    result = runner.invoke(
        app, ["plan", "--fleet", FLEET, "--pools", POOLS, "--solver", "heuristic", "--json"]
    )
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    assert plan["solver"] == "heuristic" and len(plan["gpus"]) == 8


def test_plan_writes_record_picture_and_manifests_when_paths_given(tmp_path: Path) -> None:
    args = ["plan", "--fleet", FLEET, "--pools", POOLS, "--solver", "heuristic",
            "--out", str(tmp_path / "plan.json"), "--svg", str(tmp_path / "l.svg"),
            "--manifests", str(tmp_path / "m")]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "GPU memory slots" in result.output and "llama-7b" in result.output
    record = PlanRecord.model_validate_json((tmp_path / "plan.json").read_text())
    assert record.plan.metrics.pools_unplaced == 0
    assert (tmp_path / "l.svg").read_text().startswith("<svg")
    assert (tmp_path / "m" / "30-pools.yaml").exists()


def test_plan_exits_2_naming_field_when_fleet_is_invalid(tmp_path: Path) -> None:
    bad = tmp_path / "fleet.yaml"
    bad.write_text("nodes:\n  - name: n\n    gpus:\n      - {index: 0, type: A100-80GB,"
                   " mig: {instances: [{profile: 9, start: 1}]}}\n")  # fmt: skip
    result = runner.invoke(app, ["plan", "--fleet", str(bad), "--pools", POOLS])
    assert result.exit_code == 2
    assert "fleet.nodes[0].gpus[0].mig.instances[0].start" in result.output


def test_apply_writes_directory_when_given_a_saved_plan(tmp_path: Path) -> None:
    runner.invoke(app, ["plan", "--fleet", FLEET, "--pools", POOLS, "--solver", "heuristic",
                        "--out", str(tmp_path / "plan.json")])  # fmt: skip
    result = runner.invoke(
        app, ["apply", "--plan", str(tmp_path / "plan.json"), "--out-dir", str(tmp_path / "o")]
    )
    assert result.exit_code == 0, result.output
    (folder,) = (tmp_path / "o").iterdir()
    assert folder.name.startswith("plan-") and (folder / "20-node-labels.yaml").exists()


def test_apply_refuses_when_neither_plan_nor_inputs_given() -> None:
    result = runner.invoke(app, ["apply"])
    assert result.exit_code != 0 and "--plan" in result.output


def test_simulate_prints_rows_for_every_strategy_when_json() -> None:
    result = runner.invoke(app, ["simulate", "--gpus", "6", "--pools", "6", "--hours", "2",
                                 "--replan-min", "30", "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [r["strategy"] for r in rows][0] == "MIG planner (this)"
    assert any(r["strategy"].startswith("whole GPU") for r in rows)


def test_profiles_lists_names_of_the_type_when_asked() -> None:
    result = runner.invoke(app, ["profiles", "A100-40GB"])
    assert result.exit_code == 0 and "1g.5gb" in result.output and "0,4" in result.output
    assert "whole device" in runner.invoke(app, ["profiles", "T4"]).output
