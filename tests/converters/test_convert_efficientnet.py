"""EfficientNet-Lite0 (real ImageNet weights) end to end: FP32, FP16 and INT8 verified on
real photos (crops/flips of the bundled photographs), INT8 repaired to the budget or
rejected with its reason, the fastest variant within budget published with its report."""

from __future__ import annotations

import json

import pytest

from converters.model_dir import sha256_file
from converters.triton_config import parse_model_config
from tests.converters.conftest import Conversion

pytestmark = pytest.mark.slow


def test_effnet_verifies_all_three_precisions_on_photos_when_converted(
        effnet_conversion: Conversion) -> None:
    report = effnet_conversion.result.report
    variants = {v["name"]: v for v in report["variants"]}
    assert set(variants) == {"fp32", "fp16", "int8"}
    assert report["task"] == "classification"
    assert report["evaluation"]["samples"] == 24 and report["calibration"]["samples"] == 18
    assert report["evaluation"]["source"] != report["calibration"]["source"]
    for name in ("fp16", "int8"):
        accuracy = variants[name]["accuracy"]
        assert accuracy["samples"] == 24
        assert 0.0 <= accuracy["top1"] <= 1.0 and accuracy["top5"] >= accuracy["top1"]
        low, high = accuracy["top1_ci95"]  # Wilson interval around the measured agreement
        assert low <= accuracy["top1"] <= high and high - low > 0.01
    assert variants["fp16"]["accuracy"]["cosine"] > 0.9999
    assert variants["fp16"]["accuracy"]["max_abs_err"] > 0  # really ran in half precision
    assert variants["fp32"]["accuracy"]["max_abs_err"] == 0


def test_effnet_int8_is_repaired_or_rejected_with_reason_when_plain_int8_misses(
        effnet_conversion: Conversion) -> None:
    report = effnet_conversion.result.report
    int8 = next(v for v in report["variants"] if v["name"] == "int8")
    budget = effnet_conversion.request.budget
    repair = report["repairs"].get("int8")
    if repair is None:  # plain INT8 met the budget: nothing to repair
        assert int8["accuracy"]["top1_drop"] <= budget.max_top1_drop
        return
    assert repair["ranking"] and repair["iterations"]
    if repair["accepted"]:
        assert int8["float_nodes"] == repair["float_nodes"] != []
        assert int8["disabled_optimizers"] == ["WeightBiasQuantization"]
        assert int8["accuracy"]["top1_drop"] <= budget.max_top1_drop
        assert int8["accuracy"]["cosine"] >= budget.min_cosine
    else:
        assert repair["reason"].startswith("INT8 rejected:")
        assert int8["verdict"]["reason"] == repair["reason"]


def test_effnet_publishes_fastest_variant_within_budget_with_reasons_for_the_others(
        effnet_conversion: Conversion) -> None:
    result = effnet_conversion.result
    report = result.report
    chosen = next(v for v in report["variants"] if v["verdict"]["chosen"])
    assert chosen["name"] == result.chosen and chosen["verdict"]["within_budget"]
    assert all(v["verdict"]["reason"] for v in report["variants"])
    within = [v for v in report["variants"] if v["verdict"]["within_budget"]]
    assert chosen["profile"]["speed"] == max(v["profile"]["speed"] for v in within)
    for variant in report["variants"]:
        batches = [t["batch"] for t in variant["profile"]["timings"]]
        assert batches == [1, 2]
        assert all(t["p99_ms"] >= t["p50_ms"] > 0 for t in variant["profile"]["timings"])


def test_effnet_writes_model_directory_with_report_and_warmup_when_published(
        effnet_conversion: Conversion, effnet_onnx: object) -> None:
    result = effnet_conversion.result
    version = result.path / str(result.version)
    assert result.version == 1
    # its weights (5-18 MB, whichever variant) beside the graph: model_dir.write_onnx
    assert {p.name for p in version.iterdir()} == {"model.onnx", "model.onnx.data", "model.py",
                                                   "metadata.json", "report"}
    for name in ("latency.png", "tradeoff.png"):
        assert (version / "report" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    stored = json.loads((version / "report" / "report.json").read_text())
    assert stored["chosen"] == result.chosen
    assert "| int8 |" in (version / "report" / "report.md").read_text()
    metadata = json.loads((version / "metadata.json").read_text())
    assert metadata["source_sha256"] == sha256_file(effnet_onnx)  # type: ignore[arg-type]
    assert metadata["precision"] == result.precision
    assert metadata["accuracy"]["samples"] == 24
    assert {"onnxruntime", "onnx", "python"} <= set(metadata["runtime_versions"])
    assert {v["variant"] for v in metadata["selection"]} == {"fp32", "fp16", "int8"}
    config = parse_model_config((result.path / "config.pbtxt").read_text())
    assert config.max_batch_size == 2
    assert [w.batch_size for w in config.model_warmup] == [1, 2]
    for warmup in config.model_warmup:
        data = result.path / "warmup" / warmup.inputs["input"].input_data_file
        assert data.stat().st_size == 3 * 224 * 224 * 4  # one real preprocessed photo


def test_effnet_reports_progress_per_step_when_running(effnet_conversion: Conversion) -> None:
    events = effnet_conversion.events
    finished = [e.step for e in events if e.state in ("done", "skipped", "failed")]
    started = [e.step for e in events if e.state == "started"]
    assert finished == started and finished[-1] == "publish"
    assert any(e.state == "running" and e.step == "build-int8" for e in events)
    tensorrt = next(s for s in effnet_conversion.result.steps if s.label == "tensorrt")
    assert tensorrt.state == "skipped" and tensorrt.detail == "skipped: TensorRT not installed"
