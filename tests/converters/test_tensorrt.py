"""TensorRT: the parts that run without a GPU (profiles, engine tags, refusal, configs),
and the step reporting itself skipped where TensorRT is absent."""

from __future__ import annotations

from pathlib import Path

import pytest

from converters.errors import EngineMismatch, StepSkipped
from converters.spec import parse_input_spec
from converters.steps.tensorrt import BuildEngines
from converters.tensorrt import (
    EngineTag,
    cc_model_filenames,
    check_engine,
    engine_filename,
    optimization_profile,
    tensorrt_available,
)

TEXT = parse_input_spec("input_ids:int64[batch,sequence];attention_mask:int64[batch,sequence]")


def test_optimization_profile_spans_batch_and_observed_lengths_when_dynamic() -> None:
    observed = {"input_ids": [(1, 16), (1, 40), (1, 24)], "attention_mask": [(1, 16)]}
    profile = optimization_profile(TEXT, max_batch=32, opt_batch=8, observed=observed)
    ids = profile.inputs[0]
    assert (ids.min, ids.opt, ids.max) == ((1, 16), (8, 24), (32, 40))
    mask = profile.inputs[1]
    assert (mask.min, mask.opt, mask.max) == ((1, 16), (8, 16), (32, 16))


def test_optimization_profile_keeps_fixed_dims_when_image_input() -> None:
    spec = parse_input_spec("input:float32[batch,3,224,224]")
    (only,) = optimization_profile(spec, max_batch=16, opt_batch=4).inputs
    assert only.min == (1, 3, 224, 224) and only.max == (16, 3, 224, 224)
    with pytest.raises(ValueError, match="opt batch 32 must lie in 1..16"):
        optimization_profile(spec, max_batch=16, opt_batch=32)


def test_engine_tag_round_trips_beside_the_plan_when_written(tmp_path: Path) -> None:
    tag = EngineTag("10.13.3", "8.0", "int8", {"input": {"min": [1, 3]}})
    plan = tmp_path / tag.filename
    plan.write_bytes(b"engine")
    tag.write(plan)
    assert plan.name == "model_sm80.plan"
    assert EngineTag.read(plan) == tag
    assert cc_model_filenames([tag, EngineTag("10.13.3", "9.0", "int8", {})]) == {
        "8.0": "model_sm80.plan", "9.0": "model_sm90.plan"}


@pytest.mark.parametrize("runtime, device, problem", [
    ("10.13.3", "9.0", "built for GPU compute capability 8.0, this GPU is 9.0"),
    ("10.14.1", "8.0", "built with TensorRT 10.13.3, this host runs TensorRT 10.14.1"),
])
def test_check_engine_refuses_with_reason_when_built_elsewhere(
        runtime: str, device: str, problem: str) -> None:
    tag = EngineTag("10.13.3", "8.0", "fp16", {})
    check_engine(tag, "10.13.3", "8.0")  # the matching host loads it
    with pytest.raises(EngineMismatch, match=problem):
        check_engine(tag, runtime, device)


def test_engine_tag_read_refuses_when_tag_missing(tmp_path: Path) -> None:
    (tmp_path / engine_filename("8.6")).write_bytes(b"x")
    with pytest.raises(EngineMismatch, match="has no tag"):
        EngineTag.read(tmp_path / "model_sm86.plan")


@pytest.mark.skipif(tensorrt_available(), reason="checks the host without TensorRT")
def test_tensorrt_step_reports_not_installed_when_tensorrt_absent() -> None:
    with pytest.raises(StepSkipped, match="^TensorRT not installed$"):
        BuildEngines().inputs(None)  # type: ignore[arg-type]
