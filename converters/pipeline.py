"""The converter pipeline: ``convert(ConversionRequest) -> ConversionResult``.

:func:`build_pipeline` assembles the steps for a request (one build/repair step per
variant); :func:`run_steps` runs them and owns what every step shares:

- logging (``converters.pipeline``) and timing of each step;
- the failure policy: a :class:`ConversionError` from a fatal step ends the conversion
  as :class:`ConversionFailed` naming the step (the repository is only written by the
  last step, so it stays untouched); a non-fatal step's failure (any exception, logged
  with its traceback) removes its variant and the conversion goes on; ``StepSkipped`` is
  recorded with its reason;
- progress: a :class:`ProgressEvent` per step start/end and whatever a step reports
  in between, to the caller's callback (the CLI's rich display, the upload worker's
  job events).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from converters.datasets import SampleSet
from converters.errors import ConversionError, StepSkipped
from converters.steps.base import (
    ConversionRequest,
    ConversionState,
    ProgressCallback,
    ProgressEvent,
    Step,
    StepContext,
    StepRecord,
    StepState,
)
from converters.steps.build import BuildVariant, PrepareQuantization, RepairVariant, VerifyVariants
from converters.steps.measure import MeasureFootprint, ProfileVariants, SelectVariant
from converters.steps.prepare import (
    CheckModel,
    ComputeReference,
    ExportOnnx,
    LoadSamples,
    LoadSource,
    SynthesizeEvaluation,
    ValidateRequest,
)
from converters.steps.publish import BuildReport, Publish
from converters.steps.tensorrt import BuildEngines
from converters.variants import VariantPlan, plan_variants

__all__ = ["ConversionFailed", "ConversionRequest", "ConversionResult", "ProgressEvent",
           "build_pipeline", "convert", "run_steps"]

log = logging.getLogger("converters.pipeline")


class ConversionFailed(ConversionError):
    """A fatal step refused the conversion. The message's first line says what to do
    (the cause's ``action``); the next names the step and carries the cause's whole
    reason."""

    def __init__(self, step: str, title: str, cause: ConversionError,
                 records: Sequence[StepRecord]) -> None:
        super().__init__(f"{cause.action.rstrip('.')}.\n{title}: {cause}",
                         action=cause.action)
        self.step, self.title, self.cause, self.records = step, title, cause, tuple(records)

    @property
    def reason(self) -> str:
        return str(self.cause)


@dataclass(frozen=True)
class ConversionResult:
    name: str
    version: int
    path: Path
    target: str
    chosen: str
    precision: str
    report: dict[str, Any]
    report_files: dict[str, Path]  # inside the published version folder
    steps: tuple[StepRecord, ...]
    # what the variants were verified on (synthetic without an evaluation set)
    evaluation: SampleSet = field(repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "version": self.version, "path": str(self.path),
            "target": self.target, "chosen": self.chosen, "precision": self.precision,
            "report_files": {k: str(v) for k, v in self.report_files.items()},
            "steps": [s.to_dict() for s in self.steps],
            "report": self.report,
        }


def plans_for(request: ConversionRequest) -> tuple[VariantPlan, ...]:
    """Every variant that may apply; FP32 always (it is the reference and the baseline
    for speed-ups), served only when requested. Steps skip what the model rules out."""
    plans = plan_variants(("fp32", *request.precisions), request.target, encoder=True,
                          calibration=request.calibration_method,
                          per_channel=request.per_channel)
    return tuple({p.name: p for p in plans}.values())


def build_pipeline(request: ConversionRequest) -> list[Step[Any, Any]]:
    plans = plans_for(request)
    steps: list[Step[Any, Any]] = [
        ValidateRequest(), LoadSource(), LoadSamples(), ExportOnnx(), CheckModel(),
        *([SynthesizeEvaluation()] if request.evaluation is None else []),
        ComputeReference(), PrepareQuantization(),
    ]
    steps += [BuildVariant(p) for p in plans]
    steps.append(VerifyVariants())
    # dynamic INT8 first: for encoders it usually repairs cheaply, and then static INT8
    # (hundreds of layers to rank) need not be repaired at all
    int8 = sorted((p for p in plans if p.precision == "int8"),
                  key=lambda p: p.kind != "int8-dynamic")
    steps += [RepairVariant(p) for p in int8]
    steps += [ProfileVariants(), SelectVariant(), MeasureFootprint(), BuildEngines(),
              BuildReport(), Publish()]
    return steps


def initial_state(request: ConversionRequest, workdir: Path) -> ConversionState:
    return ConversionState(request=request, workdir=workdir, plans=plans_for(request))


@dataclass
class _StepProgress:
    """Progress events of one step, stamped with its position and elapsed time."""

    step: Step[Any, Any]
    index: int
    total: int
    started: float
    emit: ProgressCallback
    clock: Callable[[], float]

    def __call__(self, state: StepState, detail: str = "",
                 fraction: float | None = None) -> None:
        self.emit(ProgressEvent(self.step.label, self.step.title, self.index, self.total,
                                state, detail, fraction, self.clock() - self.started))

    def running(self, fraction: float | None, detail: str) -> None:
        self("running", detail, fraction)


def run_steps(
    steps: Sequence[Step[Any, Any]],
    state: ConversionState,
    progress: ProgressCallback | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> ConversionState:
    emit: ProgressCallback = progress or (lambda event: None)
    for index, step in enumerate(steps, start=1):
        started = clock()
        event = _StepProgress(step, index, len(steps), started, emit, clock)
        event("started")
        ctx = StepContext(state.workdir, log, event.running)
        record, state = _run_one(step, state, ctx, clock, started)
        state = replace(state, records=(*state.records, record))
        log.info("%-16s %-7s %6.1f s  %s", record.label, record.state, record.seconds,
                 record.detail)
        event(record.state, record.detail, 1.0 if record.state == "done" else None)
    return state


def _run_one(step: Step[Any, Any], state: ConversionState, ctx: StepContext,
             clock: Callable[[], float], started: float) -> tuple[StepRecord, ConversionState]:
    def record(kind: StepState, detail: str) -> StepRecord:
        return StepRecord(step.label, step.title, kind, clock() - started, detail)

    try:
        output = step.run(step.inputs(state), ctx)
        state = step.apply(state, output)
        return record("done", step.summary(output)), state
    except StepSkipped as skipped:
        return record("skipped", f"skipped: {skipped}"), state
    except ConversionError as error:
        if step.fatal:
            failed = record("failed", str(error))
            # the caller reports the raised error (whole); the log only records it
            log.info("%s failed: %s", step.label, error)
            raise ConversionFailed(step.label, step.title, error,
                                   (*state.records, failed)) from error
        return record("failed", str(error)), step.on_failure(state, str(error))
    except Exception as error:
        if step.fatal:
            log.exception("%s crashed", step.label)
            raise
        log.warning("%s failed", step.label, exc_info=True)
        reason = f"{type(error).__name__}: {error}"
        return record("failed", reason), step.on_failure(state, reason)


def convert(request: ConversionRequest, progress: ProgressCallback | None = None) -> \
        ConversionResult:
    """Run the whole pipeline; raises :class:`ConversionFailed` for a refused conversion."""
    workdir = Path(tempfile.mkdtemp(prefix=f"convert.{request.name[:32].replace('/', '_')}."))
    try:
        state = run_steps(build_pipeline(request), initial_state(request, workdir), progress)
        if request.keep_workdir is not None:
            shutil.copytree(workdir, request.keep_workdir, dirs_exist_ok=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    written = state.require(state.written, "written model")
    selection = state.require(state.selection, "selection")
    version_dir = written.path / str(written.version)
    report = dict(state.report)
    report["steps"] = [r.to_dict() for r in state.records]
    report["published"] = {"path": str(written.path), "version": written.version}
    return ConversionResult(
        name=written.name, version=written.version, path=written.path,
        target=request.target, chosen=selection.chosen,
        precision=state.variants[selection.chosen].precision, report=report,
        report_files={k: version_dir / "report" / k for k in state.report_files},
        steps=state.records, evaluation=state.require(state.evaluation, "evaluation set"),
    )
