"""Input specs: parsing, and the mismatch messages that name the problem."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from converters.errors import InputSpecMismatch, InvalidRequest
from converters.spec import (
    InputSpec,
    TensorDecl,
    check_spec_matches,
    parse_input_spec,
    spec_from_onnx,
)
from tests.converters.conftest import small_cnn


def test_parse_input_spec_reads_dynamic_dims_when_names_or_minus_one() -> None:
    spec = parse_input_spec("input_ids:int64[batch,sequence]; attention_mask:INT64[-1,-1]")
    assert spec.names == ("input_ids", "attention_mask")
    assert spec["input_ids"].shape == ("batch", "sequence")
    assert spec["attention_mask"].dtype == "int64"
    assert spec["attention_mask"].dynamic_axes() == {0: "batch", 1: "d1"}
    assert spec["input_ids"].triton_dims() == (-1,)
    assert spec.batched


def test_parse_input_spec_reads_json_with_triton_datatypes_when_given_a_file(
        tmp_path: Path) -> None:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps([{"name": "x", "datatype": "FP32", "shape": ["batch", 3, 8]}]))
    spec = parse_input_spec(str(path))
    assert spec.inputs == (TensorDecl("x", "float32", ("batch", 3, 8)),)
    assert spec.inputs[0].triton_dims() == (3, 8)


@pytest.mark.parametrize("text, problem", [
    ("input:float32", "expected name:dtype"),
    ("input:complex64[batch,3]", "unknown datatype"),
    ("input:float32[batch,0]", "must be >= 1"),
])
def test_parse_input_spec_names_the_problem_when_malformed(text: str, problem: str) -> None:
    with pytest.raises(InvalidRequest, match=problem):
        parse_input_spec(text)


@pytest.mark.parametrize("declared, problem", [
    ("pixels:float32[batch,3,16,16]", r"model's inputs are \['input'\]"),
    ("input:int64[batch,3,16,16]", "spec says int64, the model takes float32"),
    ("input:float32[batch,3,16]", "rank 3"),
    ("input:float32[batch,4,16,16]", "axis 1: spec says 4, the model has 3"),
])
def test_check_spec_matches_names_the_difference_when_spec_disagrees(
        tmp_path: Path, declared: str, problem: str) -> None:
    import onnx

    model = spec_from_onnx(onnx.load(str(small_cnn(tmp_path / "m.onnx"))))
    with pytest.raises(InputSpecMismatch, match=problem):
        check_spec_matches(parse_input_spec(declared), model)


def test_check_sample_rejects_wrong_shape_when_fixed_dim_differs() -> None:
    spec = InputSpec((TensorDecl("x", "float32", ("batch", 3)),))
    spec.check_sample({"x": np.zeros(3, np.float32)}, "set")
    with pytest.raises(InputSpecMismatch, match=r"shape \[4\] per sample, the model takes \[3\]"):
        spec.check_sample({"x": np.zeros(4, np.float32)}, "set")


def test_tensor_decl_json_form_round_trips_when_triton_or_numpy_names() -> None:
    wire = {"name": "ids", "datatype": "INT64", "shape": ["batch", "seq", 4]}
    decl = TensorDecl.from_mapping(wire)
    assert decl == TensorDecl("ids", "int64", ("batch", "seq", 4))
    assert decl.to_wire() == wire
    assert TensorDecl.from_mapping({"name": "ids", "dtype": "int64",
                                    "shape": ["batch", "seq", "4"]}) == decl


def test_tensor_decl_json_form_keeps_the_declared_range_when_given() -> None:
    wire = {"name": "ids", "datatype": "INT64", "shape": ["batch", "seq"], "range": [0, 30521]}
    decl = TensorDecl.from_mapping(wire)
    assert decl.value_range == (0, 30521)
    assert decl.to_wire() == wire and decl.to_dict()["range"] == [0, 30521]
    assert parse_input_spec(json.dumps([wire])).inputs == (decl,)


@pytest.mark.parametrize("item, problem", [
    ({"name": "x", "datatype": "FP32", "shape": ["b"], "extra": 1}, r"unknown fields \['extra'\]"),
    ({"name": "x", "datatype": "FP32", "shape": ["b"], "range": [2, 1]}, "low <= high"),
    ({"name": "x", "datatype": "FP32", "shape": ["b"], "range": [0]}, r"range \[0\] must be"),
    ({"name": "x", "datatype": "FP32", "shape": ["b"], "range": "0,1"}, "must be a list"),
    ({"name": "x", "datatype": "INT64", "shape": ["b"], "range": [0, 2.5]}, "whole numbers"),
    ({"name": "x", "shape": ["b"]}, "lacks datatype"),
    ({"name": "", "datatype": "FP32", "shape": ["b"]}, "1 to 128 characters"),
    ({"name": 7, "datatype": "FP32", "shape": ["b"]}, "must be a string"),
    ({"name": "x", "datatype": "FP32", "shape": "b,3"}, "shape must be a list"),
    ({"name": "x", "datatype": "FP32", "shape": ["b", 2.5]}, "neither a whole number"),
    ({"name": "x", "datatype": "FP32", "shape": ["b", True]}, "neither a whole number"),
    ({"name": "x", "datatype": "FP32", "shape": ["b", -3]}, "must be >= 1"),
    ({"name": "x", "datatype": "COMPLEX", "shape": ["b"]}, "unknown datatype 'COMPLEX'"),
])
def test_tensor_decl_refused_naming_the_problem_when_json_malformed(
        item: dict, problem: str) -> None:
    with pytest.raises(InvalidRequest, match=problem):
        TensorDecl.from_mapping(item)


def test_tensor_decl_refused_when_built_with_a_triton_dtype() -> None:
    with pytest.raises(InvalidRequest, match="dtype 'FP32' is not one of"):
        TensorDecl("x", "FP32", ("batch",))
