"""How far a variant's outputs stray from the FP32 reference, and whether that fits a budget.

Per output: max absolute error, max relative error (relative to each sample's largest
reference magnitude, so near-zero elements do not explode it), and cosine similarity per
sample (mean and min). For classifiers: top-1 agreement (same arg-max), top-5 agreement
(reference top-1 within the candidate's top 5) and, with labels, the accuracy drop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from converters.errors import InvalidRequest

Batches = Sequence[Mapping[str, np.ndarray]]


@dataclass(frozen=True)
class OutputComparison:
    max_abs_err: float
    max_rel_err: float
    mean_cosine: float
    min_cosine: float
    nonfinite_samples: int = 0  # candidate rows with NaN/Inf (scored as cosine 0)


# FP32's own top-2 softmax margin below which its top-1 is a near coin-flip
UNDECIDED_MARGIN = 0.05


@dataclass(frozen=True)
class Agreement:
    top1: float
    top5: float
    top1_drop: float  # labelled: accuracy(ref) - accuracy(candidate); else 1 - top1
    reference_accuracy: float | None = None
    candidate_accuracy: float | None = None
    flips: int = 0  # samples whose top-1 changed
    undecided_flips: int = 0  # ... where FP32's top-2 margin < UNDECIDED_MARGIN
    decided_top1: float = 1.0  # agreement on the samples FP32 decides clearly


@dataclass(frozen=True)
class Accuracy:
    """A variant against the FP32 reference on the evaluation set."""

    samples: int
    outputs: Mapping[str, OutputComparison]
    primary_output: str
    classification: Agreement | None = None

    @property
    def cosine(self) -> float:
        return self.outputs[self.primary_output].mean_cosine

    @property
    def top1_drop(self) -> float | None:
        return self.classification.top1_drop if self.classification else None


@dataclass(frozen=True)
class AccuracyBudget:
    """``max_top1_drop`` applies to classifiers; ``min_cosine`` bounds the mean cosine
    similarity of the primary output over the evaluation set."""

    max_top1_drop: float | None = 0.01
    min_cosine: float | None = 0.99

    def __post_init__(self) -> None:
        for name, low, high in (("max_top1_drop", 0.0, 1.0), ("min_cosine", -1.0, 1.0)):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) \
                    or not low <= value <= high:
                raise InvalidRequest(f"{name} must be a number from {low:g} to {high:g}, "
                                     f"not {value!r}")

    @classmethod
    def from_mapping(cls, item: Mapping[str, object]) -> AccuracyBudget:
        """The JSON form (an upload's spec): a limit left out is no limit, not this
        class's default, and at least one is given."""
        if not isinstance(item, Mapping):
            raise InvalidRequest(f"an accuracy budget is an object, not {item!r}")
        unknown = sorted(set(item) - {"max_top1_drop", "min_cosine"})
        if unknown:
            raise InvalidRequest(f"accuracy budget has unknown fields {unknown} (it takes "
                                 "max_top1_drop and min_cosine)")
        if item.get("max_top1_drop") is None and item.get("min_cosine") is None:
            raise InvalidRequest("an accuracy budget gives max_top1_drop and/or min_cosine")
        return cls(item.get("max_top1_drop"), item.get("min_cosine"))  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, float | None]:
        return {"max_top1_drop": self.max_top1_drop, "min_cosine": self.min_cosine}

    def violations(self, accuracy: Accuracy) -> list[str]:
        problems = []
        broken = sum(o.nonfinite_samples for o in accuracy.outputs.values())
        if broken:
            problems.append(f"{broken} output rows hold NaN/Inf")
        drop = accuracy.top1_drop
        if self.max_top1_drop is not None and drop is not None and drop > self.max_top1_drop:
            what = "accuracy drop" if accuracy.classification and \
                accuracy.classification.reference_accuracy is not None else "disagreement"
            problems.append(f"top-1 {what} {drop:.2%} > {self.max_top1_drop:.2%}")
        if self.min_cosine is not None and accuracy.cosine < self.min_cosine:
            problems.append(f"cosine {accuracy.cosine:.4f} < {self.min_cosine:.4f}")
        return problems

    def met_by(self, accuracy: Accuracy) -> bool:
        return not self.violations(accuracy)

    def shortfall(self, accuracy: Accuracy) -> float:
        """How far outside the budget, each limit relative to its own slack (0 = met)."""
        gap = 0.0
        drop = accuracy.top1_drop
        if self.max_top1_drop is not None and drop is not None:
            gap += max(0.0, drop - self.max_top1_drop) / max(self.max_top1_drop, 1e-3)
        if self.min_cosine is not None:
            gap += max(0.0, self.min_cosine - accuracy.cosine) / max(1 - self.min_cosine, 1e-6)
        return gap


