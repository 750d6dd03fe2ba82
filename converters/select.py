"""Policy, kept apart from the mechanism: which variant to serve, and how to batch it.

Both are pure functions over measurements, so they are tested without running a model.

- :func:`select_variant`: the fastest variant (geometric-mean throughput over the
  profiled batch sizes) among those within the accuracy budget; every other variant
  gets the reason it lost.
- :func:`serving_plan`: the largest batch whose p99 fits the latency budget, and a
  queue delay that spends what is left of the budget (at most one batch's compute time:
  waiting longer gathers little and only adds latency).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from converters.errors import ConversionError
from converters.metrics import Accuracy, AccuracyBudget
from converters.profile import VariantProfile


@dataclass(frozen=True)
class Candidate:
    name: str
    precision: str
    requested: bool  # False for an FP32 built only as the reference
    accuracy: Accuracy | None  # None for the FP32 reference itself
    profile: VariantProfile | None
    failure: str | None = None  # build/verify/repair failure


@dataclass(frozen=True)
class Verdict:
    variant: str
    chosen: bool
    within_budget: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"variant": self.variant, "chosen": self.chosen,
                "within_budget": self.within_budget, "reason": self.reason}


@dataclass(frozen=True)
class Selection:
    chosen: str
    verdicts: tuple[Verdict, ...]

    def verdict(self, variant: str) -> Verdict:
        return next(v for v in self.verdicts if v.variant == variant)

    def with_chosen(self, variant: str, reason: str) -> Selection:
        """Another within-budget variant won a later measurement (TensorRT engines)."""
        if variant == self.chosen:
            return self
        verdicts = tuple(
            Verdict(v.variant, True, True, reason) if v.variant == variant
            else Verdict(v.variant, False, v.within_budget, f"slower as a TensorRT engine "
                         f"than {variant}") if v.variant == self.chosen
            else v
            for v in self.verdicts
        )
        return Selection(variant, verdicts)


class NoVariantWithinBudget(ConversionError):
    """Every requested variant failed or missed the accuracy budget."""

    action = ("Request another precision (e.g. fp32), loosen the accuracy budget, or give "
              "a calibration set closer to the served data")


def select_variant(candidates: Sequence[Candidate], budget: AccuracyBudget) -> Selection:
    eligible: list[Candidate] = []
    reasons: dict[str, tuple[bool, str]] = {}
    for c in candidates:
        if not c.requested:
            reasons[c.name] = (True, "reference only (not a requested precision)")
        elif c.failure:
            reasons[c.name] = (False, c.failure)
        elif c.accuracy is not None and not budget.met_by(c.accuracy):
            reasons[c.name] = (False, "outside the accuracy budget: "
                               + "; ".join(budget.violations(c.accuracy)))
        elif c.profile is None:
            reasons[c.name] = (True, "not profiled")
        else:
            eligible.append(c)
    if not eligible:
        detail = "; ".join(f"{name}: {why}" for name, (_, why) in reasons.items())
        raise NoVariantWithinBudget(f"no requested variant can be served: {detail}")
    best = max(eligible, key=lambda c: c.profile.speed if c.profile else 0.0)
    assert best.profile is not None
    verdicts = []
    for c in candidates:
        if c is best:
            verdicts.append(Verdict(c.name, True, True, _win_reason(best, eligible)))
        elif c in eligible and c.profile is not None:
            ratio = c.profile.speed / best.profile.speed
            verdicts.append(Verdict(
                c.name, False, True,
                f"slower: {ratio:.2f}x the throughput of {best.name} (within budget)",
            ))
        else:
            within, why = reasons[c.name]
            verdicts.append(Verdict(c.name, False, within, why))
    return Selection(best.name, tuple(verdicts))


def _win_reason(best: Candidate, eligible: Sequence[Candidate]) -> str:
    others = [c for c in eligible if c is not best and c.profile is not None]
    if not others:
        return "the only variant within the budget"
    assert best.profile is not None
    runner_up = max(others, key=lambda c: c.profile.speed if c.profile else 0.0)
    assert runner_up.profile is not None
    return f"fastest within the budget: {best.profile.speed / runner_up.profile.speed:.2f}x " \
        f"the throughput of {runner_up.name}"


@dataclass(frozen=True)
class ServingPlan:
    max_batch_size: int
    max_queue_delay_us: int
    warmup_batch_sizes: tuple[int, ...]
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"max_batch_size": self.max_batch_size,
                "max_queue_delay_us": self.max_queue_delay_us,
                "warmup_batch_sizes": list(self.warmup_batch_sizes), "reason": self.reason}


def serving_plan(profile: VariantProfile, latency_budget_ms: float | None) -> ServingPlan:
    timings = sorted(profile.timings, key=lambda t: t.batch)
    if latency_budget_ms is None:
        largest = timings[-1]
        delay_ms = timings[0].p50_ms
        return ServingPlan(
            largest.batch, int(delay_ms * 1000), tuple(t.batch for t in timings),
            f"no latency budget: batches up to {largest.batch}, queue delay = batch-1 p50 "
            f"({delay_ms:.1f} ms)",
        )
    fitting = [t for t in timings if t.p99_ms <= latency_budget_ms]
    if not fitting:
        first = timings[0]
        return ServingPlan(
            1, 0, (1,),
            f"batch 1 p99 {first.p99_ms:.1f} ms already exceeds the {latency_budget_ms:g} ms "
            "budget: no batching, no queueing",
        )
    chosen = fitting[-1]
    delay_ms = max(0.0, min(latency_budget_ms - chosen.p99_ms, chosen.p50_ms))
    return ServingPlan(
        chosen.batch, int(delay_ms * 1000), tuple(t.batch for t in fitting),
        f"largest batch with p99 <= {latency_budget_ms:g} ms is {chosen.batch} "
        f"(p99 {chosen.p99_ms:.1f} ms); queue delay {delay_ms:.1f} ms",
    )
