"""AdaRound-style weight rounding: round each INT8 weight up or down so that the layer's
output error on real inputs is smallest, instead of to the nearest integer.

For a layer with weights ``w`` (one output channel) and input patches ``x``, the output
error of rounding to ``q`` is ``E[((q - w/s) . x)^2] s^2 = d^T C d s^2`` with
``d = q - w/s`` and ``C = E[x x^T]`` (Nagel et al., "Up or Down? Adaptive Rounding for
Post-Training Quantization", 2020, whose objective this is). Rounding to nearest
minimizes each ``|d_i|`` alone; correlated inputs make the sum smaller when some round the
other way. Here the quadratic binary problem is solved per output channel by greedy
coordinate descent (flip one weight's rounding while that lowers ``d^T C d``), starting
from nearest, with ``C`` measured on calibration data from the float model's inputs.

The result is a float model whose quantized weights are already on ONNX Runtime's grid
(``q * s``, with the scale read back from the quantized model, and ``q`` within the
integers the quantizer serves: [-64, 64] for 7-bit CPU weights, [-127, 127] otherwise,
:func:`converters.quantize.weight_range`); each channel's largest weight is left as it
is, so the quantizer computes the same scale again.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from converters.datasets import SampleSet
from converters.runtime import RuntimeSettings, open_session

POSITIONS_PER_BATCH = 2048  # input patches sampled per layer and batch


@dataclass(frozen=True)
class _Grid:
    """The INT8 grid of one layer's weights."""

    scale: np.ndarray  # per row (output channel), or one value
    zero: np.ndarray
    low: int
    high: int


@dataclass(frozen=True)
class _Layer:
    node: onnx.NodeProto
    weight: np.ndarray  # float, as [rows, K] (rows = output channels)
    grid: _Grid
    depthwise: bool
    kernel: tuple[int, ...] = ()  # Conv: the weights' spatial shape


def rounded_weights(float_model: onnx.ModelProto, quantized: onnx.ModelProto,
                    samples: SampleSet, settings: RuntimeSettings, *,
                    levels: tuple[int, int],
                    sweeps: int = 2) -> dict[str, tuple[str, np.ndarray]]:
    """Node name -> (weight initializer, float weights on the INT8 grid, rounded to
    minimize output error), for every Conv (group 1 or depthwise) and Gemm. ``levels``:
    the integers the quantizer serves (:func:`converters.quantize.weight_range`)."""
    layers = _layers(float_model, quantized, levels)
    if not layers:
        return {}
    moments = _input_moments(float_model, layers, samples, settings)
    result = {}
    for layer in layers:
        moment = moments.get(layer.node.name)
        if moment is None:
            continue
        rows = _round(layer, moment, sweeps)
        inits = {i.name: i for i in float_model.graph.initializer}
        original = numpy_helper.to_array(inits[layer.node.input[1]])
        result[layer.node.name] = (layer.node.input[1], _unflatten(rows, layer, original))
    return result


def apply_rounding(model: onnx.ModelProto, rounded: Mapping[str, tuple[str, np.ndarray]],
                   skip: set[str]) -> onnx.ModelProto:
    """A copy of ``model`` with the rounded weights, except for layers kept float."""
    result = copy.deepcopy(model)
    inits = {i.name: i for i in result.graph.initializer}
    for node, (name, values) in rounded.items():
        if node not in skip and name in inits:
            inits[name].CopyFrom(numpy_helper.from_array(values.astype(np.float32), name))
    return result


