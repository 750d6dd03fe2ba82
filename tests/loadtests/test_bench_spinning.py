"""bench_spinning's pure parts: the two copies it serves and its figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from converters.model_dir import PYTHON_BACKEND_MODEL
from converters.triton_config import parse_model_config
from loadtests import bench_spinning as bs
from loadtests import benchkit


def test_the_arms_differ_only_in_spin_between_runs(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "efficientnet_lite0"
    (source / "1").mkdir(parents=True)
    (source / "1" / "model.py").write_text("# converted before\n")
    (source / "1" / "model.onnx").write_bytes(b"graph")
    (source / "config.pbtxt").write_text(
        'name: "efficientnet_lite0"\nmax_batch_size: 32\n'
        'parameters { key: "intra_op_threads" value { string_value: "0" } }\n')
    monkeypatch.setattr(benchkit, "sample_model_dir", lambda: source)
    repo = tmp_path / "repo"
    repo.mkdir()
    names = bs.prepare(repo)
    assert names == ["efficientnet_lite0_stopped", "efficientnet_lite0_spinning"]
    configs = {n: parse_model_config((repo / n / "config.pbtxt").read_text()) for n in names}
    assert {n: c.name for n, c in configs.items()} == {n: n for n in names}
    assert [configs[n].parameters["spin_between_runs"].string_value for n in names] == ["0", "1"]
    for name, config in configs.items():
        assert config.parameters["intra_op_threads"].string_value == "0"
        assert config.max_batch_size == 32
        assert (repo / name / "1" / "model.py").read_bytes() == PYTHON_BACKEND_MODEL.read_bytes()
        assert (repo / name / "1" / "model.onnx").read_bytes() == b"graph"


def test_medians_over_rounds_and_ratios_stopped_over_spinning() -> None:
    def figures(p50: float, cpu: float) -> dict[str, float]:
        return {"p50_ms": p50, "p99_ms": 2 * p50, "cpu_ms_per_request": cpu,
                "closed_loop_per_s": 100.0}

    rounds = [{(arm, protocol): figures(*values[arm]) for arm in bs.ARMS
               for protocol in bs.PROTOCOLS}
              for values in ({"stopped": (10, 20), "spinning": (10, 60)},
                             {"stopped": (12, 21), "spinning": (9, 58)},
                             {"stopped": (11, 19), "spinning": (11, 59)})]
    rows = bs.rows_of(rounds, bs.Setup())
    assert [r["protocol"] for r in rows] == list(bs.PROTOCOLS)
    row = rows[0]
    assert row["stopped_cpu_ms_per_request"] == 20 and row["spinning_cpu_ms_per_request"] == 59
    assert row["cpu_ms_per_request_ratio"] == 20 / 59
    assert row["p50_ms_ratio"] == 11 / 10 and row["closed_loop_per_s_ratio"] == 1.0
    text = bs.markdown(rows)
    assert "| http | **stopped / spinning** | 1.10x | 1.10x | 0.34x | 1.00x |" in text
    assert "medians of 3 rounds" in text
