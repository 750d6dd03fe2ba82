"""Candidate versions of the tiny model (FP32 ``x``/``y`` of shape [batch, 16], opset 17)
for the rollout tests and the rollout benchmark: a *good* one (``affine_onnx``: another
slope), an *erroring* one (ONNX Runtime raises on some inputs), a *slow* one (same
answers, much more compute), a *differing* one (other weights, answers that disagree
with ``2x + 1``) and a *diverging* one (the same answers within the evaluation set's
range, other ones beyond it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import NodeProto, TensorProto, helper, numpy_helper

from converters.tiny import TINY_WIDTH


def _save(path: Path, name: str, nodes: list[NodeProto],
          initializers: list[TensorProto]) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", TINY_WIDTH])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", TINY_WIDTH])
    graph = helper.make_graph(nodes, name, [x], [y], initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _const(name: str, values: list[float] | list[int], dtype: int = TensorProto.FLOAT,
           dims: list[int] | None = None) -> TensorProto:
    return helper.make_tensor(name, dtype, [len(values)] if dims is None else dims, values)


def _affine(slope: float, out: str) -> tuple[list[NodeProto], list[TensorProto]]:
    """Nodes computing ``out = slope * x + 1``."""
    return ([helper.make_node("Mul", ["x", "slope"], ["kx"]),
             helper.make_node("Add", ["kx", "one"], [out])],
            [_const("slope", [slope]), _const("one", [1.0])])


def affine_onnx(path: Path, slope: float) -> Path:
    """``y = slope * x + 1`` (the tiny model with another slope; 2.1 agrees with it)."""
    nodes, inits = _affine(slope, "y")
    return _save(path, "affine", nodes, inits)


def erroring_onnx(path: Path, threshold: float = 0.8) -> Path:
    """``y = 2x + 1``, but ONNX Runtime fails the request when any ``x[:, 0] > threshold``
    (a Gather whose index becomes 1000 over a 1-element table is out of bounds). With x
    uniform in [0, 1) about ``1 - threshold`` of single-row requests fail (measured: 20.0%
    of 1000 rows for 0.8)."""
    nodes, inits = _affine(2.0, "affine")
    nodes += [
        helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["x0"]),  # [batch, 1]
        helper.make_node("Greater", ["x0", "threshold"], ["bad"]),
        helper.make_node("Cast", ["bad"], ["bad_i"], to=TensorProto.INT64),
        helper.make_node("Mul", ["bad_i", "far"], ["index"]),
        helper.make_node("Gather", ["table", "index"], ["zero"], axis=0),  # [batch, 1] of 0
        helper.make_node("Add", ["affine", "zero"], ["y"]),
    ]
    inits += [
        _const("starts", [0], TensorProto.INT64), _const("ends", [1], TensorProto.INT64),
        _const("axes", [1], TensorProto.INT64), _const("threshold", [threshold]),
        _const("far", [1000], TensorProto.INT64), _const("table", [0.0]),
    ]
    return _save(path, "erroring", nodes, inits)


def slow_onnx(path: Path, work: int = 24, size: int = 256) -> Path:
    """``y = 2x + 1`` plus ``work`` batched MatMuls of [size, size] per row on a tensor
    derived from ``x``, whose sum is multiplied by 0 and added to ``y`` (ONNX Runtime does
    not fold that away); the output equals ``2x + 1`` exactly. The cost grows with the
    batch. Measured on the 2-core dev machine, ORT 1.31 CPU, ``intra_op_num_threads=1``,
    one row, median of 50 runs: 7.7-10.0 ms with the defaults (about 0.4 ms per unit of
    ``work``; ~90 ms for 8 rows), versus 0.016 ms for the tiny model."""
    rng = np.random.default_rng(0)
    nodes, inits = _affine(2.0, "affine")
    nodes += [
        helper.make_node("MatMul", ["x", "w_in"], ["h_in"]),               # [batch, size]
        helper.make_node("Reshape", ["h_in", "row_shape"], ["h_row"]),     # [batch, 1, size]
        helper.make_node("Mul", ["h_row", "column"], ["h0"]),              # [batch, size, size]
    ]
    for i in range(work):
        nodes += [helper.make_node("MatMul", [f"h{i}", "w"], [f"m{i}"]),
                  helper.make_node("Tanh", [f"m{i}"], [f"h{i + 1}"])]
    nodes += [
        helper.make_node("ReduceSum", [f"h{work}", "sum_axes"], ["total"], keepdims=1),
        helper.make_node("Reshape", ["total", "col_shape"], ["total_col"]),  # [batch, 1]
        helper.make_node("Mul", ["total_col", "zero"], ["nothing"]),
        helper.make_node("Add", ["affine", "nothing"], ["y"]),
    ]
    scale = np.float32(1.0 / np.sqrt(size))
    inits += [
        numpy_helper.from_array(rng.standard_normal((TINY_WIDTH, size), np.float32) * 0.25,
                                "w_in"),
        numpy_helper.from_array(rng.standard_normal((size, size), np.float32) * scale, "w"),
        numpy_helper.from_array(rng.uniform(0.5, 1.5, (size, 1)).astype(np.float32),
                                "column"),
        _const("row_shape", [-1, 1, size], TensorProto.INT64),
        _const("col_shape", [-1, 1], TensorProto.INT64),
        _const("sum_axes", [1, 2], TensorProto.INT64),
        _const("zero", [0.0]),
    ]
    return _save(path, "slow", nodes, inits)


def flipped_onnx(path: Path) -> Path:
    """``y = -2x + 1``: on positive ``x`` its cosine with ``2x + 1`` is strongly negative
    and its top-1 (argmin of x) differs from the tiny model's (argmax of x)."""
    nodes, inits = _affine(-2.0, "y")
    return _save(path, "flipped", nodes, inits)


def diverging_onnx(path: Path, threshold: float = 0.8) -> Path:
    """``y = 2x + 1`` where ``x[:, 0] <= threshold``, ``y = -2x + 1`` on rows beyond it:
    agrees with the tiny model on an evaluation set within [0, threshold], not on live
    inputs outside it (the shadow step's case)."""
    nodes, inits = _affine(2.0, "affine")
    nodes += [
        helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["x0"]),  # [batch, 1]
        helper.make_node("Greater", ["x0", "threshold"], ["beyond"]),
        helper.make_node("Cast", ["beyond"], ["beyond_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["x", "minus_four"], ["turn"]),  # -4x: 2x + 1 -> -2x + 1
        helper.make_node("Mul", ["turn", "beyond_f"], ["delta"]),
        helper.make_node("Add", ["affine", "delta"], ["y"]),
    ]
    inits += [
        _const("starts", [0], TensorProto.INT64), _const("ends", [1], TensorProto.INT64),
        _const("axes", [1], TensorProto.INT64), _const("threshold", [threshold]),
        _const("minus_four", [-4.0]),
    ]
    return _save(path, "diverging", nodes, inits)
