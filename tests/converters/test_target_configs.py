"""The Triton config written for each target, parsed back with Triton's own protobuf."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from converters.errors import TargetUnavailable
from converters.graph import ModelFacts
from converters.metrics import AccuracyBudget
from converters.pipeline import ConversionFailed, convert
from converters.runtime import MIXED_PRECISION_DISABLED_OPTIMIZERS, RuntimeSettings
from converters.select import ServingPlan
from converters.spec import parse_input_spec
from converters.steps.base import ConversionRequest, EngineRecord
from converters.steps.publish import PublishInputs, model_config
from converters.tensorrt import tensorrt_available
from converters.triton_config import (
    Target,
    build_model_config,
    parse_model_config,
    render_model_config,
)
from converters.variants import Precision, Variant, plan_variants

SPEC = parse_input_spec("input_ids:int64[batch,sequence];attention_mask:int64[batch,sequence]")
FACTS = ModelFacts(8, {"ai.onnx": 17}, 1, 1, 1, {}, (("embedding", "float32", ("batch", 384)),))
SERVING = ServingPlan(16, 1500, (1, 2, 4, 8, 16), "test")


def _inputs(target: Target, precision: Precision, tmp_path: Path,
            trt_accelerator: bool = False, **request: object) -> PublishInputs:
    (plan,) = [p for p in plan_variants((precision,), target, encoder=False)
               if p.precision == precision]
    runtime = RuntimeSettings(intra_op_threads=2,
                              disabled_optimizers=MIXED_PRECISION_DISABLED_OPTIMIZERS)
    variant = Variant(plan, tmp_path / "m.onnx", runtime, ("conv1",))
    engines = (EngineRecord(plan.name, precision, tmp_path / "model_sm90.plan",
                            tmp_path / "model_sm90.plan.json", "9.0", "10.13.3"),)
    return PublishInputs(
        ConversionRequest(source="m.onnx", name="minilm", repo=tmp_path, target=target,
                          instance_count=2, trt_accelerator=trt_accelerator,
                          **request),  # type: ignore[arg-type]
        variant, SPEC, FACTS, SERVING, {"input_ids": np.ones(8, np.int64)}, engines, {}, {},
        "0" * 64)


def test_cpu_config_serves_python_backend_with_variant_runtime_when_target_cpu(
        tmp_path: Path) -> None:
    config = build_model_config(model_config(_inputs("cpu", "int8", tmp_path)))
    assert config.backend == "python" and not config.platform
    assert config.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU
    assert config.instance_group[0].count == 2
    assert config.parameters["disabled_optimizers"].string_value == "WeightBiasQuantization"
    assert config.parameters["intra_op_threads"].string_value == "2"
    assert list(config.input[0].dims) == [-1] and config.input[0].data_type == mc.TYPE_INT64
    assert list(config.output[0].dims) == [384]
    assert config.max_batch_size == 16
    assert config.dynamic_batching.max_queue_delay_microseconds == 1500
    assert not config.dynamic_batching.preferred_batch_size  # single-profile: leave unset


@pytest.mark.parametrize(("request_fields", "timeout_us"), [
    ({}, None),  # no queue policy: a timeout costs Triton throughput (server#8870)
    ({"latency_budget_ms": 40.0}, None),  # an SLO alone does not ask for it
    ({"latency_budget_ms": 40.0, "drop_expired": True}, 40_000),
    ({"drop_expired": True}, None),  # nothing to drop at without an SLO
])
def test_queue_policy_drops_what_waited_the_slo_only_when_the_owner_asks(
        tmp_path: Path, request_fields: dict[str, object], timeout_us: int | None) -> None:
    config = build_model_config(model_config(_inputs("cpu", "fp32", tmp_path,
                                                     **request_fields)))
    batching = config.dynamic_batching
    if timeout_us is None:
        assert not batching.HasField("default_queue_policy")
        return
    policy = batching.default_queue_policy
    assert policy.default_timeout_microseconds == timeout_us
    assert policy.timeout_action == mc.ModelQueuePolicy.REJECT
    assert policy.allow_timeout_override


@pytest.mark.parametrize("precision, mode", [("fp16", "FP16"), ("int8", "INT8")])
def test_onnxruntime_config_sets_tensorrt_accelerator_when_requested(
        tmp_path: Path, precision: Precision, mode: str) -> None:
    spec = model_config(_inputs("onnxruntime", precision, tmp_path, trt_accelerator=True))
    config = parse_model_config(render_model_config(spec))
    assert config.platform == "onnxruntime_onnx"
    assert config.instance_group[0].kind == mc.ModelInstanceGroup.KIND_GPU
    (accelerator,) = config.optimization.execution_accelerators.gpu_execution_accelerator
    assert accelerator.name == "tensorrt"
    assert accelerator.parameters["precision_mode"] == mode
    assert "disabled_optimizers" not in config.parameters  # python-backend only


def test_tensorrt_config_maps_compute_capability_to_engine_when_target_tensorrt(
        tmp_path: Path) -> None:
    config = build_model_config(model_config(_inputs("tensorrt", "int8", tmp_path)))
    assert config.platform == "tensorrt_plan"
    assert dict(config.cc_model_filenames) == {"9.0": "model_sm90.plan"}
    assert config.instance_group[0].kind == mc.ModelInstanceGroup.KIND_GPU


def test_convert_writes_gpu_onnxruntime_model_with_symmetric_int8_when_target_onnxruntime(
        tmp_path: Path, cnn_files: Callable[[], tuple[Path, Path, Path]]) -> None:
    model, calib, evaluation = cnn_files()
    result = convert(ConversionRequest(
        source=str(model), name="cnn", repo=tmp_path / "repo", precisions=("fp32", "int8"),
        target="onnxruntime", trt_accelerator=True, calibration=calib, evaluation=evaluation,
        budget=AccuracyBudget(max_top1_drop=None, min_cosine=0.9), max_batch_size=2,
        profile_iterations=2, profile_warmup=1))
    config = parse_model_config((result.path / "config.pbtxt").read_text())
    assert config.platform == "onnxruntime_onnx" and not config.backend
    assert config.instance_group[0].kind == mc.ModelInstanceGroup.KIND_GPU
    (accelerator,) = config.optimization.execution_accelerators.gpu_execution_accelerator
    assert accelerator.parameters["precision_mode"] == result.precision.upper()
    int8 = next(v for v in result.report["variants"] if v["name"] == "int8")
    assert int8["recipe"].startswith("static QDQ S8S8 symmetric")
    assert {p.name for p in (result.path / str(result.version)).iterdir()} == {
        "model.onnx", "metadata.json", "report"}  # no Python-backend model.py on GPU


def test_convert_refuses_tensorrt_target_when_tensorrt_is_absent(
        tmp_path: Path, cnn_files: Callable[[], tuple[Path, Path, Path]]) -> None:
    if tensorrt_available():
        pytest.skip("this host has TensorRT")
    model, _, evaluation = cnn_files()
    with pytest.raises(ConversionFailed, match="TensorRT is not installed here") as info:
        convert(ConversionRequest(source=str(model), name="cnn", repo=tmp_path / "repo",
                                  precisions=("fp16",), target="tensorrt",
                                  evaluation=evaluation))
    assert isinstance(info.value.cause, TargetUnavailable) and info.value.step == "validate"
    assert not (tmp_path / "repo").exists()
