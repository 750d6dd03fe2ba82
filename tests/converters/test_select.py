"""Selection and serving policy: pure functions over measurements."""

from __future__ import annotations

import numpy as np
import pytest

from converters.metrics import Accuracy, AccuracyBudget, evaluate
from converters.profile import BatchTiming, VariantProfile
from converters.select import (
    Candidate,
    NoVariantWithinBudget,
    select_variant,
    serving_plan,
)


def _profile(name: str, per_item_ms: float) -> VariantProfile:
    timings = tuple(BatchTiming(b, per_item_ms * b, per_item_ms * b * 1.5, 1000 / per_item_ms)
                    for b in (1, 2, 4))
    return VariantProfile(name, "CPUExecutionProvider", timings)


def _accuracy(disagree: int) -> Accuracy:
    reference = np.eye(10, dtype=np.float32)
    candidate = reference.copy()
    candidate[:disagree] = np.roll(candidate[:disagree], 1, axis=1)
    return evaluate([{"y": reference}], [{"y": candidate}], "y", classify=True)


def test_select_variant_picks_fastest_within_budget_when_faster_one_misses_it() -> None:
    candidates = [
        Candidate("fp32", "fp32", True, _accuracy(0), _profile("fp32", 10.0)),
        Candidate("fp16", "fp16", True, _accuracy(0), _profile("fp16", 20.0)),
        Candidate("int8", "int8", True, _accuracy(3), _profile("int8", 5.0)),
    ]
    selection = select_variant(candidates, AccuracyBudget(max_top1_drop=0.1, min_cosine=None))
    assert selection.chosen == "fp32"
    assert selection.verdict("int8").reason == \
        "outside the accuracy budget: top-1 disagreement 30.00% > 10.00%"
    assert selection.verdict("fp16").reason.startswith("slower: 0.50x the throughput of fp32")
    assert selection.verdict("fp32").reason == "fastest within the budget: 2.00x the " \
        "throughput of fp16"


def test_select_variant_explains_failures_when_variant_did_not_build() -> None:
    candidates = [
        Candidate("fp32", "fp32", False, _accuracy(0), _profile("fp32", 10.0)),
        Candidate("int8", "int8", True, None, None, failure="INT8 rejected: too lossy"),
    ]
    with pytest.raises(NoVariantWithinBudget, match="int8: INT8 rejected: too lossy"):
        select_variant(candidates, AccuracyBudget())


def test_serving_plan_fits_batch_and_delay_to_latency_budget_when_given() -> None:
    plan = serving_plan(_profile("int8", 5.0), latency_budget_ms=16.0)
    # p99 = 7.5 ms * batch: batch 2 (15 ms) fits, batch 4 (30 ms) does not
    assert plan.max_batch_size == 2
    assert plan.max_queue_delay_us == 1000  # what is left of the budget (1 ms) < p50 (10 ms)
    assert plan.warmup_batch_sizes == (1, 2)


def test_serving_plan_disables_batching_when_batch_one_exceeds_budget() -> None:
    plan = serving_plan(_profile("fp32", 50.0), latency_budget_ms=10.0)
    assert (plan.max_batch_size, plan.max_queue_delay_us) == (1, 0)
    assert "exceeds" in plan.reason


def test_serving_plan_uses_all_batches_when_no_budget() -> None:
    plan = serving_plan(_profile("fp32", 2.0), latency_budget_ms=None)
    assert plan.max_batch_size == 4 and plan.max_queue_delay_us == 2000
