"""The rollout policy as pure functions: the spec's checks, the split, pinning a request
to a version (HTTP path, gRPC wire bytes), windows and the verdict table."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from gateway.config.rollout import RolloutSpec, parse_rollout
from gateway.policy.model_name import grpc_model_name, grpc_names_version
from gateway.policy.rollout import (
    Split,
    Verdict,
    Window,
    agreement_of,
    effective,
    http_pinned_path,
    judge,
    pin_grpc_version,
)


@pytest.mark.parametrize(("value", "message"), [
    ({"steps": [5, 5, 100]}, "steps must increase: step 1 (5) is not above step 0 (5)"),
    ({"steps": [50, 25]}, "steps must increase"),
    ({"steps": [5, 120]}, "step 1 is 120: each step is a percent, 1..100"),
    ({"steps": [0, 100]}, "step 0 is 0"),
    ({"steps": []}, "at least one step"),
    ({"max_error_rate_delta": -0.1}, "max_error_rate_delta: Input should be greater than"),
    ({"min_requests": -1}, "min_requests: Input should be greater than or equal to 0"),
    ({"max_p99_ratio": 0.5}, "max_p99_ratio: Input should be greater than or equal to 1"),
    ({"min_agreement": 1.5}, "min_agreement: Input should be less than or equal to 1"),
    ({"step_seconds": 0}, "step_seconds: Input should be greater than 0"),
    ({"stepz": [5]}, "stepz: Extra inputs are not permitted"),
    ("canary", "expected 'none' or a mapping"),
])
def test_invalid_rollout_refused_naming_field_when_parsed(value: Any, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_rollout(value)
    assert message in str(caught.value)


def test_rollout_defaults_and_none_when_parsed() -> None:
    spec = parse_rollout({})
    assert isinstance(spec, RolloutSpec)
    assert (spec.steps, spec.step_seconds, spec.min_requests, spec.max_error_rate_delta,
            spec.max_p99_ratio, spec.min_agreement) == ((5, 25, 50, 100), 60.0, 200, 0.01,
                                                        1.3, 0.99)
    assert parse_rollout("none") == "none" and parse_rollout(None) is None
    configured = RolloutSpec(steps=(10, 100))
    assert effective(None, configured) is configured  # the model's, when the upload is silent
    assert effective("none", configured) is None  # the upload's "none" wins
    assert effective(spec, "none") is spec
    assert effective(None, None) is None


def test_split_sends_percent_of_draws_to_candidate_when_picked() -> None:
    split = Split(stable=3, candidate=4, percent=25)
    picks = [split.pick(draw) for draw in range(100)]  # HAProxy: rand(100) < percent
    assert picks.count(4) == 25 and picks[:25] == [4] * 25 and picks[25:] == [3] * 75
    assert {Split(3, 4, 0).pick(d) for d in range(100)} == {3}
    assert {Split(3, 4, 100).pick(d) for d in range(100)} == {4}


def test_pinned_grpc_request_names_version_when_appended() -> None:
    request = service_pb2.ModelInferRequest(model_name="tiny", id="r1")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 16])
    request.raw_input_contents.append(b"\0" * 64)
    wire = request.SerializeToString()
    assert not grpc_names_version(wire)
    pinned = service_pb2.ModelInferRequest.FromString(pin_grpc_version(wire, 12))
    assert (pinned.model_name, pinned.model_version, pinned.id) == ("tiny", "12", "r1")
    assert pinned.raw_input_contents == request.raw_input_contents
    named = service_pb2.ModelInferRequest(model_name="tiny", model_version="2")
    assert grpc_names_version(named.SerializeToString())
    assert grpc_model_name(pin_grpc_version(wire, 3)) == "tiny"


def test_http_path_pinned_to_version_when_unversioned() -> None:
    assert http_pinned_path("/v2/models/tiny/infer", 7) == "/v2/models/tiny/versions/7/infer"
    assert http_pinned_path("/v2/models/in%2Ffer/infer", 2) == \
        "/v2/models/in%2Ffer/versions/2/infer"
    assert http_pinned_path("/v2/models/llm/generate_stream", 3) == \
        "/v2/models/llm/versions/3/generate_stream"


def test_window_p99_and_error_rate_when_built() -> None:
    answers = [(True, i / 1000) for i in range(1, 101)] + [(False, 5.0)] * 10
    window = Window.of(answers)
    assert (window.requests, window.errors) == (110, 10)
    assert window.p99_s == pytest.approx(0.099)  # over the successful answers only
    assert window.p50_s == pytest.approx(0.050)
    assert window.figures()["error_rate"] == pytest.approx(10 / 110, abs=1e-4)
    assert Window.of([]).p99_s is None and Window.of([]).error_rate == 0.0


SPEC = RolloutSpec(steps=(10, 100), step_seconds=10, min_requests=100,
                   max_error_rate_delta=0.01, max_p99_ratio=1.3, p99_tolerance_ms=2,
                   min_agreement=0.99)


def _w(requests: int, errors: int = 0, p99_ms: float | None = 10.0,
       p50_ms: float | None = None) -> Window:
    return Window(requests, errors, None if p99_ms is None else p99_ms / 1e3,
                  None if p50_ms is None else p50_ms / 1e3)


@pytest.mark.parametrize(("stable", "candidate", "agreement", "over", "verdict", "why"), [
    (_w(900), _w(100), 1.0, True, Verdict.PROMOTE, "within bounds"),
    (_w(900), _w(100), None, False, None, ""),  # the step goes on
    (_w(900), _w(99), None, True, Verdict.HOLD, "99 of 100 candidate answers"),
    (_w(900), _w(100, errors=20), None, False, Verdict.ROLLBACK, "error rate 0.200"),
    (_w(900, errors=90), _w(200, errors=20), None, True, Verdict.PROMOTE, ""),  # same rate
    (_w(900, errors=90), _w(100, errors=12), None, True, Verdict.ROLLBACK, "error rate"),
    (_w(900), _w(99, errors=50), None, False, None, ""),  # too few to condemn it yet
    (_w(900, p99_ms=10), _w(100, p99_ms=30), None, False, Verdict.ROLLBACK, "3.00x"),
    (_w(900, p99_ms=10), _w(100, p99_ms=13), None, True, Verdict.PROMOTE, ""),  # 1.3x
    # a tail alone (the median did not move): a hiccup, not a slower version
    (_w(900, p99_ms=10, p50_ms=4), _w(100, p99_ms=30, p50_ms=4.4), None, True,
     Verdict.PROMOTE, ""),
    (_w(900, p99_ms=10, p50_ms=4), _w(100, p99_ms=30, p50_ms=5.1), None, False,
     Verdict.ROLLBACK, "p99 30.0 ms is 3.00x"),
    # 1.2x at the median, but by 0.8 ms, under half the tolerance (1 ms): noise
    (_w(900, p99_ms=10, p50_ms=4), _w(100, p99_ms=30, p50_ms=4.8), None, True,
     Verdict.PROMOTE, ""),
    (_w(900, p99_ms=2), _w(100, p99_ms=3.5), None, True, Verdict.PROMOTE, ""),  # noise
    # 99 answers: the candidate's "p99" is its maximum, not compared
    (_w(900, p99_ms=10), _w(120, errors=21, p99_ms=30), None, True, Verdict.ROLLBACK,
     "error rate"),
    (_w(900, p99_ms=10), _w(99, p99_ms=30), None, True, Verdict.HOLD, "99 of 100"),
    # enough answers for min_requests, too few to judge a p99: no promotion unjudged
    (_w(900, errors=9), _w(100, errors=1), None, True, Verdict.HOLD,
     "99 of 100 candidate answers to judge its p99"),
    (_w(60), _w(100, errors=1), None, True, Verdict.PROMOTE, ""),  # no stable p99 to judge
    (None, _w(100, p99_ms=99), None, True, Verdict.PROMOTE, ""),  # no stable to compare
    (None, _w(100, errors=5), None, True, Verdict.ROLLBACK, "stable's 0.000"),
    (_w(900), _w(3), 0.5, False, Verdict.ROLLBACK, "agreement with stable 0.500"),
    (_w(900), _w(100), 0.99, True, Verdict.PROMOTE, ""),
])
def test_verdict_follows_table_when_judged(stable: Window | None, candidate: Window,
                                           agreement: float | None, over: bool,
                                           verdict: Verdict | None, why: str) -> None:
    decision = judge(SPEC, stable, candidate, agreement, over)
    if verdict is None:
        assert decision is None
        return
    assert decision is not None and decision.verdict is verdict
    assert why in decision.reason
    assert decision.figures["candidate"]["requests"] == candidate.requests


def test_agreement_counts_top1_or_cosine_when_compared() -> None:
    a = [np.array([0.1, 0.9]), np.array([0.8, 0.2]), np.array([0.3, 0.7])]
    b = [np.array([0.2, 0.8]), np.array([0.1, 0.9]), np.array([0.4, 0.6])]
    assert agreement_of(a, b, "top1") == pytest.approx(2 / 3)
    assert agreement_of(a, a, "cosine") == pytest.approx(1.0)
    assert agreement_of([np.ones(4)], [-np.ones(4)], "cosine") == pytest.approx(-1.0)