def _attrs(node: onnx.NodeProto) -> dict[str, object]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _layers(float_model: onnx.ModelProto, quantized: onnx.ModelProto,
            levels: tuple[int, int]) -> list[_Layer]:
    grids = _grids(quantized, levels)
    inits = {i.name: i for i in float_model.graph.initializer}
    users: dict[str, int] = {}
    for node in float_model.graph.node:
        for name in node.input:
            users[name] = users.get(name, 0) + 1
    layers = []
    for node in float_model.graph.node:
        grid = grids.get(node.name)
        if grid is None or len(node.input) < 2 or node.input[1] not in inits or \
                users.get(node.input[1]) != 1:
            continue
        weight = numpy_helper.to_array(inits[node.input[1]]).astype(np.float64)
        attrs = _attrs(node)
        if node.op_type == "Gemm":
            if attrs.get("transA", 0):
                continue
            rows = weight if attrs.get("transB", 0) else weight.T
            layers.append(_Layer(node, rows, grid, False))
            continue
        group = int(attrs.get("group", 1))  # type: ignore[call-overload]
        depthwise = group > 1 and weight.shape[1] == 1 and group == weight.shape[0]
        if group != 1 and not depthwise:
            continue
        layers.append(_Layer(node, weight.reshape(weight.shape[0], -1), grid, depthwise,
                             tuple(int(k) for k in weight.shape[2:])))
    return layers


def _grids(quantized: onnx.ModelProto, levels: tuple[int, int]) -> dict[str, _Grid]:
    """Node -> the INT8 grid ONNX Runtime chose for its weights (scale per output row),
    its integers limited to ``levels`` (7-bit weights use less than the int8 type holds)."""
    inits = {i.name: numpy_helper.to_array(i) for i in quantized.graph.initializer}
    producer = {o: n for n in quantized.graph.node for o in n.output}
    grids = {}
    for node in quantized.graph.node:
        if node.op_type not in ("Conv", "Gemm") or len(node.input) < 2:
            continue
        dq = producer.get(node.input[1])
        if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] not in inits:
            continue
        values = inits[dq.input[0]]
        scale = inits[dq.input[1]].astype(np.float64).reshape(-1)
        zero = inits[dq.input[2]].astype(np.float64).reshape(-1) if len(dq.input) > 2 \
            else np.zeros(1)
        low, high = levels
        if values.dtype != np.int8 or int(values.min()) < low or int(values.max()) > high:
            raise RuntimeError(
                f"{node.name}: served weights {values.dtype} in [{values.min()}, "
                f"{values.max()}], outside the INT8 grid [{low}, {high}] expected")
        axis = next((int(a.i) for a in dq.attribute if a.name == "axis"), 1)
        rows_axis = 1 if node.op_type == "Gemm" and not _attrs(node).get("transB", 0) else 0
        if scale.size > 1 and axis != rows_axis:
            continue  # scales along another axis than output channels: not handled
        grids[node.name] = _Grid(scale, zero, low, high)
    return grids


def _input_moments(model: onnx.ModelProto, layers: list[_Layer], samples: SampleSet,
                   settings: RuntimeSettings) -> dict[str, np.ndarray]:
    """Per layer, ``E[x x^T]`` of its input patches ([K, K], or [C, K, K] depthwise)."""
    probe = copy.deepcopy(model)
    names = sorted({layer.node.input[0] for layer in layers})
    existing = {o.name for o in probe.graph.output}
    for name in names:
        if name not in existing:
            probe.graph.output.append(helper.make_empty_tensor_value_info(name))
    session = open_session(probe.SerializeToString(), settings)
    wanted = {i.name for i in session.get_inputs()}
    rng = np.random.default_rng(0)
    sums: dict[str, np.ndarray] = {}
    counts: dict[str, int] = {}
    for batch in samples.batches(4):
        values = dict(zip(names, session.run(names, {k: v for k, v in batch.items()
                                                     if k in wanted}), strict=True))
        for layer in layers:
            patches = _patches(layer, values[layer.node.input[0]], rng)
            if patches is None:
                continue
            if layer.depthwise:  # [P, C, K]: per channel [K, P] @ [P, K] (BLAS, not einsum)
                moment = patches.transpose(1, 2, 0) @ patches.transpose(1, 0, 2)
            else:  # [P, K]
                moment = patches.T @ patches
            sums[layer.node.name] = sums.get(layer.node.name, 0) + moment
            counts[layer.node.name] = counts.get(layer.node.name, 0) + len(patches)
    return {name: total / counts[name] for name, total in sums.items()}


