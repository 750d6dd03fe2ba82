"""Bias correction: cancel the mean error that INT8 weights add to each layer's output.

Rounding a layer's weights to INT8 changes its output by ``(W_q - W) x``; averaged over
real inputs that is a per-output-channel shift ``(W_q - W) E[x]`` (Nagel et al., "Data-Free
Quantization", 2019), and subtracting it from the bias cancels it at no run-time cost.
``E[x]`` is measured per input channel on the calibration set; ``W_q`` is read back from
the quantized model, so the correction matches the weights that will be served.

Measured on EfficientNet-Lite0 (300 photo crops, U8S8 per-channel): top-1 agreement with
FP32 rose from 88.7% to 97.0%. Keeping all weights float (activations INT8) gave 97.7%
and keeping all activations float 91.0%: weight rounding, mostly its mean shift, was the
dominant error, which is what this removes.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from converters.datasets import SampleSet
from converters.runtime import RuntimeSettings, open_session

CORRECTED_OPS = ("Conv", "Gemm")


def bias_corrections(
    float_model: onnx.ModelProto,
    quantized: onnx.ModelProto,
    calibration: SampleSet,
    settings: RuntimeSettings,
) -> dict[str, np.ndarray]:
    """Node name -> corrected bias, for every Conv/Gemm whose weights were quantized."""
    inits = {i.name: i for i in float_model.graph.initializer}
    users: dict[str, int] = {}
    for node in float_model.graph.node:
        for name in node.input:
            users[name] = users.get(name, 0) + 1
    quantized_weights = _dequantized_weights(quantized)
    layers = [
        n for n in float_model.graph.node
        if n.op_type in CORRECTED_OPS and len(n.input) > 2 and n.input[2] in inits
        and users.get(n.input[2]) == 1 and n.name in quantized_weights
        and n.input[1] in inits
    ]
    if not layers:
        return {}
    means = _input_means(float_model, [n.input[0] for n in layers], calibration, settings)
    corrections = {}
    for node in layers:
        weight = numpy_helper.to_array(inits[node.input[1]]).astype(np.float64)
        error = quantized_weights[node.name] - weight
        shift = _output_shift(node, error, means[node.input[0]])
        if shift is None:
            continue
        bias = numpy_helper.to_array(inits[node.input[2]]).astype(np.float64)
        corrections[node.name] = (bias - shift).astype(np.float32)
    return corrections


def empirical_corrections(
    float_model: onnx.ModelProto,
    quantize: Callable[[Mapping[str, np.ndarray]], onnx.ModelProto],
    start: Mapping[str, np.ndarray],
    calibration: SampleSet,
    settings: RuntimeSettings,
    passes: int = 8,
) -> dict[str, np.ndarray]:
    """Refine ``start`` (node -> bias) so that each corrected layer's mean output in the
    quantized model matches the float model's, per output channel.

    The analytic correction only sees a layer's own weight error; this one also sees the
    mean shift its *input* brings from every quantized layer before it (activation
    rounding, and ReLU6 bending zero-mean noise into a bias). Layers are corrected front
    to back in ``passes`` groups, each measured with every earlier group corrected:
    correcting all at once over-corrects (a layer's shift partly comes from upstream
    shifts that their own corrections remove), measured on EfficientNet-Lite0 as a drop
    in agreement. Measured on the quantized model as ONNX Runtime simulates it (Q/DQ
    unfused), on calibration data."""
    layers = [n for n in float_model.graph.node if n.name in start]
    if not layers:
        return dict(start)
    renamed = _quantized_names(float_model, quantize(start))
    layers = [n for n in layers if n.output[0] in renamed]
    want = _output_means(float_model, [renamed[n.output[0]][0] for n in layers], calibration,
                         settings, simulate=False)
    corrections = {k: np.asarray(v, np.float64) for k, v in start.items()}
    size = -(-len(layers) // max(1, passes))
    for first in range(0, len(layers), size):
        group = layers[first:first + size]
        model = quantize({k: v.astype(np.float32) for k, v in corrections.items()})
        got = _output_means(model, [renamed[n.output[0]][1] for n in group], calibration,
                            settings, simulate=True)
        for node in group:
            float_name, quant_name = renamed[node.output[0]]
            mean, target = got.get(quant_name), want.get(float_name)
            if mean is not None and target is not None and mean.shape == target.shape:
                corrections[node.name] = corrections[node.name] - (mean - target)
    return {k: v.astype(np.float32) for k, v in corrections.items()}


def _quantized_names(float_model: onnx.ModelProto,
                     quantized: onnx.ModelProto) -> dict[str, tuple[str, str]]:
    """Float layer -> (float tensor, QDQ tensor) holding the same activation. A Conv
    followed by ReLU/Clip loses the activation node in the QDQ model (its Q node clips
    instead): there the *activation's* output is compared, float against the value its
    DequantizeLinear gives back. Pre-activations are not comparable in channels that
    are mostly clipped (their float value can be far below zero with nothing served)."""
    produced = {o: n for n in quantized.graph.node for o in n.output}
    q_consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in quantized.graph.node:
        for name in node.input:
            q_consumers.setdefault(name, []).append(node)
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in float_model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    names: dict[str, tuple[str, str]] = {}
    for node in float_model.graph.node:
        tensor = node.output[0] if node.output else ""
        following = consumers.get(tensor, [])
        if tensor in produced:
            names[tensor] = (tensor, tensor)
        elif len(following) == 1 and following[0].op_type in ("Clip", "Relu"):
            activation = following[0].output[0]
            dq = [d for q in q_consumers.get(activation, []) if q.op_type == "QuantizeLinear"
                  for d in q_consumers.get(q.output[0], []) if d.op_type == "DequantizeLinear"]
            if dq:
                names[tensor] = (activation, dq[0].output[0])
    return names


def apply_corrections(
    model: onnx.ModelProto, corrections: Mapping[str, np.ndarray], skip: set[str]
) -> onnx.ModelProto:
    """A copy of ``model`` with corrected biases, except for layers kept float."""
    corrected = copy.deepcopy(model)
    inits = {i.name: i for i in corrected.graph.initializer}
    for node in corrected.graph.node:
        if node.name in corrections and node.name not in skip:
            inits[node.input[2]].CopyFrom(
                numpy_helper.from_array(corrections[node.name], node.input[2]))
    return corrected


def _output_shift(node: onnx.NodeProto, error: np.ndarray, mean: np.ndarray) -> np.ndarray | None:
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "Gemm":
        if attrs.get("transA", 0):
            return None
        matrix = error if attrs.get("transB", 0) else error.T  # [out, in]
        return float(attrs.get("alpha", 1.0)) * (matrix @ mean)
    group = int(attrs.get("group", 1))
    out_channels, in_per_group = error.shape[:2]
    if mean.shape[0] != in_per_group * group:
        return None
    per_input = error.reshape(out_channels, in_per_group, -1).sum(axis=2)
    group_of_output = np.arange(out_channels) // (out_channels // group)
    channel_means = mean.reshape(group, in_per_group)[group_of_output]
    return (per_input * channel_means).sum(axis=1)  # padding ignored: borders are few


def _dequantized_weights(quantized: onnx.ModelProto) -> dict[str, np.ndarray]:
    inits = {i.name: numpy_helper.to_array(i) for i in quantized.graph.initializer}
    producer = {out: n for n in quantized.graph.node for out in n.output}
    weights = {}
    for node in quantized.graph.node:
        if node.op_type not in CORRECTED_OPS or len(node.input) < 2:
            continue
        dq = producer.get(node.input[1])
        if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] not in inits:
            continue
        values = inits[dq.input[0]].astype(np.float64)
        scale = inits[dq.input[1]].astype(np.float64)
        zero = inits[dq.input[2]].astype(np.float64) if len(dq.input) > 2 else np.zeros(1)
        axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
        if scale.size > 1:
            shape = [1] * values.ndim
            shape[axis] = -1
            scale, zero = scale.reshape(shape), zero.reshape(shape)
        weights[node.name] = (values - zero) * scale
    return weights


def _input_means(model: onnx.ModelProto, tensors: list[str], samples: SampleSet,
                 settings: RuntimeSettings) -> dict[str, np.ndarray]:
    """Per-channel (axis 1) mean of each tensor over the samples."""
    return _output_means(model, tensors, samples, settings, simulate=False)


def _output_means(model: onnx.ModelProto, tensors: list[str], samples: SampleSet,
                  settings: RuntimeSettings, simulate: bool) -> dict[str, np.ndarray]:
    """Per-channel (axis 1) mean of each tensor over the samples; ``simulate`` runs a QDQ
    model unfused (exposing its inner tensors would stop the INT8 fusions anyway)."""
    probe = copy.deepcopy(model)
    known = {n for node in probe.graph.node for n in node.output} | {
        i.name for i in probe.graph.input}
    names = sorted(set(tensors) & known)
    if not names:
        return {}
    outputs = {o.name for o in probe.graph.output}
    for name in names:
        if name not in outputs:
            probe.graph.output.append(helper.make_empty_tensor_value_info(name))
    session = _simulating_session(probe, settings) if simulate else \
        open_session(probe.SerializeToString(), settings)
    feeds_names = {i.name for i in session.get_inputs()}
    sums: dict[str, np.ndarray] = {}
    count = 0
    for batch in samples.batches(8):
        values = session.run(names, {k: v for k, v in batch.items() if k in feeds_names})
        size = len(next(iter(batch.values())))
        for name, value in zip(names, values, strict=True):
            axes = (0, *range(2, value.ndim))
            sums[name] = sums.get(name, 0) + value.astype(np.float64).mean(axis=axes) * size
        count += size
    return {name: total / count for name, total in sums.items()}


def _simulating_session(model: onnx.ModelProto, settings: RuntimeSettings) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = settings.intra_op_threads
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=list(settings.providers))
