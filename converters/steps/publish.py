"""Render the report, then publish the chosen variant (with its report) as the next
version of the model, atomically: any failure leaves the repository as it was. The
next version is one above those on disk and at least the request's ``min_version``
(:func:`converters.repository.next_version`)."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from converters.confidence import wilson
from converters.datasets import SampleSet
from converters.errors import TargetUnavailable
from converters.footprint import Footprint
from converters.graph import ModelFacts
from converters.metrics import Accuracy, AccuracyBudget
from converters.model_dir import (
    ModelArtifact,
    ModelDirectoryRequest,
    WrittenModel,
    runtime_versions,
    sha256_file,
    write_model_directory,
)
from converters.profile import VariantProfile
from converters.repair import RepairOutcome
from converters.report import write_report
from converters.select import Selection, ServingPlan
from converters.sources import LoadedSource
from converters.spec import InputSpec, is_dynamic, numpy_dtype_name
from converters.steps.base import (
    ConversionRequest,
    ConversionState,
    EngineRecord,
    Step,
    StepContext,
    StepRecord,
)
from converters.tensorrt import cc_model_filenames
from converters.triton_config import NUMPY_TO_TRITON, DynamicBatching, ModelConfigSpec, TensorSpec
from converters.variants import Variant, VariantPlan

REPORT_FOLDER = "report"
TRT_PRECISION_MODE = {"fp32": "FP32", "fp16": "FP16", "int8": "INT8"}


def accuracy_dict(accuracy: Accuracy | None) -> dict[str, Any] | None:
    if accuracy is None:
        return None
    primary = accuracy.outputs[accuracy.primary_output]
    result: dict[str, Any] = {
        "samples": accuracy.samples, "primary_output": accuracy.primary_output,
        "cosine": primary.mean_cosine, "min_cosine": primary.min_cosine,
        "max_abs_err": primary.max_abs_err, "max_rel_err": primary.max_rel_err,
        "outputs": {k: asdict(v) for k, v in accuracy.outputs.items()},
        "top1": None, "top5": None, "top1_drop": None,
    }
    if accuracy.classification is not None:
        result.update(asdict(accuracy.classification))
        agreeing = round(accuracy.classification.top1 * accuracy.samples)
        interval = wilson(agreeing, accuracy.samples)
        result["top1_ci95"] = [interval.low, interval.high]  # Wilson, samples independent
    return result


@dataclass(frozen=True)
class ReportInputs:
    """What the report describes, picked from the state (not the whole state)."""

    model: str
    target: str
    budget: AccuracyBudget
    latency_budget_ms: float | None
    source: LoadedSource
    source_sha256: str
    classify: bool
    calibration: SampleSet | None
    evaluation: SampleSet | None
    spec: InputSpec | None
    export_info: Mapping[str, Any]
    facts: ModelFacts | None
    plans: tuple[VariantPlan, ...]
    variants: Mapping[str, Variant]
    failures: Mapping[str, str]
    accuracy: Mapping[str, Accuracy]
    profiles: Mapping[str, VariantProfile]
    repairs: Mapping[str, RepairOutcome]
    selection: Selection | None
    serving: ServingPlan | None
    footprint: Footprint | None
    engines: tuple[EngineRecord, ...]
    records: tuple[StepRecord, ...]
    notes: tuple[str, ...]

    @classmethod
    def of(cls, state: ConversionState) -> ReportInputs:
        r = state.request
        return cls(
            r.name, r.target, r.budget, r.latency_budget_ms,
            state.require(state.source, "source"), source_sha256(state), state.classify,
            state.calibration, state.evaluation, state.spec, state.export_info, state.facts,
            state.plans, state.variants, state.failures, state.accuracy, state.profiles,
            state.repairs, state.selection, state.serving, state.footprint, state.engines,
            state.records,
            state.notes,
        )


def report_dict(inputs: ReportInputs) -> dict[str, Any]:
    selection = inputs.selection
    fp32 = inputs.profiles.get("fp32")
    variants = []
    for plan in inputs.plans:
        variant = inputs.variants.get(plan.name)
        if variant is None and plan.name not in inputs.failures:
            continue
        profile = inputs.profiles.get(plan.name)
        entry: dict[str, Any] = variant.to_dict() if variant else {
            "name": plan.name, "precision": plan.precision, "recipe": plan.describe()}
        entry.update(
            accuracy=accuracy_dict(inputs.accuracy.get(plan.name)),
            profile=profile.to_dict() if profile else None,
            speedup=(profile.speed / fp32.speed) if profile and fp32 else None,
            speedup_by_batch={t.batch: fp32.at(t.batch).p50_ms / t.p50_ms
                              for t in profile.timings} if profile and fp32 else None,
            failure=inputs.failures.get(plan.name),
            verdict=selection.verdict(plan.name).to_dict() if selection and any(
                v.variant == plan.name for v in selection.verdicts) else None,
        )
        variants.append(entry)
    source = inputs.source
    return {
        "model": inputs.model,
        "target": inputs.target,
        "source": {"kind": source.kind, "location": source.location,
                   "sha256": inputs.source_sha256},
        "budget": asdict(inputs.budget),
        "latency_budget_ms": inputs.latency_budget_ms,
        "task": "classification" if inputs.classify else "other",
        "calibration": _set_info(inputs.calibration),
        "evaluation": _set_info(inputs.evaluation),
        "input_spec": inputs.spec.to_dict() if inputs.spec else None,
        "export": dict(inputs.export_info),
        "facts": inputs.facts.to_dict() if inputs.facts else None,
        "variants": variants,
        "repairs": {name: _repair_dict(o) for name, o in inputs.repairs.items()},
        "chosen": selection.chosen if selection else None,
        "serving": inputs.serving.to_dict() if inputs.serving else None,
        "footprint": inputs.footprint.to_dict() if inputs.footprint else None,
        "tensorrt": [_engine_dict(e) for e in inputs.engines],
        "steps": [rec.to_dict() for rec in inputs.records],
        "notes": list(inputs.notes),
        "versions": {**runtime_versions(), "converter": _converter_version()},
    }


def source_sha256(state: ConversionState) -> str:
    source = state.require(state.source, "source")
    if source.kind == "entrypoint" and state.exported is not None:
        return sha256_file(state.exported)  # the weights, not the factory's name
    return source.sha256


def _set_info(samples: SampleSet | None) -> dict[str, Any] | None:
    if samples is None:
        return None
    info = {"source": samples.source, "samples": len(samples),
            "labelled": samples.labels is not None, "synthetic": samples.synthetic is not None}
    if samples.synthetic is not None:
        info.update(seed=samples.synthetic.seed,
                    ranges=[r.to_dict() for r in samples.synthetic.ranges])
    return info


def _repair_dict(outcome: Any) -> dict[str, Any]:
    return {
        "accepted": outcome.accepted, "reason": outcome.reason,
        "float_nodes": list(outcome.float_nodes),
        "iterations": [asdict(i) for i in outcome.iterations],
        "ranking": [asdict(s) for s in outcome.ranking],
    }


def _engine_dict(engine: EngineRecord) -> dict[str, Any]:
    return {"variant": engine.variant, "precision": engine.precision,
            "file": engine.path.name, "compute_capability": engine.compute_capability,
            "tensorrt_version": engine.tensorrt_version,
            "accuracy": accuracy_dict(engine.accuracy)}


def _converter_version() -> str:
    try:
        return importlib.metadata.version("infergate")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True)
class ReportOutput:
    report: dict[str, Any]
    files: dict[str, Path]


class BuildReport(Step[ReportInputs, ReportOutput]):
    """Renders into the work folder; Publish moves it in beside the model."""

    name, title = "report", "Write the report"

    def inputs(self, state: ConversionState) -> ReportInputs:
        return ReportInputs.of(state)

    def run(self, inputs: ReportInputs, ctx: StepContext) -> ReportOutput:
        report = report_dict(inputs)
        return ReportOutput(report, write_report(report, ctx.workdir / REPORT_FOLDER))

    def apply(self, state: ConversionState, output: ReportOutput) -> ConversionState:
        return replace(state, report=output.report, report_files=output.files)


@dataclass(frozen=True)
class PublishInputs:
    request: ConversionRequest
    variant: Variant
    spec: InputSpec
    facts: ModelFacts
    serving: ServingPlan
    warmup_sample: Mapping[str, np.ndarray]
    engines: tuple[EngineRecord, ...]
    report_files: Mapping[str, Path]
    metadata: Mapping[str, Any]
    source_sha256: str


class Publish(Step[PublishInputs, WrittenModel]):
    name, title = "publish", "Write the Triton model directory"

    def inputs(self, state: ConversionState) -> PublishInputs:
        selection = state.require(state.selection, "selection")
        variant = state.variants[selection.chosen]
        evaluation: SampleSet = state.require(state.evaluation, "evaluation set")
        chosen = next(v for v in state.report["variants"] if v["name"] == selection.chosen)
        metadata = {
            "precision": variant.precision, "variant": variant.name,
            "recipe": variant.plan.describe(), "float_nodes": list(variant.float_nodes),
            "accuracy": chosen["accuracy"], "profile": chosen["profile"],
            "speedup_vs_fp32": chosen["speedup"],
            "selection": [v.to_dict() for v in selection.verdicts],
            "serving": state.require(state.serving, "serving plan").to_dict(),
            "budget": asdict(state.request.budget), "source": state.report["source"],
            "calibration": state.report["calibration"],
            "evaluation": state.report["evaluation"], "report": f"{REPORT_FOLDER}/report.md",
            "converter_version": _converter_version(),
            "tensorrt": state.report["tensorrt"],
        }
        return PublishInputs(
            state.request, variant, state.require(state.spec, "spec"),
            state.require(state.facts, "facts"), state.require(state.serving, "serving"),
            evaluation.samples[0], state.engines, state.report_files, metadata,
            source_sha256(state),
        )

    def run(self, inputs: PublishInputs, ctx: StepContext) -> WrittenModel:
        files = dict(self._model_files(inputs))
        files.update({f"{REPORT_FOLDER}/{name}": path
                      for name, path in inputs.report_files.items()})
        warmup = {b: {k: v[None] for k, v in inputs.warmup_sample.items()}
                  for b in inputs.serving.warmup_batch_sizes}
        return write_model_directory(ModelDirectoryRequest(
            repo=inputs.request.repo,
            config=model_config(inputs),
            artifact=ModelArtifact(files, inputs.source_sha256),
            warmup_inputs=warmup,
            metadata=inputs.metadata,
            min_version=inputs.request.min_version,
        ))

    def _model_files(self, inputs: PublishInputs) -> dict[str, Path]:
        if inputs.request.target != "tensorrt":
            return {"model.onnx": inputs.variant.path}
        engines = [e for e in inputs.engines if e.variant == inputs.variant.name]
        if not engines:
            raise TargetUnavailable(
                f"target tensorrt: no verified TensorRT engine for {inputs.variant.name}")
        return {name: path for e in engines
                for name, path in ((e.path.name, e.path), (e.tag_path.name, e.tag_path))}

    def apply(self, state: ConversionState, output: WrittenModel) -> ConversionState:
        return replace(state, written=output)

    def summary(self, output: WrittenModel) -> str:
        return f"{output.path} version {output.version}"


def model_config(inputs: PublishInputs) -> ModelConfigSpec:
    request, variant, serving = inputs.request, inputs.variant, inputs.serving
    outputs = tuple(
        TensorSpec(name, NUMPY_TO_TRITON[numpy_dtype_name(dtype)] if dtype != "?" else "FP32",
                   tuple(-1 if is_dynamic(d) or d == "?" else int(d) for d in shape[1:]))
        for name, dtype, shape in inputs.facts.outputs
    )
    inputs_ = tuple(TensorSpec(t.name, t.triton_datatype, t.triton_dims())
                    for t in inputs.spec.inputs)
    parameters: dict[str, str] = {}
    if request.target == "cpu":
        parameters = {**variant.runtime.config_parameters(), "onnx_model_filename": "model.onnx"}
    engines = [e for e in inputs.engines if e.variant == variant.name]
    return ModelConfigSpec(
        name=request.name,
        target=request.target,
        max_batch_size=serving.max_batch_size,
        inputs=inputs_,
        outputs=outputs,
        dynamic_batching=DynamicBatching.for_slo(serving.max_queue_delay_us,
                                                 request.latency_budget_ms,
                                                 request.drop_expired),
        instance_count=request.instance_count,
        parameters=parameters,
        trt_precision_mode=TRT_PRECISION_MODE[variant.precision]
        if request.target == "onnxruntime" and request.trt_accelerator else None,
        cc_model_filenames=cc_model_filenames(
            [_tag(e) for e in engines]) if request.target == "tensorrt" else {},
    )


def _tag(engine: EngineRecord) -> Any:
    from converters.tensorrt import EngineTag

    return EngineTag(engine.tensorrt_version, engine.compute_capability, engine.precision, {})
