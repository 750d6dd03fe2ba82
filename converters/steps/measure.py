"""Profile the variants, choose one within the budget and measure the memory it takes
(TensorRT engines: :mod:`converters.steps.tensorrt`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from converters.datasets import SampleSet
from converters.footprint import Footprint, measure_footprint
from converters.metrics import AccuracyBudget
from converters.profile import (
    ProfileTarget,
    VariantProfile,
    batch_sizes_up_to,
    profile_variants,
)
from converters.runtime import RuntimeSettings
from converters.select import Candidate, Selection, ServingPlan, select_variant, serving_plan
from converters.steps.base import ConversionState, Step, StepContext


@dataclass(frozen=True)
class ProfileInputs:
    targets: tuple[ProfileTarget, ...]
    samples: SampleSet
    batch_sizes: tuple[int, ...]
    iterations: int
    warmup: int


class ProfileVariants(Step[ProfileInputs, Mapping[str, VariantProfile]]):
    name, title = "profile", "Profile latency and throughput"

    def inputs(self, state: ConversionState) -> ProfileInputs:
        r = state.request
        runnable = [v for name, v in state.variants.items()
                    if name in state.accuracy]  # built and ran during verification
        return ProfileInputs(
            tuple(ProfileTarget(v.name, v.path, v.runtime) for v in runnable),
            state.require(state.evaluation, "evaluation set"),
            batch_sizes_up_to(r.max_batch_size), r.profile_iterations, r.profile_warmup,
        )

    def run(self, inputs: ProfileInputs, ctx: StepContext) -> Mapping[str, VariantProfile]:
        return profile_variants(
            inputs.targets, inputs.samples, inputs.batch_sizes, inputs.iterations,
            inputs.warmup, progress=lambda f: ctx.report(f, "interleaved runs"),
        )

    def apply(self, state: ConversionState,
              output: Mapping[str, VariantProfile]) -> ConversionState:
        return replace(state, profiles=output)

    def summary(self, output: Mapping[str, VariantProfile]) -> str:
        return "; ".join(
            f"{name}: b1 p50 {p.timings[0].p50_ms:.1f} ms, "
            f"{p.timings[-1].throughput:.0f}/s at b{p.timings[-1].batch}"
            for name, p in output.items())


@dataclass(frozen=True)
class SelectInputs:
    candidates: tuple[Candidate, ...]
    budget: AccuracyBudget
    latency_budget_ms: float | None


@dataclass(frozen=True)
class SelectOutput:
    selection: Selection
    serving: ServingPlan


def candidates_of(state: ConversionState) -> tuple[Candidate, ...]:
    requested = set(state.request.precisions)
    result = []
    for plan in state.plans:
        if plan.name not in state.variants and plan.name not in state.failures:
            continue  # skipped (does not apply to this model)
        result.append(Candidate(
            plan.name, plan.precision, plan.precision in requested,
            state.accuracy.get(plan.name), state.profiles.get(plan.name),
            state.failures.get(plan.name),
        ))
    return tuple(result)


class SelectVariant(Step[SelectInputs, SelectOutput]):
    name, title = "select", "Choose the variant to serve"

    def inputs(self, state: ConversionState) -> SelectInputs:
        r = state.request
        return SelectInputs(candidates_of(state), r.budget, r.latency_budget_ms)

    def run(self, inputs: SelectInputs, ctx: StepContext) -> SelectOutput:
        selection = select_variant(inputs.candidates, inputs.budget)
        chosen = next(c for c in inputs.candidates if c.name == selection.chosen)
        assert chosen.profile is not None
        return SelectOutput(selection, serving_plan(chosen.profile, inputs.latency_budget_ms))

    def apply(self, state: ConversionState, output: SelectOutput) -> ConversionState:
        return replace(state, selection=output.selection, serving=output.serving)

    def summary(self, output: SelectOutput) -> str:
        chosen = output.selection.verdict(output.selection.chosen)
        return f"{chosen.variant}: {chosen.reason}; {output.serving.reason}"


@dataclass(frozen=True)
class FootprintInputs:
    model: Path
    runtime: RuntimeSettings
    samples: SampleSet
    batch: int


class MeasureFootprint(Step[FootprintInputs, Footprint]):
    """The chosen variant's resident memory at its largest served batch, measured in a
    fresh process (:mod:`converters.footprint`): what the gateway budgets a member's
    memory by. Not fatal: without it the gateway falls back to a configured footprint."""

    name, title = "footprint", "Measure the memory footprint"
    fatal = False

    def inputs(self, state: ConversionState) -> FootprintInputs:
        selection = state.require(state.selection, "selection")
        variant = state.variants[selection.chosen]
        return FootprintInputs(variant.path, variant.runtime,
                               state.require(state.evaluation, "evaluation set"),
                               state.require(state.serving, "serving plan").max_batch_size)

    def run(self, inputs: FootprintInputs, ctx: StepContext) -> Footprint:
        return measure_footprint(inputs.model, inputs.runtime,
                                 inputs.samples.first_batch(inputs.batch))

    def apply(self, state: ConversionState, output: Footprint) -> ConversionState:
        return replace(state, footprint=output)

    def on_failure(self, state: ConversionState, reason: str) -> ConversionState:
        return replace(state, notes=(*state.notes, f"memory footprint not measured: {reason}"))

    def summary(self, output: Footprint) -> str:
        return f"{output.bytes / 2**20:.1f} MiB at batch {output.batch}"
