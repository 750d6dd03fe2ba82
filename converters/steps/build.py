"""Build each variant, verify it against the FP32 reference, repair INT8 that misses.

Building and repairing are per variant and not fatal: a variant that cannot be built or
repaired leaves the running with its reason, the others go on.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from converters import quantize, repair
from converters.datasets import SampleSet
from converters.errors import StepSkipped
from converters.metrics import Accuracy, AccuracyBudget, evaluate
from converters.runtime import RuntimeSettings, open_session, providers_for, run_batches
from converters.steps.base import ConversionState, Step, StepContext
from converters.variants import Variant, VariantPlan, runtime_for


def base_runtime(state: ConversionState) -> RuntimeSettings:
    r = state.request
    return RuntimeSettings(intra_op_threads=r.intra_op_threads,
                           providers=providers_for(r.target))


@dataclass(frozen=True)
class PrepareInputs:
    model: Path
    target: Path


class PrepareQuantization(Step[PrepareInputs, Path]):
    """Symbolic shape inference + basic optimisations; INT8 falls back to the checked
    model when this fails (ONNX Runtime quantizes it, with less fusion)."""

    name, title = "prepare-int8", "Prepare for quantization"
    fatal = False

    def inputs(self, state: ConversionState) -> PrepareInputs:
        if "int8" not in state.request.precisions:
            raise StepSkipped("no INT8 requested")
        return PrepareInputs(state.require(state.model, "checked model"),
                             state.workdir / "prepared.onnx")

    def run(self, inputs: PrepareInputs, ctx: StepContext) -> Path:
        return quantize.prepare_for_quantization(inputs.model, inputs.target)

    def apply(self, state: ConversionState, output: Path) -> ConversionState:
        return replace(state, prepared=output)

    def on_failure(self, state: ConversionState, reason: str) -> ConversionState:
        return replace(state, notes=(*state.notes, f"quantization pre-processing failed, "
                                                   f"INT8 built from the checked model: {reason}"))


@dataclass(frozen=True)
class BuildInputs:
    plan: VariantPlan
    model: Path
    prepared: Path | None
    calibration: SampleSet | None
    runtime: RuntimeSettings
    target: Path


@dataclass(frozen=True)
class BuildOutput:
    variant: Variant
    quantizer: quantize.StaticQuantizer | None = None


class BuildVariant(Step[BuildInputs, BuildOutput]):
    name, title = "build", "Build variant"
    fatal = False

    def __init__(self, plan: VariantPlan) -> None:
        self.plan = plan

    @property
    def label(self) -> str:
        return f"build-{self.plan.name}"

    def inputs(self, state: ConversionState) -> BuildInputs:
        if self.plan.kind == "int8-dynamic" and not state.encoder:
            raise StepSkipped("not a transformer encoder: static INT8 only")
        return BuildInputs(self.plan, state.require(state.model, "checked model"),
                           state.prepared, state.calibration, base_runtime(state),
                           state.workdir / f"{self.plan.name}.onnx")

    def run(self, inputs: BuildInputs, ctx: StepContext) -> BuildOutput:
        plan = inputs.plan
        if plan.kind == "fp32":
            shutil.copy2(inputs.model, inputs.target)
            return BuildOutput(Variant(plan, inputs.target, inputs.runtime))
        if plan.kind == "fp16":
            quantize.to_fp16(inputs.model, inputs.target)
            return BuildOutput(Variant(plan, inputs.target, inputs.runtime))
        prepared = inputs.prepared or inputs.model
        if plan.kind == "int8-dynamic":
            assert plan.dynamic is not None
            quantize.quantize_dynamic(prepared, inputs.target, plan.dynamic)
            return BuildOutput(Variant(plan, inputs.target, inputs.runtime))
        assert plan.static is not None and inputs.calibration is not None
        ctx.report(None, f"calibrating on {len(inputs.calibration)} samples "
                         f"({plan.static.calibration})")
        quantizer = quantize.StaticQuantizer.calibrate(prepared, inputs.calibration, plan.static)
        ctx.report(None, "quantizing")
        onnx.save(quantizer.quantize(), str(inputs.target))
        notes = (quantizer.describe_choice(),) if quantizer.choice else ()
        return BuildOutput(Variant(plan, inputs.target, inputs.runtime, notes=notes), quantizer)

    def apply(self, state: ConversionState, output: BuildOutput) -> ConversionState:
        quantizers = dict(state.quantizers)
        if output.quantizer is not None:
            quantizers[self.plan.name] = output.quantizer
        return replace(state, variants={**state.variants, self.plan.name: output.variant},
                       quantizers=quantizers)

    def summary(self, output: BuildOutput) -> str:
        return f"{output.variant.plan.describe()}, {output.variant.size_bytes / 1e6:.1f} MB"

    def on_failure(self, state: ConversionState, reason: str) -> ConversionState:
        return replace(state, failures={**state.failures,
                                        self.plan.name: f"failed to build: {reason}"})


@dataclass(frozen=True)
class VerifyInputs:
    variants: Mapping[str, Variant]
    reference: tuple[Mapping[str, np.ndarray], ...]
    evaluation: SampleSet
    primary_output: str
    classify: bool


@dataclass(frozen=True)
class VerifyOutput:
    accuracy: Mapping[str, Accuracy]
    failures: Mapping[str, str]


def measure(variant_path: Path, runtime: RuntimeSettings, inputs: VerifyInputs) -> Accuracy:
    session = open_session(variant_path, runtime)
    outputs = run_batches(session, inputs.evaluation, outputs=list(inputs.reference[0]))
    return evaluate(inputs.reference, outputs, inputs.primary_output, inputs.classify,
                    inputs.evaluation.labels)


class VerifyVariants(Step[VerifyInputs, VerifyOutput]):
    name, title = "verify", "Verify against FP32 on the evaluation set"

    def inputs(self, state: ConversionState) -> VerifyInputs:
        return VerifyInputs(state.variants, state.reference,
                            state.require(state.evaluation, "evaluation set"),
                            state.primary_output, state.classify)

    def run(self, inputs: VerifyInputs, ctx: StepContext) -> VerifyOutput:
        accuracy, failures = {}, {}
        for index, (name, variant) in enumerate(inputs.variants.items()):
            ctx.report(index / len(inputs.variants), name)
            try:
                accuracy[name] = measure(variant.path, variant.runtime, inputs)
            except Exception as exc:  # noqa: BLE001 - ORT run errors end this variant only
                failures[name] = f"failed to run: {type(exc).__name__}: {exc}"
        return VerifyOutput(accuracy, failures)

    def apply(self, state: ConversionState, output: VerifyOutput) -> ConversionState:
        return replace(state, accuracy={**state.accuracy, **output.accuracy},
                       failures={**state.failures, **output.failures})

    def summary(self, output: VerifyOutput) -> str:
        parts = []
        for name, acc in output.accuracy.items():
            top1 = f", top-1 {acc.classification.top1:.3f}" if acc.classification else ""
            parts.append(f"{name}: cosine {acc.cosine:.4f}{top1}")
        return "; ".join(parts)


@dataclass(frozen=True)
class RepairInputs:
    plan: VariantPlan
    variant: Variant
    quantizer: quantize.StaticQuantizer | None
    prepared: Path
    sensitivity: SampleSet
    verify: VerifyInputs
    budget: AccuracyBudget
    runtime: RuntimeSettings
    max_float_fraction: float
    target: Path


@dataclass(frozen=True)
class RepairOutput:
    outcome: repair.RepairOutcome
    variant: Variant | None
    accuracy: Accuracy | None


class RepairVariant(Step[RepairInputs, RepairOutput]):
    name, title = "repair", "Accuracy repair"
    fatal = False

    def __init__(self, plan: VariantPlan) -> None:
        self.plan = plan

    @property
    def label(self) -> str:
        return f"repair-{self.plan.name}"

    def inputs(self, state: ConversionState) -> RepairInputs:
        r = state.request
        name = self.plan.name
        variant, accuracy = state.variants.get(name), state.accuracy.get(name)
        if variant is None or accuracy is None:
            raise StepSkipped(f"{name} was not built or verified")
        if r.budget.met_by(accuracy):
            raise StepSkipped(f"{name} already meets the budget")
        covered = [other for other, v in state.variants.items()
                   if other != name and v.precision == self.plan.precision
                   and other not in state.failures and other in state.accuracy
                   and r.budget.met_by(state.accuracy[other])]
        if covered:
            raise StepSkipped(f"{covered[0]} already meets the budget at {self.plan.precision}")
        if not r.repair:
            raise StepSkipped("repair disabled")
        calibration: SampleSet = state.require(state.calibration, "calibration set")
        return RepairInputs(
            self.plan, variant, state.quantizers.get(name),
            state.prepared or state.require(state.model, "checked model"),
            calibration.strided(r.sensitivity_samples),
            VerifyInputs({}, state.reference, state.require(state.evaluation, "evaluation"),
                         state.primary_output, state.classify),
            r.budget, base_runtime(state), r.max_float_fraction,
            state.workdir / f"{name}.repaired.onnx",
        )

    def run(self, inputs: RepairInputs, ctx: StepContext) -> RepairOutput:
        ctx.report(0.0, "measuring per-layer sensitivity")
        ranking = self._ranking(inputs, ctx)
        trial = inputs.target.with_suffix(".trial.onnx")

        def build_and_measure(float_nodes: tuple[str, ...]) -> tuple[Any, Accuracy]:
            runtime = runtime_for(inputs.plan, inputs.runtime, float_nodes)
            self._build(inputs, float_nodes, trial)
            return runtime, measure(trial, runtime, inputs.verify)

        outcome = repair.greedy_repair(
            ranking, build_and_measure, inputs.budget, inputs.max_float_fraction,
            progress=lambda detail: ctx.report(None, detail),
        )
        if not outcome.accepted:
            return RepairOutput(outcome, None, None)
        # the trial file holds whatever bisection tried last: rebuild the accepted set
        self._build(inputs, outcome.float_nodes, inputs.target)
        runtime, accuracy = outcome.result
        variant = Variant(inputs.plan, inputs.target, runtime, outcome.float_nodes,
                          (outcome.reason,))
        return RepairOutput(outcome, variant, accuracy)

    def _ranking(self, inputs: RepairInputs, ctx: StepContext) -> list[repair.LayerSensitivity]:
        if inputs.plan.kind == "int8-dynamic":
            assert inputs.plan.dynamic is not None
            return repair.dynamic_sensitivity(onnx.load(str(inputs.prepared)),
                                              inputs.sensitivity,
                                              inputs.plan.dynamic.per_channel, inputs.runtime)
        if inputs.quantizer is None:
            raise StepSkipped(f"{inputs.plan.name} has no calibrated quantizer")
        return repair.static_sensitivity(
            inputs.quantizer.base_model(), inputs.quantizer.quantize_keep_activations(),
            inputs.sensitivity, inputs.runtime,
            progress=lambda f: ctx.report(f, "measuring per-layer sensitivity"),
        )

    def _build(self, inputs: RepairInputs, float_nodes: tuple[str, ...], target: Path) -> None:
        if inputs.plan.kind == "int8-dynamic":
            assert inputs.plan.dynamic is not None
            recipe = replace(inputs.plan.dynamic, float_nodes=float_nodes)
            quantize.quantize_dynamic(inputs.prepared, target, recipe)
        else:
            assert inputs.quantizer is not None
            onnx.save(inputs.quantizer.quantize(float_nodes), str(target))

    def apply(self, state: ConversionState, output: RepairOutput) -> ConversionState:
        name = self.plan.name
        state = replace(state, repairs={**state.repairs, name: output.outcome})
        if output.variant is None or output.accuracy is None:
            return replace(state, failures={**state.failures, name: output.outcome.reason})
        return replace(state, variants={**state.variants, name: output.variant},
                       accuracy={**state.accuracy, name: output.accuracy})

    def summary(self, output: RepairOutput) -> str:
        return output.outcome.reason
