"""The memory footprint the converter measures (a fresh process running the chosen
variant once at its largest batch), what the report says of it, and how the gateway reads
it back from a published model directory."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from converters.footprint import measure_footprint
from converters.model_dir import read_footprint
from converters.pipeline import ConversionRequest, convert
from converters.runtime import RuntimeSettings
from tests.converters.conftest import save_graph

GIB = 2**30


def matmul_model(path: Path, width: int) -> Path:
    """``y = x @ w`` with ``w`` FP32 [width, width] of random weights."""
    weights = np.random.default_rng(0).standard_normal((width, width)).astype(np.float32)
    return save_graph(
        path, [helper.make_node("MatMul", ["x", "w"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])],
        [onnx.numpy_helper.from_array(weights, "w")])


def test_conversion_publishes_a_measured_footprint_when_a_small_model_converts(
        tmp_path: Path, cnn_files: Callable[[], tuple[Path, Path, Path]]) -> None:
    model, _, evaluation = cnn_files()
    result = convert(ConversionRequest(
        source=str(model), name="cnn", repo=tmp_path / "repo", precisions=("fp32",),
        evaluation=evaluation, max_batch_size=8, profile_iterations=2, profile_warmup=1))

    footprint = result.report["footprint"]
    assert 0 < footprint["bytes"] < 2 * GIB
    assert footprint["batch"] == 8 == result.report["serving"]["max_batch_size"]
    assert "RSS" in footprint["method"] and "fresh process" in footprint["method"]
    published = json.loads(result.report_files["report.json"].read_text())
    assert published["footprint"] == footprint
    assert f"({footprint['bytes']} bytes;" in result.report_files["report.md"].read_text()
    assert read_footprint(result.path) == footprint["bytes"]
    step = next(s for s in result.steps if s.label == "footprint")
    assert step.state == "done", step.detail


def test_footprint_counts_the_weights_when_the_model_is_large(tmp_path: Path) -> None:
    """64 MiB of weights more: at least that much more memory, measured."""
    width = 4096
    small = matmul_model(tmp_path / "small.onnx", 16)
    large = matmul_model(tmp_path / "large.onnx", width)
    settings = RuntimeSettings(intra_op_threads=1)
    small_bytes = measure_footprint(small, settings, {"x": np.ones((4, 16), np.float32)}).bytes
    large_bytes = measure_footprint(large, settings,
                                    {"x": np.ones((4, width), np.float32)}).bytes
    weights = width * width * 4
    assert large_bytes - small_bytes >= 0.95 * weights
    assert large_bytes < 3 * weights  # the session, not the interpreter or the inputs


def test_read_footprint_reads_the_newest_version_when_several_are_published(
        tmp_path: Path) -> None:
    for version, footprint in ((1, {"bytes": 111, "method": "m"}),
                               (10, {"bytes": 999, "method": "m"}),
                               (2, {"bytes": 222, "method": "m"})):
        folder = tmp_path / "m" / str(version) / "report"
        folder.mkdir(parents=True)
        (folder / "report.json").write_text(json.dumps({"footprint": footprint}))
    assert read_footprint(tmp_path / "m") == 999


def test_read_footprint_is_none_when_the_newest_version_has_no_measurement(
        tmp_path: Path) -> None:
    model = tmp_path / "m"
    assert read_footprint(model) is None  # no directory at all
    older = model / "1" / "report"
    older.mkdir(parents=True)
    (older / "report.json").write_text(json.dumps({"footprint": {"bytes": 5, "method": "m"}}))
    (model / "2").mkdir()  # published without the converter: no report
    assert read_footprint(model) is None
    (model / "2" / "report").mkdir()
    (model / "2" / "report" / "report.json").write_text(json.dumps({"footprint": None}))
    assert read_footprint(model) is None
    (model / "2" / "report" / "report.json").write_text("{not json")
    assert read_footprint(model) is None
