"""The worker's call into the converter, in-process (no gateway, no Triton): an upload
without an evaluation part converts FP32 on synthetic inputs, and a rollout that follows
replays those same synthetic samples."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from converters.spec import InputSpec, TensorDecl
from converters.synthetic import synthetic_set
from gateway.lifecycle.conversion.convert import convert_upload
from gateway.lifecycle.conversion.worker_protocol import WorkerTask
from tests.gateway.lifecycle.conftest import TINY_SPEC, affine_onnx


def test_convert_upload_keeps_synthetic_samples_for_rollout_when_no_evaluation_part(
        tmp_path: Path) -> None:
    work = tmp_path / "job"
    work.mkdir()
    task = WorkerTask(job_id="job-1", model="affine", repository=str(tmp_path / "repo"),
                      model_file=str(affine_onnx(work / "model.onnx", 3.0)),
                      model_format="onnx", spec=TINY_SPEC, work_dir=str(work),
                      agreement_samples=8)
    steps: list[tuple[str, str]] = []
    outcome = convert_upload(task, None, None, lambda name, state, *rest: steps.append(
        (name, state)))
    assert outcome.version == 1 and outcome.precision == "fp32"
    assert ("synthetic", "done") in steps
    assert outcome.metadata["evaluation"] == "synthetic"
    assert outcome.agreement is not None
    with np.load(outcome.agreement) as kept:
        replayed = kept["x"]
    drawn = synthetic_set(InputSpec((TensorDecl("x", "float32", ("batch", 16)),))).strided(8)
    assert np.array_equal(replayed, np.stack([s["x"] for s in drawn.samples]))


def test_convert_upload_keeps_no_samples_when_no_rollout_follows(tmp_path: Path) -> None:
    """Also: the lifecycle's version floor reaches the publish step (numbers 1-3 were
    issued before, their versions gone from disk)."""
    work = tmp_path / "job"
    work.mkdir()
    task = WorkerTask(job_id="job-2", model="affine", repository=str(tmp_path / "repo"),
                      model_file=str(affine_onnx(work / "model.onnx", 3.0)),
                      model_format="onnx", spec=TINY_SPEC, work_dir=str(work),
                      min_version=4)
    outcome = convert_upload(task, None, None, lambda *event: None)
    assert outcome.agreement is None
    assert outcome.version == 4 and (tmp_path / "repo" / "affine" / "4").is_dir()
