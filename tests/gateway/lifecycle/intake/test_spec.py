"""The upload spec: reduced precision needs a budget, the batch axis must be dynamic."""

from __future__ import annotations

import json

import pytest

from converters.metrics import AccuracyBudget
from converters.spec import TensorDecl
from gateway.errors import InvalidInput
from gateway.lifecycle.intake.spec import UploadSpec, parse_spec

INPUTS = [{"name": "input", "datatype": "FP32", "shape": ["batch", 3, 224, 224]}]


def test_spec_parses_when_complete() -> None:
    spec = parse_spec(json.dumps({
        "inputs": INPUTS, "precisions": ["fp32", "int8", "int8"],
        "accuracy_budget": {"max_top1_drop": 0.01}, "latency_slo_ms": 50, "pools": ["a"],
        "keep_warm": {"interval_s": 5, "idle_after_s": 10, "batch_sizes": [8, 1, 8]},
    }))
    assert spec.precisions == ("fp32", "int8")
    assert spec.needs_calibration and spec.needs_evaluation
    assert spec.keep_warm is not None and spec.keep_warm.batch_sizes == (1, 8)


def test_spec_needs_no_samples_when_precisions_are_fp32_and_fp16() -> None:
    spec = parse_spec(json.dumps({"inputs": INPUTS, "precisions": ["fp32", "fp16"],
                                  "accuracy_budget": {"min_cosine": 0.99}}))
    assert not spec.needs_calibration and not spec.needs_evaluation  # synthetic inputs


def test_spec_keeps_an_input_range_when_declared() -> None:
    inputs = [{"name": "ids", "datatype": "INT64", "shape": ["batch", "seq"], "range": [0, 99]}]
    spec = parse_spec(json.dumps({"inputs": inputs}))
    assert spec.inputs[0].value_range == (0, 99)
    assert spec.model_dump(mode="json")["inputs"] == inputs  # what the worker reads back


@pytest.mark.parametrize(("spec", "message"), [
    ({"inputs": INPUTS, "precisions": ["int8"]}, "need an accuracy_budget"),
    ({"inputs": INPUTS, "precisions": ["int8"], "accuracy_budget": {}}, "max_top1_drop"),
    ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3]}]}, "batch"),
    ({"inputs": [{"name": "x", "datatype": "COMPLEX", "shape": ["b"]}]}, "datatype"),
    ({"inputs": []}, "inputs"),
    ({"inputs": INPUTS, "precisions": ["fp8"]}, "precisions"),
    ({"inputs": INPUTS, "surprise": 1}, "surprise"),
])
def test_spec_refused_with_field_named_when_invalid(spec: dict, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        parse_spec(json.dumps(spec))


def test_spec_refused_when_not_json() -> None:
    with pytest.raises(InvalidInput, match="not valid JSON"):
        parse_spec("{inputs: nope")


def test_spec_holds_the_converters_own_types_and_writes_them_back_as_sent() -> None:
    sent = {"inputs": INPUTS, "precisions": ["fp16"], "accuracy_budget": {"min_cosine": 0.99}}
    spec = parse_spec(json.dumps(sent))
    assert spec.inputs == (TensorDecl("input", "float32", ("batch", 3, 224, 224)),)
    assert spec.accuracy_budget == AccuracyBudget(max_top1_drop=None, min_cosine=0.99)
    dumped = spec.model_dump(mode="json")
    assert dumped["inputs"] == INPUTS
    assert dumped["accuracy_budget"] == {"max_top1_drop": None, "min_cosine": 0.99}
    assert UploadSpec.model_validate(dumped) == spec  # what the worker reads back


def test_spec_error_names_the_input_problem_once() -> None:
    with pytest.raises(InvalidInput) as info:
        parse_spec(json.dumps({"inputs": [{"name": "x", "datatype": "FP32",
                                           "shape": ["b", 0]}]}))
    assert info.value.message == ("invalid spec: inputs.0: input 'x': dimension 0 must be "
                                  ">= 1, -1 or a name")
