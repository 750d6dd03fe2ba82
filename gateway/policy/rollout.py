"""Progressive delivery: the rollout policy, the traffic split both data planes apply,
and the verdict at every step. Pure: no I/O, no clock (windows are passed in).

A rollout serves a model's ``stable`` and ``candidate`` versions side by side (both
loaded on every member, Triton's ``version_policy``). Requests that name a version get
it; an *unversioned* request is pinned to the candidate with probability
``percent / 100``, else to stable (:func:`pick`; HAProxy: ``rand(100)`` against the
same percent, maps ``rollout``/``rstable``/``rcand``). Pinning means:

- HTTP: the path becomes ``/v2/models/<m>/versions/<v>/infer`` (both planes; the Python
  plane pins ``generate`` and ``generate_stream`` the same way);
- gRPC: field 2 (``model_version``) is appended to the ``ModelInferRequest`` wire bytes
  (a later occurrence of a singular field wins), see :func:`pin_grpc_version`; each
  request of a ``ModelStreamInfer`` stream is pinned on its own. HAProxy does the
  same bytes itself: its rules draw the version (this module's rule) and a Lua filter
  in the pool backend's pin twin appends the field and raises the length prefix as the
  body streams (``gateway/haproxy/grpc_fields.lua``; ~18 us of HAProxy CPU a pinned
  request, nothing for the others). The control plane's gRPC server still pins what
  HAProxy leaves to it: a body whose ``content-length`` is not its one message's, a
  model under residency no member holds yet (docs/lifecycle.md, docs/haproxy.md;
  ``loadtests/bench_rollout.py`` measures throughput during a rollout against
  without).

At the end of each step of ``step_seconds`` :func:`judge` compares the candidate's
window of answers with stable's over the same window, and the agreement of their
outputs on a replayed sample of the owner's evaluation set: promote, hold (too few
requests) or roll back. A rollback does not wait for the step's end once the candidate
has ``min_requests`` answers that already condemn it.

Before step 1, with the split at 0 %, :func:`judge_side_by_side` judges the candidate
on requests both versions answered: the gate's replayed samples, then the shadow step's
live requests mirrored to the candidate (:class:`Shadow`, its pairs in
:class:`ShadowTally`), so no user is answered by a candidate that either condemns.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from gateway.config.rollout import RolloutSpec

# the p99s are compared once both versions have this many answers: over fewer, a "p99"
# is the maximum, biased high against a version with many more answers (stable)
P99_MIN_ANSWERS = 100


def effective(upload: RolloutSpec | Literal["none"] | None,
              configured: RolloutSpec | Literal["none"] | None) -> RolloutSpec | None:
    """The rollout an upload gets: its own, else the model's configured one; ``none``
    (either way) or nothing: the all-at-once switch."""
    chosen = upload if upload is not None else configured
    return chosen if isinstance(chosen, RolloutSpec) else None


# -- the split ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Split:
    """Unversioned requests of a model during a rollout: ``percent`` to the candidate."""

    stable: int
    candidate: int
    percent: int  # 0..100

    def pick(self, draw: int) -> int:
        """The version for one request, ``draw`` uniform in 0..99 (HAProxy: rand(100))."""
        return self.candidate if draw < self.percent else self.stable


def pin_grpc_version(message: bytes, version: int) -> bytes:
    """A ``ModelInferRequest``'s wire bytes with ``model_version`` set to ``version``:
    field 2 appended (for a singular field the last occurrence wins), nothing decoded."""
    text = str(version).encode()
    return message + bytes((0x12, len(text))) + text  # field 2, wire type 2; len < 128


def http_pinned_path(path: str, version: int) -> str:
    """``/v2/models/<m>/infer`` -> ``/v2/models/<m>/versions/<v>/infer`` (``generate``,
    ``generate_stream`` alike)."""
    head, _, verb = path.rpartition("/")
    return f"{head}/versions/{version}/{verb}"


# -- the verdict --------------------------------------------------------------------------
@dataclass(frozen=True)
class Window:
    """One version's answers to pinned requests over a step's window."""

    requests: int = 0
    errors: int = 0
    p99_s: float | None = None
    p50_s: float | None = None

    @property
    def answered(self) -> int:
        return self.requests - self.errors

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    @classmethod
    def of(cls, answers: Sequence[tuple[bool, float]]) -> Window:
        """From (ok, seconds) pairs; p99 and p50 over the successful answers."""
        times = sorted(s for ok, s in answers if ok)

        def quantile(q: float) -> float | None:
            return times[max(0, math.ceil(q * len(times)) - 1)] if times else None

        return cls(len(answers), sum(1 for ok, _ in answers if not ok), quantile(0.99),
                   quantile(0.5))

    def figures(self) -> dict[str, Any]:
        def ms(seconds: float | None) -> float | None:
            return None if seconds is None else round(seconds * 1e3, 2)

        return {"requests": self.requests, "errors": self.errors,
                "error_rate": round(self.error_rate, 4), "p99_ms": ms(self.p99_s),
                "p50_ms": ms(self.p50_s)}


class Verdict(enum.Enum):
    PROMOTE = "promote"
    HOLD = "hold"
    ROLLBACK = "rollback"


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    reason: str
    figures: dict[str, Any]


def judge(spec: RolloutSpec, stable: Window | None, candidate: Window,
          agreement: float | None, step_over: bool) -> Decision | None:
    """The verdict on a step: ``stable`` is stable's window (None: it had too few
    answers to compare with, e.g. at 100 %); ``agreement`` the replay's (None: not
    measured). None while the step runs and nothing condemns the candidate yet."""
    figures: dict[str, Any] = {"candidate": candidate.figures(),
                               "stable": stable.figures() if stable else None,
                               "agreement": agreement}
    if agreement is not None and agreement < spec.min_agreement:
        return Decision(Verdict.ROLLBACK, f"output agreement with stable {agreement:.3f} is "
                        f"below {spec.min_agreement}", figures)
    if candidate.requests >= max(1, spec.min_requests):
        baseline = stable.error_rate if stable else 0.0
        delta = candidate.error_rate - baseline
        if delta > spec.max_error_rate_delta:
            return Decision(Verdict.ROLLBACK, f"error rate {candidate.error_rate:.3f} against "
                            f"stable's {baseline:.3f} (more than +{spec.max_error_rate_delta})",
                            figures)
        if stable is not None and stable.p99_s and candidate.p99_s is not None and \
                min(stable.answered, candidate.answered) >= P99_MIN_ANSWERS:
            ratio = candidate.p99_s / stable.p99_s
            worse_ms = (candidate.p99_s - stable.p99_s) * 1e3
            figures["p99_ratio"] = round(ratio, 3)
            if ratio > spec.max_p99_ratio and worse_ms > spec.p99_tolerance_ms and \
                    _median_moved(spec, stable, candidate):
                return Decision(Verdict.ROLLBACK, f"p99 {candidate.p99_s * 1e3:.1f} ms is "
                                f"{ratio:.2f}x stable's {stable.p99_s * 1e3:.1f} ms (more "
                                f"than {spec.max_p99_ratio}x)", figures)
    if not step_over:
        return None
    if candidate.requests < spec.min_requests:
        return Decision(Verdict.HOLD, f"{candidate.requests} of {spec.min_requests} candidate "
                        "answers: the step goes on", figures)
    if stable is not None and stable.answered >= P99_MIN_ANSWERS and \
            candidate.answered < P99_MIN_ANSWERS:
        return Decision(Verdict.HOLD, f"{candidate.answered} of {P99_MIN_ANSWERS} candidate "
                        "answers to judge its p99: the step goes on", figures)
    return Decision(Verdict.PROMOTE, "error rate, p99 and agreement within bounds", figures)


def _median_moved(spec: RolloutSpec, stable: Window, candidate: Window) -> bool:
    """A slower version is slower at its median too; a p99 over a few hundred answers
    moves alone on a shared machine's hiccups. The median must be worse by half the
    p99 bound's margins: half its ratio's (1.15x for 1.3x) and half its tolerance
    (2.5 ms for 5 ms). Two versions of the same cost read medians of 1.86 and 2.54 ms
    (1.37x) on a busy machine (the gate's probe, measured), and HAProxy's log rounds to
    whole milliseconds: a ratio alone of medians that small is noise."""
    if not stable.p50_s or candidate.p50_s is None:
        return True
    return candidate.p50_s / stable.p50_s > 1 + (spec.max_p99_ratio - 1) / 2 and \
        (candidate.p50_s - stable.p50_s) * 1e3 > spec.p99_tolerance_ms / 2


def agreement_of(stable: Sequence[np.ndarray], candidate: Sequence[np.ndarray],
                 metric: Literal["top1", "cosine"]) -> float:
    """Per-sample outputs (first output, flattened per sample) of both versions: the
    share of equal top-1 classes, or the mean cosine similarity."""
    if not stable:
        return 1.0
    if metric == "top1":
        same = [int(np.argmax(a)) == int(np.argmax(b)) for a, b in zip(stable, candidate,
                                                                        strict=True)]
        return sum(same) / len(same)
    cosines = []
    for a, b in zip(stable, candidate, strict=True):
        a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
        norm = float(np.linalg.norm(a64) * np.linalg.norm(b64))
        cosines.append(1.0 if norm == 0 and not a64.any() and not b64.any()
                       else float(a64 @ b64) / norm if norm else 0.0)
    return float(np.mean(cosines))


# -- the gate and the shadow step -------------------------------------------------------------
def judge_side_by_side(spec: RolloutSpec, stable: Window, candidate: Window,
                       agreement: float | None, *, min_requests: int, over: bool,
                       final: bool) -> Decision | None:
    """The verdict of the gate (the replayed samples, ``final``) or of the shadow step
    (live requests, each answered by stable for the user and mirrored to the candidate):
    both versions answered the same requests, so their windows compare pair for pair.

    Judged once the candidate has ``min_requests`` answers (a rollback does not wait),
    or at the end (``over``): the agreement against ``min_agreement``; the error rate
    against stable's, ``max_error_rate_delta``; the median, then the p99 (over
    :data:`P99_MIN_ANSWERS` answers each) against ``max_p99_ratio``, worse by more
    than ``p99_tolerance_ms``. Too few answers at the end: hold, or, ``final``,
    promote with the reason saying so (the steps judge it on their own windows)."""
    figures: dict[str, Any] = {"candidate": candidate.figures(), "stable": stable.figures(),
                               "agreement": agreement}
    enough = candidate.requests >= max(1, min_requests)
    if enough or (over and final and candidate.requests):
        if agreement is not None and agreement < spec.min_agreement:
            return Decision(Verdict.ROLLBACK, f"output agreement with stable {agreement:.3f} "
                            f"is below {spec.min_agreement}", figures)
        delta = candidate.error_rate - stable.error_rate
        if delta > spec.max_error_rate_delta:
            return Decision(Verdict.ROLLBACK, f"error rate {candidate.error_rate:.3f} against "
                            f"stable's {stable.error_rate:.3f} on the same requests (more than "
                            f"+{spec.max_error_rate_delta})", figures)
        slower = _slower(spec, stable, candidate, figures)
        if slower is not None:
            return Decision(Verdict.ROLLBACK, slower, figures)
    if not over:
        return None
    if candidate.requests < min_requests:
        if not final:
            return Decision(Verdict.HOLD, f"{candidate.requests} of {min_requests} candidate "
                            "answers: the step goes on", figures)
        return Decision(Verdict.PROMOTE, f"only {candidate.requests} of {min_requests} "
                        "candidate answers, nothing condemns it: the steps judge it", figures)
    return Decision(Verdict.PROMOTE, "error rate, latency and agreement within bounds",
                    figures)


def _slower(spec: RolloutSpec, stable: Window, candidate: Window,
            figures: dict[str, Any]) -> str | None:
    """Why the candidate is too slow on the same requests as stable, or None: its
    median (or, with enough answers, its p99) more than ``max_p99_ratio`` times
    stable's and worse by more than ``p99_tolerance_ms``."""
    if stable.p50_s and candidate.p50_s is not None:
        ratio = candidate.p50_s / stable.p50_s
        figures["p50_ratio"] = round(ratio, 3)
        if ratio > spec.max_p99_ratio and \
                (candidate.p50_s - stable.p50_s) * 1e3 > spec.p99_tolerance_ms:
            return (f"median {candidate.p50_s * 1e3:.1f} ms is {ratio:.2f}x stable's "
                    f"{stable.p50_s * 1e3:.1f} ms on the same requests (more than "
                    f"{spec.max_p99_ratio}x)")
    if stable.p99_s and candidate.p99_s is not None and \
            min(stable.answered, candidate.answered) >= P99_MIN_ANSWERS:
        ratio = candidate.p99_s / stable.p99_s
        figures["p99_ratio"] = round(ratio, 3)
        if ratio > spec.max_p99_ratio and \
                (candidate.p99_s - stable.p99_s) * 1e3 > spec.p99_tolerance_ms and \
                _median_moved(spec, stable, candidate):
            return (f"p99 {candidate.p99_s * 1e3:.1f} ms is {ratio:.2f}x stable's "
                    f"{stable.p99_s * 1e3:.1f} ms on the same requests (more than "
                    f"{spec.max_p99_ratio}x)")
    return None


