"""From a request to a checked FP32 ONNX model and its reference outputs.

Cheap checks first: a bad name, a missing calibration set or a corrupt model is refused
before any export or calibration runs, and before the repository is touched.

Without an evaluation set (FP32/FP16 only), :class:`SynthesizeEvaluation` draws one once
the graph is checked (:mod:`converters.synthetic`: the graph tells which inputs index an
embedding table); export and check trace and compare on two synthetic samples drawn from
the spec alone.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx

from converters import graph
from converters.compat import RuntimeLimits, limits_for, make_compatible
from converters.datasets import SampleSet, load_samples
from converters.errors import (
    InputSpecMismatch,
    InvalidDataset,
    InvalidRequest,
    StepSkipped,
    TargetUnavailable,
)
from converters.images import ImagePreprocessing
from converters.metrics import looks_like_classifier
from converters.repository import validate_model_name
from converters.runtime import RuntimeSettings, open_session, providers_for, run_batches
from converters.sources import LoadedSource, load_source
from converters.sources.export import export_to_onnx
from converters.spec import InputSpec, check_spec_matches, describe, spec_from_onnx
from converters.steps.base import ConversionRequest, ConversionState, Step, StepContext, Task
from converters.synthetic import embedding_rows, synthetic_set
from converters.tensorrt import tensorrt_available
from converters.variants import PRECISIONS, is_transformer_encoder

TARGETS = ("cpu", "onnxruntime", "tensorrt")


class ValidateRequest(Step[ConversionRequest, None]):
    name, title = "validate", "Check the request"

    def inputs(self, state: ConversionState) -> ConversionRequest:
        return state.request

    def run(self, inputs: ConversionRequest, ctx: StepContext) -> None:
        r = inputs
        validate_model_name(r.name)
        unknown = [p for p in r.precisions if p not in PRECISIONS]
        if not r.precisions or unknown:
            raise InvalidRequest(
                f"precisions {list(r.precisions)}: choose from {', '.join(PRECISIONS)}")
        if r.target not in TARGETS:
            raise InvalidRequest(f"target {r.target!r}: choose from {', '.join(TARGETS)}")
        if r.target == "tensorrt" and not tensorrt_available():
            raise TargetUnavailable(
                "target tensorrt needs TensorRT engines built on the GPU that serves them, "
                "and TensorRT is not installed here: convert on a GPU host, or use --target "
                "onnxruntime (Triton's TensorRT accelerator builds engines at load)")
        missing = [flag for flag, given in (("--calib", r.calibration), ("--eval", r.evaluation))
                   if given is None]
        if "int8" in r.precisions and missing:
            raise InvalidRequest(
                "INT8 needs a calibration set (--calib) and an evaluation set (--eval); "
                f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing "
                "(fp32 and fp16 convert without them, verified on synthetic inputs)")
        if r.calibration is not None and r.evaluation is not None \
                and r.calibration.resolve() == r.evaluation.resolve():
            raise InvalidRequest(
                f"evaluation set {r.evaluation} is the calibration set: verifying on the "
                "data INT8 was calibrated on hides its errors; give two separate sets")
        if r.max_batch_size < 1:
            raise InvalidRequest(f"max batch size {r.max_batch_size} must be >= 1")
        if r.repo.exists() and not r.repo.is_dir():
            raise InvalidRequest(f"repository {r.repo} is not a folder")

    def apply(self, state: ConversionState, output: None) -> ConversionState:
        return state


@dataclass(frozen=True)
class SourceInputs:
    location: str
    declared: InputSpec | None
    output_names: tuple[str, ...]


@dataclass(frozen=True)
class SourceOutput:
    source: LoadedSource
    spec: InputSpec


class LoadSource(Step[SourceInputs, SourceOutput]):
    name, title = "source", "Open the model"

    def inputs(self, state: ConversionState) -> SourceInputs:
        r = state.request
        return SourceInputs(r.source, r.input_spec, r.output_names)

    def run(self, inputs: SourceInputs, ctx: StepContext) -> SourceOutput:
        source = load_source(inputs.location)
        if source.kind == "onnx":
            assert source.onnx_path is not None
            model_spec = spec_from_onnx(graph.load_onnx(source.onnx_path))
            if inputs.declared is not None:
                check_spec_matches(inputs.declared, model_spec)
            spec = inputs.declared or model_spec
        else:
            spec = inputs.declared or source.input_spec  # type: ignore[assignment]
            if spec is None:
                raise InvalidRequest(
                    f"{inputs.location} is a PyTorch model: declare its inputs with "
                    "--input-spec 'name:dtype[batch,...]'")
        if not spec.batched:
            raise InputSpecMismatch(
                f"inputs {describe(spec)}: the first axis of every input must be a dynamic "
                "batch axis (export with a dynamic batch dimension)")
        if inputs.output_names and not source.output_names:
            source = replace(source, output_names=inputs.output_names)
        return SourceOutput(source, spec)

    def apply(self, state: ConversionState, output: SourceOutput) -> ConversionState:
        return replace(state, source=output.source, spec=output.spec)

    def summary(self, output: SourceOutput) -> str:
        return f"{output.source.kind}: {describe(output.spec)}"


@dataclass(frozen=True)
class SamplesInputs:
    spec: InputSpec
    calibration: Path | None
    evaluation: Path | None  # None: synthetic, drawn after the check
    preprocessing: ImagePreprocessing | None
    max_calibration: int | None
    max_evaluation: int | None


@dataclass(frozen=True)
class SamplesOutput:
    calibration: SampleSet | None
    evaluation: SampleSet | None
    note: str | None


class LoadSamples(Step[SamplesInputs, SamplesOutput]):
    name, title = "samples", "Read calibration and evaluation sets"

    def inputs(self, state: ConversionState) -> SamplesInputs:
        r = state.request
        if r.calibration is None and r.evaluation is None:
            raise StepSkipped("no calibration or evaluation set: verified on synthetic inputs")
        return SamplesInputs(state.require(state.spec, "input spec"), r.calibration,
                             r.evaluation, r.preprocessing, r.max_calibration_samples,
                             r.max_evaluation_samples)

    def run(self, inputs: SamplesInputs, ctx: StepContext) -> SamplesOutput:
        evaluation = None if inputs.evaluation is None else load_samples(
            inputs.evaluation, inputs.spec, "evaluation", inputs.preprocessing,
            inputs.max_evaluation)
        calibration = None
        note = None
        if inputs.calibration is not None:
            calibration = load_samples(inputs.calibration, inputs.spec, "calibration",
                                       inputs.preprocessing, inputs.max_calibration)
        if calibration is not None and evaluation is not None:
            shared = len(evaluation.fingerprints() & calibration.fingerprints())
            if shared == len(evaluation):
                raise InvalidDataset(
                    f"every evaluation sample also appears in the calibration set "
                    f"{inputs.calibration}: verification needs unseen samples")
            if shared:
                note = f"{shared} of {len(evaluation)} evaluation samples also calibrate"
        return SamplesOutput(calibration, evaluation, note)

    def apply(self, state: ConversionState, output: SamplesOutput) -> ConversionState:
        notes = state.notes + ((output.note,) if output.note else ())
        return replace(state, calibration=output.calibration, evaluation=output.evaluation,
                       notes=notes)

    def summary(self, output: SamplesOutput) -> str:
        calib = len(output.calibration) if output.calibration else 0
        if output.evaluation is None:
            return f"{calib} calibration samples; evaluation: synthetic inputs"
        return f"{calib} calibration, {len(output.evaluation)} evaluation samples"


def example_batch(state: ConversionState) -> dict[str, np.ndarray]:
    """Two samples to export and check with: the evaluation set's, else synthetic ones
    drawn from the spec alone (the graph is not checked yet)."""
    if state.evaluation is not None:
        return state.evaluation.first_batch(2)
    spec = state.require(state.spec, "input spec")
    return synthetic_set(spec, state.request.preprocessing, limit=2).first_batch(2)


@dataclass(frozen=True)
class ExportInputs:
    source: LoadedSource
    spec: InputSpec
    example: dict[str, np.ndarray]
    opset: int
    target: Path


@dataclass(frozen=True)
class ExportOutput:
    path: Path
    info: dict[str, object]


class ExportOnnx(Step[ExportInputs, ExportOutput]):
    name, title = "export", "Export to ONNX"

    def inputs(self, state: ConversionState) -> ExportInputs:
        return ExportInputs(state.require(state.source, "source"),
                            state.require(state.spec, "input spec"),
                            example_batch(state), state.request.opset,
                            state.workdir / "exported.onnx")

    def run(self, inputs: ExportInputs, ctx: StepContext) -> ExportOutput:
        source = inputs.source
        if source.kind == "onnx":
            assert source.onnx_path is not None
            model = graph.load_onnx(source.onnx_path)
            if not graph.external_locations(onnx.load(str(source.onnx_path),
                                                      load_external_data=False)):
                shutil.copy2(source.onnx_path, inputs.target)
                return ExportOutput(inputs.target, {"exporter": "none (ONNX source)"})
            # external weights loaded from beside the source: the work copy is one file
            graph.save_onnx(model, inputs.target)
            return ExportOutput(inputs.target, {"exporter": "none (ONNX source with "
                                                            "external data, inlined)"})
        exported = export_to_onnx(source.program, source.kind, inputs.spec, inputs.example,
                                  source.output_names, inputs.target, inputs.opset)
        return ExportOutput(exported.path, {"exporter": exported.exporter,
                                            "opset": exported.opset, **exported.parity})

    def apply(self, state: ConversionState, output: ExportOutput) -> ConversionState:
        return replace(state, exported=output.path, export_info=output.info)

    def summary(self, output: ExportOutput) -> str:
        return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                         for k, v in output.info.items())


@dataclass(frozen=True)
class CheckInputs:
    exported: Path
    spec: InputSpec
    example: dict[str, np.ndarray]
    workdir: Path
    limits: RuntimeLimits
    source_name: str  # what the owner calls the model, for messages


@dataclass(frozen=True)
class CheckOutput:
    model: Path
    facts: graph.ModelFacts
    notes: tuple[str, ...]
    encoder: bool


class CheckModel(Step[CheckInputs, CheckOutput]):
    name, title = "check", "Check and optimise the graph"

    def inputs(self, state: ConversionState) -> CheckInputs:
        return CheckInputs(state.require(state.exported, "exported model"),
                           state.require(state.spec, "input spec"),
                           example_batch(state), state.workdir,
                           limits_for(state.request.target),
                           Path(state.request.source).name)

    def run(self, inputs: CheckInputs, ctx: StepContext) -> CheckOutput:
        model = graph.load_onnx(inputs.exported)
        current = inputs.exported
        compatible = make_compatible(model, inputs.limits, inputs.source_name)
        notes = list(compatible.notes)
        if compatible.notes:
            model, current = compatible.model, inputs.workdir / "compatible.onnx"
            graph.save_onnx(model, current)
        graph.check(model, current, inputs.source_name)
        check_spec_matches(inputs.spec, spec_from_onnx(model))
        upgraded, note = graph.upgrade_opset(model)
        if note:
            notes.append(note)
            current = inputs.workdir / "upgraded.onnx"
            onnx.save(upgraded, str(current))
        ctx.report(0.5, "simplifying")
        simplified, note = graph.simplify(current, inputs.workdir / "checked.onnx", inputs.example)
        notes.append(note)
        final = onnx.load(str(simplified))
        return CheckOutput(simplified, graph.facts(final, simplified), tuple(notes),
                           is_transformer_encoder(final, inputs.spec))

    def apply(self, state: ConversionState, output: CheckOutput) -> ConversionState:
        return replace(state, model=output.model, facts=output.facts,
                       notes=state.notes + output.notes, encoder=output.encoder)

    def summary(self, output: CheckOutput) -> str:
        f = output.facts
        return f"opsets {dict(f.opsets)}, {f.parameters:,} parameters, " \
            f"{f.size_bytes / 1e6:.1f} MB, {f.nodes} nodes"


@dataclass(frozen=True)
class SyntheticInputs:
    model: Path  # the checked graph: which inputs index an embedding table
    spec: InputSpec
    preprocessing: ImagePreprocessing | None
    limit: int | None


class SynthesizeEvaluation(Step[SyntheticInputs, SampleSet]):
    """In the pipeline only when no evaluation set was given (FP32/FP16)."""

    name, title = "synthetic", "Draw synthetic evaluation inputs"

    def inputs(self, state: ConversionState) -> SyntheticInputs:
        r = state.request
        return SyntheticInputs(state.require(state.model, "checked model"),
                               state.require(state.spec, "input spec"), r.preprocessing,
                               r.max_evaluation_samples)

    def run(self, inputs: SyntheticInputs, ctx: StepContext) -> SampleSet:
        rows = embedding_rows(onnx.load(str(inputs.model), load_external_data=False))
        return synthetic_set(inputs.spec, inputs.preprocessing, rows, inputs.limit)

    def apply(self, state: ConversionState, output: SampleSet) -> ConversionState:
        return replace(state, evaluation=output)

    def summary(self, output: SampleSet) -> str:
        assert output.synthetic is not None
        return f"{len(output)} samples, seed {output.synthetic.seed}: " + "; ".join(
            r.describe() for r in output.synthetic.ranges)


@dataclass(frozen=True)
class ReferenceInputs:
    model: Path
    evaluation: SampleSet
    task: Task
    runtime: RuntimeSettings


@dataclass(frozen=True)
class ReferenceOutput:
    batches: tuple[dict[str, np.ndarray], ...]
    primary_output: str
    classify: bool


class ComputeReference(Step[ReferenceInputs, ReferenceOutput]):
    name, title = "reference", "FP32 reference outputs"

    def inputs(self, state: ConversionState) -> ReferenceInputs:
        return ReferenceInputs(state.require(state.model, "checked model"),
                               state.require(state.evaluation, "evaluation set"),
                               state.request.task,
                               RuntimeSettings(intra_op_threads=state.request.intra_op_threads,
                                               providers=providers_for(state.request.target)))

    def run(self, inputs: ReferenceInputs, ctx: StepContext) -> ReferenceOutput:
        session = open_session(inputs.model, inputs.runtime)
        batches = tuple(run_batches(session, inputs.evaluation))
        primary = session.get_outputs()[0].name
        classify = inputs.task == "classification" or (
            inputs.task == "auto" and looks_like_classifier(batches, primary))
        return ReferenceOutput(batches, primary, classify)

    def apply(self, state: ConversionState, output: ReferenceOutput) -> ConversionState:
        return replace(state, reference=output.batches, primary_output=output.primary_output,
                       classify=output.classify)

    def summary(self, output: ReferenceOutput) -> str:
        kind = "classifier (top-1/top-5 agreement)" if output.classify else "cosine agreement"
        return f"primary output {output.primary_output!r}: {kind}"
