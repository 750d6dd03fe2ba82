"""Accuracy metrics against the FP32 reference, and the budget's verdicts."""

from __future__ import annotations

import numpy as np
import pytest

from converters.errors import InvalidRequest
from converters.metrics import AccuracyBudget, agreement, compare_outputs, evaluate


def test_compare_outputs_reports_errors_and_cosine_when_outputs_differ() -> None:
    reference = np.array([[1.0, 0.0], [0.0, 2.0]], np.float32)
    candidate = np.array([[1.0, 0.1], [0.0, -2.0]], np.float32)
    stats = compare_outputs(reference, candidate)
    assert stats.max_abs_err == pytest.approx(4.0)
    assert stats.max_rel_err == pytest.approx(2.0)  # relative to the sample's peak |ref|
    assert stats.min_cosine == pytest.approx(-1.0)
    assert stats.mean_cosine == pytest.approx((0.995037 - 1.0) / 2, abs=1e-5)


def test_agreement_counts_top1_and_top5_when_candidate_reorders_classes() -> None:
    reference = np.eye(10, dtype=np.float32)[:4] * 5
    candidate = reference.copy()
    candidate[0, 3] = 9  # sample 0: top-1 moves, reference class still in top-5
    result = agreement(reference, candidate)
    assert result.top1 == pytest.approx(0.75)
    assert result.top5 == pytest.approx(1.0)
    assert result.top1_drop == pytest.approx(0.25)
    assert result.reference_accuracy is None


def test_agreement_measures_accuracy_drop_when_labels_given() -> None:
    reference = np.eye(10, dtype=np.float32)[:4]
    candidate = reference.copy()
    candidate[1] = np.eye(10)[7]
    result = agreement(reference, candidate, labels=[0, 1, 9, 3])  # ref 3/4 right
    assert result.reference_accuracy == pytest.approx(0.75)
    assert result.candidate_accuracy == pytest.approx(0.5)
    assert result.top1_drop == pytest.approx(0.25)


def test_budget_lists_each_violation_when_accuracy_misses_it() -> None:
    reference = [{"y": np.eye(10, dtype=np.float32)[:4]}]
    candidate = [{"y": np.roll(np.eye(10, dtype=np.float32)[:4], 1, axis=1)}]
    accuracy = evaluate(reference, candidate, "y", classify=True)
    problems = AccuracyBudget(max_top1_drop=0.01, min_cosine=0.99).violations(accuracy)
    assert problems == ["top-1 disagreement 100.00% > 1.00%", "cosine 0.0000 < 0.9900"]
    assert AccuracyBudget(None, None).met_by(accuracy)


def test_evaluate_compares_batches_of_different_shapes_when_sequence_varies() -> None:
    reference = [{"h": np.ones((2, 3, 4), np.float32)}, {"h": np.ones((2, 5, 4), np.float32)}]
    candidate = [{"h": np.ones((2, 3, 4), np.float32)}, {"h": -np.ones((2, 5, 4), np.float32)}]
    accuracy = evaluate(reference, candidate, "h", classify=False)
    assert accuracy.samples == 4
    assert accuracy.cosine == pytest.approx(0.0)
    assert accuracy.classification is None


def test_agreement_counts_flips_on_undecided_samples_when_fp32_margin_is_tiny() -> None:
    reference = np.zeros((3, 10), np.float32)
    reference[0, 1], reference[0, 2] = 5.0, 4.99  # a near tie: FP32 barely decides
    reference[1, 3] = 5.0
    reference[2, 4] = 5.0
    candidate = reference.copy()
    candidate[0, 2] = 5.01  # the tie tips over
    candidate[1, 3], candidate[1, 6] = 0.0, 6.0  # a clear answer changes
    result = agreement(reference, candidate)
    assert (result.flips, result.undecided_flips) == (2, 1)
    assert result.decided_top1 == pytest.approx(0.5)


def test_budget_rejects_nan_outputs_when_candidate_overflows() -> None:
    reference = [{"y": np.ones((2, 4), np.float32)}]
    candidate = [{"y": np.array([[1, 1, 1, 1], [np.nan, 1, 1, 1]], np.float32)}]
    accuracy = evaluate(reference, candidate, "y", classify=False)
    assert accuracy.outputs["y"].nonfinite_samples == 1
    assert AccuracyBudget(None, None).violations(accuracy) == ["1 output rows hold NaN/Inf"]


def test_budget_json_form_leaves_out_what_is_not_given_and_checks_ranges() -> None:
    assert AccuracyBudget.from_mapping({"min_cosine": 0.98}) == AccuracyBudget(None, 0.98)
    assert AccuracyBudget.from_mapping(AccuracyBudget(0.02, None).to_dict()) == \
        AccuracyBudget(0.02, None)
    for bad, problem in (({}, "max_top1_drop and/or min_cosine"),
                         ({"max_top1_drop": 1.5}, "from 0 to 1"),
                         ({"min_cosine": "high"}, "min_cosine must be a number"),
                         ({"max_top1_drop": 0.1, "top5": 1}, "unknown fields")):
        with pytest.raises(InvalidRequest, match=problem):
            AccuracyBudget.from_mapping(bad)