def compare_outputs(reference: np.ndarray, candidate: np.ndarray) -> OutputComparison:
    """Both arrays ``[batch, ...]``; statistics over samples (axis 0)."""
    return compare_rows(_rows(reference), _rows(candidate))


def compare_rows(
    reference: Sequence[np.ndarray], candidate: Sequence[np.ndarray]
) -> OutputComparison:
    abs_err, rel_err, cosines, nonfinite = 0.0, 0.0, [], 0
    for ref, got in zip(reference, candidate, strict=True):
        ref64, got64 = ref.astype(np.float64), got.astype(np.float64)
        if not np.all(np.isfinite(got64)):  # e.g. FP16 overflow: never "within budget"
            nonfinite += 1
            cosines.append(0.0)
            continue
        diff = float(np.max(np.abs(ref64 - got64))) if ref64.size else 0.0
        scale = float(np.max(np.abs(ref64))) if ref64.size else 0.0
        abs_err = max(abs_err, diff)
        rel_err = max(rel_err, diff / max(scale, 1e-12))
        cosines.append(_cosine(ref64, got64))
    return OutputComparison(
        max_abs_err=abs_err,
        max_rel_err=rel_err,
        mean_cosine=float(np.mean(cosines)) if cosines else 1.0,
        min_cosine=float(np.min(cosines)) if cosines else 1.0,
        nonfinite_samples=nonfinite,
    )


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 and nb == 0.0:
        return 1.0
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(np.dot(a, b) / (na * nb))


def _rows(array: np.ndarray) -> list[np.ndarray]:
    array = np.asarray(array)
    if array.ndim == 0:
        return [array.reshape(1)]
    return list(array.reshape(array.shape[0], -1))


def agreement(
    reference: np.ndarray, candidate: np.ndarray, labels: Sequence[int] | None = None
) -> Agreement:
    """``reference``/``candidate``: ``[n, classes]`` scores."""
    ref_top1 = reference.argmax(axis=1)
    cand_top1 = candidate.argmax(axis=1)
    k = min(5, candidate.shape[1])
    cand_top5 = np.argpartition(-candidate, k - 1, axis=1)[:, :k]
    same = ref_top1 == cand_top1
    top1 = float(np.mean(same))
    top5 = float(np.mean([r in row for r, row in zip(ref_top1, cand_top5, strict=True)]))
    undecided = _margins(reference) < UNDECIDED_MARGIN
    flips = int(np.sum(~same))
    undecided_flips = int(np.sum(~same & undecided))
    decided = float(np.mean(same[~undecided])) if np.any(~undecided) else 1.0
    if labels is not None and len(labels) == len(ref_top1):
        truth = np.asarray(labels)
        ref_acc = float(np.mean(ref_top1 == truth))
        cand_acc = float(np.mean(cand_top1 == truth))
        return Agreement(top1, top5, ref_acc - cand_acc, ref_acc, cand_acc, flips,
                         undecided_flips, decided)
    return Agreement(top1, top5, 1.0 - top1, None, None, flips, undecided_flips, decided)


def _margins(scores: np.ndarray) -> np.ndarray:
    """Top-1 minus top-2 softmax probability per sample."""
    shifted = scores.astype(np.float64) - scores.max(axis=1, keepdims=True)
    probs = np.exp(shifted)
    probs /= probs.sum(axis=1, keepdims=True)
    top2 = np.sort(probs, axis=1)[:, -2:]
    return top2[:, 1] - top2[:, 0]


def looks_like_classifier(batches: Batches, output: str) -> bool:
    """Scores over >= 10 classes that are not unit-norm embeddings."""
    first = batches[0][output]
    if first.ndim != 2 or first.shape[1] < 10 or not np.issubdtype(first.dtype, np.floating):
        return False
    norms = np.linalg.norm(first.astype(np.float64), axis=1)
    return not bool(np.allclose(norms, 1.0, atol=1e-3))


def evaluate(
    reference: Batches,
    candidate: Batches,
    primary_output: str,
    classify: bool,
    labels: Sequence[int] | None = None,
) -> Accuracy:
    """Compare per output over all batches (batches may differ in non-batch shapes)."""
    names = list(reference[0])
    outputs = {}
    for name in names:
        ref_rows = [r for batch in reference for r in _rows(batch[name])]
        cand_rows = [r for batch in candidate for r in _rows(batch[name])]
        outputs[name] = compare_rows(ref_rows, cand_rows)
    samples = sum(len(_rows(batch[names[0]])) for batch in reference)
    classification = None
    if classify:
        ref = np.concatenate([b[primary_output] for b in reference])
        cand = np.concatenate([b[primary_output] for b in candidate])
        classification = agreement(ref, cand, labels)
    return Accuracy(samples, outputs, primary_output, classification)