MIRROR_MAX_IN_FLIGHT = 8
# HAProxy's mark on the requests it sampled for a shadow step (map ``shadow``): the
# forwarder mirrors them without a second draw
SHADOW_HEADER = "x-infergate-shadow"


@dataclass
class ShadowTally:
    """The shadow step's pairs: per mirrored request, stable's answer to the user (ok,
    seconds) and the candidate's (ok, seconds), and their agreement when both answered;
    mirrors skipped (the bound on what is in flight to the candidate was reached)."""

    pairs: list[tuple[bool, float, bool, float, float | None]] = field(default_factory=list)
    skipped: int = 0
    mirrors_in_flight: int = 0  # (not ``in_flight``: that is a member's, written by pools)

    def record(self, stable_ok: bool, stable_s: float, candidate_ok: bool,
               candidate_s: float, agreement: float | None) -> None:
        self.pairs.append((stable_ok, stable_s, candidate_ok, candidate_s, agreement))
        if len(self.pairs) > 100_000:  # unread for long: keep the newest half
            del self.pairs[: len(self.pairs) // 2]

    def clear(self) -> None:
        self.pairs.clear()
        self.skipped = 0

    def take(self) -> tuple[list[tuple[bool, float, bool, float, float | None]], int]:
        """The pairs and skipped mirrors since the last take, and forget them (what a
        data-plane replica reports to the control plane's verdict)."""
        pairs, skipped = self.pairs, self.skipped
        self.pairs, self.skipped = [], 0
        return pairs, skipped

    def merge(self, pairs: list[tuple[bool, float, bool, float, float | None]],
              skipped: int) -> None:
        """A replica's pairs and skipped mirrors (its report), beside this process's."""
        for pair in pairs:
            self.record(*pair)
        self.skipped += skipped

    def windows(self) -> tuple[Window, Window, float | None]:
        """Stable's and the candidate's windows over the mirrored requests, and the
        mean agreement of the pairs both answered (None: none yet)."""
        pairs = list(self.pairs)
        agreed = [a for *_, a in pairs if a is not None]
        return (Window.of([(ok, s) for ok, s, *_ in pairs]),
                Window.of([(ok, s) for _, _, ok, s, _ in pairs]),
                float(np.mean(agreed)) if agreed else None)


@dataclass(eq=False)
class Shadow:
    """A model's shadow step (:meth:`GatewayState.set_shadow`): ``percent`` of its
    unversioned requests are answered by stable (the split stays at 0 %) and mirrored
    to the candidate, at most ``max_in_flight`` mirrors at once; ``metric`` compares
    the two answers as :func:`agreement_of` does."""

    stable: int
    candidate: int
    percent: int
    metric: Literal["top1", "cosine"] = "cosine"
    max_in_flight: int = MIRROR_MAX_IN_FLIGHT
    tally: ShadowTally = field(default_factory=ShadowTally)

    def sampled(self, draw: int) -> bool:
        """Whether one request is mirrored, ``draw`` uniform in 0..99."""
        return draw < self.percent

    def admit(self) -> bool:
        """One more mirror in flight, unless the bound is reached (then: counted
        skipped)."""
        if self.tally.mirrors_in_flight >= self.max_in_flight:
            self.tally.skipped += 1
            return False
        self.tally.mirrors_in_flight += 1
        return True

    def done(self) -> None:
        """A mirror admitted by :meth:`admit` ended."""
        self.tally.mirrors_in_flight -= 1
