"""The worker's call into the converter pipeline (issue 3): an upload's spec and files
become a :class:`converters.pipeline.ConversionRequest`; the pipeline's progress events
become job steps; its published version becomes a :class:`ConversionOutcome` carrying
the config it was published with. Runs inside the worker process only.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.lifecycle.conversion.worker_protocol import ConversionOutcome, WorkerTask

if TYPE_CHECKING:
    from converters.datasets import SampleSet

StepReporter = Callable[..., None]
STEP_STATES = {"started": "running", "running": "running", "done": "done",
               "skipped": "skipped", "failed": "failed"}


class ConversionError(Exception):
    """The pipeline refused the model or its samples; the message names the problem."""


def conversion_request(task: WorkerTask, calibration: Path | None,
                       evaluation: Path | None) -> Any:
    from converters.images import preprocessing_from_text
    from converters.metrics import AccuracyBudget
    from converters.pipeline import ConversionRequest
    from converters.spec import InputSpec
    from gateway.lifecycle.intake.spec import UploadSpec

    spec = UploadSpec.model_validate(task.spec)  # the gateway checked it: same schema
    try:
        preprocessing = (preprocessing_from_text(spec.preprocessing)
                         if spec.preprocessing else None)
    except ValueError as exc:
        raise ConversionError(str(exc)) from None
    return ConversionRequest(
        source=task.model_file, name=task.model, repo=Path(task.repository),
        precisions=spec.precisions, target=spec.target,
        calibration=calibration, evaluation=evaluation, input_spec=InputSpec(spec.inputs),
        preprocessing=preprocessing, budget=spec.accuracy_budget or AccuracyBudget(),
        max_batch_size=spec.max_batch_size, latency_budget_ms=spec.latency_slo_ms,
        drop_expired=spec.drop_expired,
        instance_count=spec.instance_count, intra_op_threads=spec.intra_op_threads,
        profile_iterations=spec.profile_iterations, repair=spec.repair,
        min_version=task.min_version,
    )


def convert_upload(task: WorkerTask, calibration: Path | None, evaluation: Path | None,
                   step: StepReporter) -> ConversionOutcome:
    from converters.errors import ConversionError as Refused
    from converters.pipeline import ProgressEvent, convert

    def progress(event: ProgressEvent) -> None:
        step(event.step, STEP_STATES.get(event.state, event.state), event.detail,
             event.fraction)

    request = conversion_request(task, calibration, evaluation)
    try:
        result = convert(request, progress)
    except Refused as exc:
        # the job folder is the gateway's business: name the uploaded part instead
        message = str(exc).replace(f"{task.work_dir}/", "")
        # the converter's message is whole and starts with what to do: keep it first
        raise ConversionError(f"{message}\n[{type(getattr(exc, 'cause', exc)).__name__}]") \
            from None
    version_dir = result.path / str(result.version)
    reports = sorted((p for p in result.report_files.values() if p.is_file()),
                     key=lambda p: p.suffix != ".md")  # the Markdown report first
    report = reports[0] if reports else None
    return ConversionOutcome(
        version=result.version,
        config=(result.path / "config.pbtxt").read_text(),
        precision=result.precision,
        report=str(report.relative_to(version_dir)) if report else None,
        metadata=_summary(version_dir, result.chosen, result.target, task.model_format),
        agreement=_keep_samples(task, result.evaluation),
    )


def _keep_samples(task: WorkerTask, evaluation: SampleSet) -> str | None:
    """Up to ``task.agreement_samples`` of the samples the variants were verified on (the
    owner's evaluation set, else the synthetic one), spread over the set and stacked per
    input into ``agreement.npz``: what a rollout replays to both versions."""
    if task.agreement_samples <= 0:
        return None
    import numpy as np

    samples = evaluation.strided(task.agreement_samples)
    batch = next(samples.batches(task.agreement_samples))  # those of the first's shapes
    path = Path(task.work_dir) / "agreement.npz"
    np.savez(path, **batch)  # type: ignore[arg-type]
    return str(path)


def _summary(version_dir: Path, chosen: str, target: str, source_format: str) -> dict[str, Any]:
    """The few figures ``GET /v1/models/{name}`` shows; the report has the rest."""
    summary: dict[str, Any] = {"variant": chosen, "target": target, "source": source_format}
    path = version_dir / "metadata.json"
    if path.is_file():
        meta = json.loads(path.read_text())
        accuracy = meta.get("accuracy") or {}
        summary.update(
            speedup_vs_fp32=meta.get("speedup_vs_fp32"),
            accuracy={k: accuracy.get(k) for k in ("samples", "cosine", "top1_drop",
                                                   "max_abs_err") if k in accuracy},
            # "synthetic": verified against the source on drawn inputs, not real data
            evaluation="synthetic" if (meta.get("evaluation") or {}).get("synthetic")
            else "uploaded",
        )
    return summary
