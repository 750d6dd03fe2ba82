"""The gate's and the shadow step's verdict (pure), the shadow's spec, its tally and its
bound on mirrors in flight; the comparison of two answers to the same request on both
protocols (decoded with tritonclient's helpers)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from gateway.config.rollout import RolloutSpec, ShadowSpec, parse_rollout
from gateway.policy.rollout import Shadow, ShadowTally, Verdict, Window, judge_side_by_side
from gateway.python.shadow import agreement, compare_grpc, compare_http, grpc_outputs
from gateway.upstream.http import UpstreamResponse


def test_shadow_on_by_default_off_with_none_or_false_when_parsed() -> None:
    spec = parse_rollout({"step_seconds": 7, "min_requests": 30})
    assert isinstance(spec, RolloutSpec) and spec.shadow == ShadowSpec()
    assert (spec.shadow.percent, spec.shadow_seconds, spec.shadow_min_requests,
            spec.shadow.max_in_flight) == (20, 7.0, 30, 8)
    assert parse_rollout({}).shadow_min_requests == 50  # type: ignore[union-attr]
    for off in ("none", False, None):
        assert parse_rollout({"shadow": off}).shadow is None  # type: ignore[union-attr]
    own = parse_rollout({"shadow": {"percent": 50, "seconds": 3, "min_requests": 9}})
    assert isinstance(own, RolloutSpec)
    assert (own.shadow_seconds, own.shadow_min_requests) == (3.0, 9)
    assert RolloutSpec.model_validate(own.model_dump(mode="json")) == own  # as stored


@pytest.mark.parametrize(("value", "message"), [
    ({"shadow": {"percent": 0}}, "shadow.percent: Input should be greater than or equal to 1"),
    ({"shadow": {"percent": 101}}, "shadow.percent: Input should be less than or equal"),
    ({"shadow": {"seconds": 0}}, "shadow.seconds: Input should be greater than 0"),
    ({"shadow": {"share": 5}}, "shadow.share: Extra inputs are not permitted"),
    ({"shadow": "always"}, "shadow: expected 'none', false, true or a mapping"),
])
def test_invalid_shadow_refused_naming_field_when_parsed(value: Any, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_rollout(value)
    assert message in str(caught.value)


SPEC = RolloutSpec(min_requests=20)
FAST = Window(100, 0, 0.004, 0.002)


@pytest.mark.parametrize(("candidate", "agreement", "over", "final", "verdict", "why"), [
    (FAST, 1.0, True, False, Verdict.PROMOTE, "within bounds"),
    (FAST, 0.5, False, False, Verdict.ROLLBACK, "agreement"),  # enough: no wait
    (Window(100, 10, 0.004, 0.002), 1.0, True, False, Verdict.ROLLBACK, "error rate"),
    (Window(100, 0, 0.030, 0.020), 1.0, False, False, Verdict.ROLLBACK, "median"),
    (Window(100, 0, 0.030, 0.0050), 1.0, True, False, Verdict.ROLLBACK, "p99"),
    # the median 1.2x, but 0.4 ms: a whole millisecond in HAProxy's log moves it more
    (Window(100, 0, 0.030, 0.0024), 1.0, True, False, Verdict.PROMOTE, "within"),
    (Window(100, 0, 0.030, 0.0021), 1.0, True, False, Verdict.PROMOTE, "within"),  # tail alone
    (Window(100, 0, 0.005, 0.0025), 1.0, True, False, Verdict.PROMOTE, "within"),  # < 5 ms
    (Window(5, 0, 0.004, 0.002), None, False, False, None, ""),
    (Window(5, 0, 0.004, 0.002), None, True, False, Verdict.HOLD, "5 of 20"),
    (Window(5, 0, 0.004, 0.002), None, True, True, Verdict.PROMOTE, "the steps judge it"),
    (Window(5, 0, 0.004, 0.002), 0.0, True, True, Verdict.ROLLBACK, "agreement"),
    (Window(0, 0), None, True, True, Verdict.PROMOTE, "only 0 of 20"),
])
def test_side_by_side_verdict_follows_table_when_judged(
        candidate: Window, agreement: float | None, over: bool, final: bool,
        verdict: Verdict | None, why: str) -> None:
    decision = judge_side_by_side(SPEC, FAST, candidate, agreement, min_requests=20,
                                  over=over, final=final)
    if verdict is None:
        assert decision is None
        return
    assert decision is not None and decision.verdict is verdict, decision
    assert why in decision.reason
    assert decision.figures["candidate"]["requests"] == candidate.requests


def test_shadow_tally_pairs_and_bound_on_mirrors_in_flight() -> None:
    shadow = Shadow(1, 2, 25, "top1", max_in_flight=2)
    assert sum(shadow.sampled(d) for d in range(100)) == 25
    assert shadow.admit() and shadow.admit() and not shadow.admit()
    assert shadow.tally.skipped == 1
    tally = ShadowTally()
    tally.record(True, 0.002, True, 0.003, 1.0)
    tally.record(True, 0.002, False, 0.001, None)
    tally.record(True, 0.004, True, 0.005, 0.0)
    stable, candidate, agreed = tally.windows()
    assert (stable.requests, stable.errors, candidate.requests, candidate.errors) == (3, 0, 3, 1)
    assert agreed == 0.5
    tally.clear()
    assert tally.windows()[2] is None


def _http_answer(y: np.ndarray, binary: bool) -> UpstreamResponse:
    if not binary:
        body = ('{"model_name":"m","model_version":"1","outputs":[{"name":"y","datatype":'
                f'"FP32","shape":{list(y.shape)},"data":{y.ravel().tolist()}}}]}}').encode()
        return UpstreamResponse(200, body, [])
    head = ('{"model_name":"m","outputs":[{"name":"y","datatype":"FP32","shape":'
            f'{list(y.shape)},"parameters":{{"binary_data_size":{y.nbytes}}}}}]}}').encode()
    return UpstreamResponse(200, head + y.astype(np.float32).tobytes(),
                            [(b"Inference-Header-Content-Length", str(len(head)).encode())])


def test_http_answers_compared_top1_or_cosine_json_or_binary() -> None:
    y = np.array([[1.0, 3.0, 2.0], [5.0, 1.0, 0.0]], np.float32)
    flipped = np.roll(y, 1, axis=1)
    for binary in (False, True):
        stable = _http_answer(y, binary)
        assert compare_http(stable, "top1")(_http_answer(y, not binary)) == ("success", 1.0)
        outcome, top1 = compare_http(stable, "top1")(_http_answer(flipped, binary))
        assert outcome == "success" and top1 == 0.0
        assert compare_http(stable, "cosine")(_http_answer(y * 2, binary))[1] == \
            pytest.approx(1.0)
        outcome, compared = compare_http(stable, "cosine")(UpstreamResponse(500, b"{}", []))
        assert outcome != "success" and compared is None


def _grpc_answer(y: np.ndarray) -> bytes:
    response = service_pb2.ModelInferResponse(model_name="m")
    response.outputs.add(name="y", datatype="FP32", shape=list(y.shape))
    response.raw_output_contents.append(y.astype(np.float32).tobytes())
    return response.SerializeToString()


def test_grpc_answers_compared_and_relayed_errors_counted() -> None:
    y = np.array([[1.0, 3.0, 2.0]], np.float32)
    assert np.array_equal(grpc_outputs(_grpc_answer(y))["y"], y)
    assert compare_grpc(_grpc_answer(y), "top1")(_grpc_answer(y)) == ("success", 1.0)
    assert compare_grpc(_grpc_answer(y), "top1")(_grpc_answer(-y))[1] == 0.0
    assert agreement({"y": y}, {"z": y}, "cosine") == 0.0  # another output: no agreement
