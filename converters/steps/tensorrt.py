"""TensorRT engines for the variants within budget, built where TensorRT exists and
verified like every other variant; the fastest verified engine is served."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from converters import tensorrt as trt_engines
from converters.datasets import SampleSet
from converters.errors import StepSkipped, TargetUnavailable
from converters.metrics import Accuracy, AccuracyBudget, evaluate
from converters.select import Selection, ServingPlan
from converters.spec import InputSpec
from converters.steps.base import ConversionState, EngineRecord, Step, StepContext
from converters.variants import Variant


@dataclass(frozen=True)
class EngineInputs:
    variants: tuple[Variant, ...]  # within budget, fastest first
    spec: InputSpec
    serving: ServingPlan
    evaluation: SampleSet
    reference: tuple[Mapping[str, np.ndarray], ...]
    primary_output: str
    classify: bool
    budget: AccuracyBudget
    workdir: Path


@dataclass(frozen=True)
class EngineOutput:
    engines: tuple[EngineRecord, ...]
    chosen: str


class BuildEngines(Step[EngineInputs, EngineOutput]):
    """TensorRT FP16/INT8 engines for the variants within budget; the fastest verified
    engine is served. Skipped (never faked) without TensorRT."""

    name, title = "tensorrt", "TensorRT engines"

    def inputs(self, state: ConversionState) -> EngineInputs:
        trt_engines.require_tensorrt()
        target = state.request.target
        if target == "cpu":
            raise StepSkipped("target cpu serves ONNX Runtime on CPU")
        if target == "onnxruntime":
            raise StepSkipped("target onnxruntime: Triton's TensorRT accelerator builds "
                              "engines at load")
        selection: Selection = state.require(state.selection, "selection")
        within = [v for v in selection.verdicts if v.within_budget and v.variant in
                  state.variants and state.variants[v.variant].precision in ("fp16", "int8")]
        names = [selection.chosen] + [v.variant for v in within if v.variant != selection.chosen]
        return EngineInputs(
            tuple(state.variants[n] for n in names if n in state.variants),
            state.require(state.spec, "spec"), state.require(state.serving, "serving plan"),
            state.require(state.evaluation, "evaluation set"), state.reference,
            state.primary_output, state.classify, state.request.budget, state.workdir,
        )

    def run(self, inputs: EngineInputs, ctx: StepContext) -> EngineOutput:
        import tensorrt as trt

        cc = trt_engines.device_compute_capability()
        observed = {t.name: [tuple(s[t.name].shape) for s in inputs.evaluation.samples]
                    for t in inputs.spec.inputs}
        observed = {k: [(1, *shape) for shape in v] for k, v in observed.items()}
        profile = trt_engines.optimization_profile(
            inputs.spec, inputs.serving.max_batch_size,
            max(1, inputs.serving.max_batch_size // 2), observed)
        cache = inputs.workdir / "timing.cache"
        records, speeds = [], {}
        for variant in inputs.variants:
            ctx.report(None, f"building {variant.precision} engine from {variant.name}")
            folder = inputs.workdir / f"trt-{variant.name}"
            folder.mkdir(exist_ok=True)
            plan = folder / trt_engines.engine_filename(cc)
            plan.write_bytes(trt_engines.build_engine(variant.path, variant.precision,
                                                      profile, cache))
            tag = trt_engines.EngineTag(trt.__version__, cc, variant.precision,
                                        profile.to_dict())
            tag.write(plan)
            runner = trt_engines.PycudaRunner(trt_engines.load_engine(plan))
            accuracy, speed = self._verify(runner, inputs)
            if not inputs.budget.met_by(accuracy):
                ctx.log.info("TensorRT %s engine misses the budget: %s", variant.name,
                             inputs.budget.violations(accuracy))
                continue
            records.append(EngineRecord(variant.name, variant.precision, plan,
                                        plan.with_name(plan.name + ".json"), cc,
                                        trt.__version__, accuracy))
            speeds[variant.name] = speed
        if not records:
            raise TargetUnavailable("no TensorRT engine met the accuracy budget")
        chosen = max(records, key=lambda r: speeds[r.variant]).variant
        return EngineOutput(tuple(records), chosen)

    def _verify(self, runner: trt_engines.PycudaRunner,
                inputs: EngineInputs) -> tuple[Accuracy, float]:
        outputs, seconds, count = [], 0.0, 0
        for batch in inputs.evaluation.batches(8):
            start = time.perf_counter()
            result = runner.run(batch)
            seconds += time.perf_counter() - start
            count += len(next(iter(batch.values())))
            outputs.append({k: result[k] for k in inputs.reference[0]})
        accuracy = evaluate(inputs.reference, outputs, inputs.primary_output, inputs.classify,
                            inputs.evaluation.labels)
        return accuracy, count / seconds if seconds else 0.0

    def apply(self, state: ConversionState, output: EngineOutput) -> ConversionState:
        selection: Selection = state.require(state.selection, "selection")
        return replace(state, engines=output.engines, selection=selection.with_chosen(
            output.chosen, "fastest verified TensorRT engine within the budget"))

    def summary(self, output: EngineOutput) -> str:
        return ", ".join(f"{e.variant} ({e.precision}, sm {e.compute_capability})"
                         for e in output.engines) + f"; serving {output.chosen}"