def _patches(layer: _Layer, x: np.ndarray, rng: np.random.Generator) -> np.ndarray | None:
    x = x.astype(np.float64)
    if layer.node.op_type == "Gemm":
        return x.reshape(x.shape[0], -1)
    attrs = _attrs(layer.node)
    kernel = layer.kernel
    if x.ndim != 4 or len(kernel) != 2 or attrs.get("auto_pad", b"NOTSET") not in (
            b"NOTSET", "NOTSET"):
        return None
    pads = list(attrs.get("pads", [0, 0, 0, 0]))  # type: ignore[call-overload]
    strides = list(attrs.get("strides", [1, 1]))  # type: ignore[call-overload]
    dilations = list(attrs.get("dilations", [1, 1]))  # type: ignore[call-overload]
    padded = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    span = [(k - 1) * d + 1 for k, d in zip(kernel, dilations, strict=True)]
    windows = np.lib.stride_tricks.sliding_window_view(
        padded, tuple(span), axis=(2, 3))  # type: ignore[call-overload]
    windows = windows[:, :, ::strides[0], ::strides[1], ::dilations[0], ::dilations[1]]
    n, c, ho, wo = windows.shape[:4]
    count = min(POSITIONS_PER_BATCH, n * ho * wo)
    pick = rng.choice(n * ho * wo, size=count, replace=False)
    b, rest = np.divmod(pick, ho * wo)
    i, j = np.divmod(rest, wo)
    chosen = windows[b, :, i, j]  # [P, C, kh, kw]
    if layer.depthwise:
        return chosen.reshape(count, c, -1)
    return chosen.reshape(count, -1)


def _round(layer: _Layer, moment: np.ndarray, sweeps: int) -> np.ndarray:
    """Integers [rows, K] minimizing d^T C d per row, d = q - w/s; the largest weight of
    each row keeps nearest rounding (it fixes the scale)."""
    grid, weight = layer.grid, layer.weight
    scale = grid.scale.reshape(-1, 1) if grid.scale.size > 1 else grid.scale.reshape(1, 1)
    zero = grid.zero.reshape(-1, 1) if grid.zero.size > 1 else grid.zero.reshape(1, 1)
    u = weight / np.where(scale > 0, scale, 1.0) + zero
    q = np.clip(np.round(u), grid.low, grid.high)
    fixed = np.zeros_like(q, dtype=bool)
    if grid.scale.size > 1:
        fixed[np.arange(len(q)), np.abs(weight).argmax(axis=1)] = True
    else:
        fixed[np.unravel_index(np.abs(weight).argmax(), weight.shape)] = True
    d = q - u
    if layer.depthwise:
        g = np.einsum("ck,ckl->cl", d, moment)
        diag = np.einsum("ckk->ck", moment)
    else:
        g = d @ moment
        diag = np.broadcast_to(np.diag(moment), q.shape)
    for _ in range(sweeps):
        changed = False
        for j in range(q.shape[1]):
            step = np.where(d[:, j] > 0, -1.0, 1.0)
            alternative = q[:, j] + step
            allowed = ~fixed[:, j] & (alternative >= grid.low) & (alternative <= grid.high)
            gain = 2 * step * g[:, j] + diag[:, j]
            flip = allowed & (gain < -1e-12)
            if not flip.any():
                continue
            changed = True
            delta = np.where(flip, step, 0.0)
            q[:, j] += delta
            d[:, j] += delta
            g += delta[:, None] * (moment[:, j, :] if layer.depthwise else moment[j][None, :])
        if not changed:
            break
    values = (q - zero) * scale
    values[fixed] = weight[fixed]  # the quantizer derives the same scale from it again
    return values


def _unflatten(rows: np.ndarray, layer: _Layer, original: np.ndarray) -> np.ndarray:
    """Back to the initializer's layout."""
    if layer.node.op_type == "Gemm" and not _attrs(layer.node).get("transB", 0):
        return rows.T.astype(np.float32)
    return rows.reshape(original.shape).astype(np.float32)
