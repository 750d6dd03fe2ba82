"""Accuracy repair: find the layers INT8 hurts most and keep them in float.

Sensitivity is measured where it matters, at the model's outputs, on calibration data
(never the evaluation set):

- static QDQ: start from the fully quantized model (activations kept as nodes) and, one
  layer at a time, run that layer in float (float weights, no Q/DQ on its output) by
  editing the graph; the drop in output noise (||y - y_fp32||^2 / ||y_fp32||^2) is the
  layer's sensitivity. Per-tensor SQNR inside the network (``qdq_loss_debug``'s view)
  ranks late layers first because noise accumulates; measured on EfficientNet-Lite0,
  keeping those float barely helps, while the early layers this ranking finds do.
- dynamic INT8: each MatMul's own error, simulated in numpy on its real inputs.

The greedy loop then keeps the top-k layers float for k = 1, 2, 3, 4, 6, 8, ... up to a
cap, re-quantizing with the calibrated ranges and checking the budget on the evaluation
set, then bisects down to the smallest k that meets it. A layer is a node plus the
activation fused into it (Conv+Clip): leaving a Clip quantized behind a float Conv
quantizes the pre-activation with a range it does not have.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from converters.datasets import SampleSet
from converters.metrics import Accuracy, AccuracyBudget
from converters.runtime import RuntimeSettings, open_session, run_batches

FUSED_ACTIVATIONS = ("Clip", "Relu")


@dataclass(frozen=True)
class LayerSensitivity:
    layer: str  # root node name
    nodes: tuple[str, ...]  # root + fused activation
    op_type: str
    score: float  # output noise removed by keeping this layer float


@dataclass(frozen=True)
class RepairIteration:
    float_layers: int
    float_nodes: int
    violations: tuple[str, ...]
    top1_drop: float | None
    cosine: float


@dataclass(frozen=True)
class RepairOutcome:
    accepted: bool
    float_nodes: tuple[str, ...]
    iterations: tuple[RepairIteration, ...]
    reason: str
    ranking: tuple[LayerSensitivity, ...]
    result: Any = None  # (what build_and_measure built, its Accuracy) for the accepted set


def layer_groups(model: onnx.ModelProto, quantized: onnx.ModelProto) -> list[tuple[str, ...]]:
    """Quantized layers of ``model`` (root node + fused activation), in graph order."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    produced_by_dq = {n.output[0] for n in quantized.graph.node if n.op_type == "DequantizeLinear"}
    quantized_nodes = {
        n.name for n in quantized.graph.node
        if n.op_type not in ("QuantizeLinear", "DequantizeLinear")
        and any(i in produced_by_dq for i in n.input)
    }
    groups = []
    for node in model.graph.node:
        if node.op_type in FUSED_ACTIVATIONS or node.name not in quantized_nodes:
            continue
        members = [node.name]
        following = consumers.get(node.output[0], [])
        if len(following) == 1 and following[0].op_type in FUSED_ACTIVATIONS:
            members.append(following[0].name)
        groups.append(tuple(members))
    return groups


def floatify(
    quantized: onnx.ModelProto, float_model: onnx.ModelProto, members: Sequence[str]
) -> onnx.ModelProto:
    """``quantized`` with ``members`` computing in float: float weights/bias, and the
    Q/DQ pairs on their outputs bypassed (replaced by Identity, so graph outputs stay)."""
    model = copy.deepcopy(quantized)
    graph = model.graph
    float_nodes = {n.name: n for n in float_model.graph.node}
    float_inits = {i.name: i for i in float_model.graph.initializer}
    producer = {out: n for n in graph.node for out in n.output}
    initializers = {i.name for i in graph.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    by_name = {n.name: n for n in graph.node}
    drop: list[onnx.NodeProto] = []
    for name in members:
        node, original = by_name.get(name), float_nodes.get(name)
        if node is None or original is None:
            continue
        for index, tensor in enumerate(node.input):
            dq = producer.get(tensor)
            if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] not in initializers:
                continue
            source = original.input[index]
            if source not in float_inits:
                continue
            weight = copy.deepcopy(float_inits[source])
            weight.name = f"{source}__float"
            graph.initializer.append(weight)
            node.input[index] = weight.name
        for tensor in node.output:
            for q in [c for c in consumers.get(tensor, []) if c.op_type == "QuantizeLinear"]:
                for dq in [c for c in consumers.get(q.output[0], [])
                           if c.op_type == "DequantizeLinear"]:
                    graph.node.append(helper.make_node(
                        "Identity", [tensor], [dq.output[0]], name=f"{dq.name}__float"))
                    drop.append(dq)
                drop.append(q)
    for node in drop:
        if node in graph.node:
            graph.node.remove(node)
    return model


def output_noise(reference: Sequence[dict[str, np.ndarray]],
                 candidate: Sequence[dict[str, np.ndarray]]) -> float:
    """Noise-to-signal ratio summed over outputs and batches."""
    noise = signal = 0.0
    for ref, got in zip(reference, candidate, strict=True):
        for name, value in ref.items():
            ref64 = value.astype(np.float64)
            noise += float(np.sum((ref64 - got[name].astype(np.float64)) ** 2))
            signal += float(np.sum(ref64**2))
    return noise / signal if signal > 0 else 0.0


def static_sensitivity(
    float_model: onnx.ModelProto,
    analysis_model: onnx.ModelProto,
    samples: SampleSet,
    settings: RuntimeSettings,
    progress: Callable[[float], None] = lambda _: None,
) -> list[LayerSensitivity]:
    """Rank layers by the output noise removed when each alone runs in float."""
    reference = run_batches(open_session(float_model.SerializeToString(), settings), samples)
    base = output_noise(
        reference, run_batches(open_session(analysis_model.SerializeToString(), settings), samples)
    )
    op_type = {n.name: n.op_type for n in float_model.graph.node}
    groups = layer_groups(float_model, analysis_model)
    ranking = []
    for index, members in enumerate(groups):
        trial = floatify(analysis_model, float_model, members)
        outputs = run_batches(open_session(trial.SerializeToString(), settings), samples)
        score = base - output_noise(reference, outputs)
        ranking.append(LayerSensitivity(members[0], members, op_type[members[0]], score))
        progress((index + 1) / len(groups))
    return sorted(ranking, key=lambda s: -s.score)


def dynamic_sensitivity(
    float_model: onnx.ModelProto,
    samples: SampleSet,
    per_channel: bool,
    settings: RuntimeSettings,
) -> list[LayerSensitivity]:
    """Each MatMul's own error under dynamic quantization (u8 activations per tensor, s8
    weights), simulated in numpy on the inputs it really sees."""
    weights = {i.name: numpy_helper.to_array(i) for i in float_model.graph.initializer}
    matmuls = [
        n for n in float_model.graph.node
        if n.op_type == "MatMul" and n.input[1] in weights and weights[n.input[1]].ndim == 2
    ]
    probe = copy.deepcopy(float_model)
    existing = {o.name for o in probe.graph.output}
    for node in matmuls:
        if node.input[0] not in existing:
            probe.graph.output.append(helper.make_empty_tensor_value_info(node.input[0]))
            existing.add(node.input[0])
    session = open_session(probe.SerializeToString(), settings)
    names = sorted({n.input[0] for n in matmuls})
    batches = run_batches(session, samples, outputs=names)
    ranking = []
    for node in matmuls:
        weight = weights[node.input[1]].astype(np.float64)
        noise = signal = 0.0
        for batch in batches:
            x = batch[node.input[0]].astype(np.float64)
            exact = x @ weight
            approx = _fake_quant_u8(x) @ _fake_quant_s8(weight, per_channel)
            noise += float(np.sum((exact - approx) ** 2))
            signal += float(np.sum(exact**2))
        score = noise / signal if signal > 0 else 0.0
        ranking.append(LayerSensitivity(node.name, (node.name,), node.op_type, score))
    return sorted(ranking, key=lambda s: -s.score)


def _fake_quant_u8(x: np.ndarray) -> np.ndarray:
    low, high = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    scale = (high - low) / 255.0 or 1.0
    zero = np.round(-low / scale)
    return (np.clip(np.round(x / scale) + zero, 0, 255) - zero) * scale


def _fake_quant_s8(w: np.ndarray, per_channel: bool) -> np.ndarray:
    peak = np.max(np.abs(w), axis=0, keepdims=True) if per_channel else np.max(np.abs(w))
    scale = np.where(peak > 0, peak / 127.0, 1.0)
    return np.clip(np.round(w / scale), -127, 127) * scale


def k_schedule(layers: int, cap: int) -> list[int]:
    """1, 2, 3, 4, 6, 8, 12, 16, ... (about x1.4 each) up to ``cap`` (inclusive)."""
    steps, k = [], 1
    while k < cap:
        steps.append(k)
        k = max(k + 1, round(k * 1.4))
    steps.append(min(cap, layers))
    return sorted(set(s for s in steps if 0 < s <= layers))


def greedy_repair(
    ranking: Sequence[LayerSensitivity],
    build_and_measure: Callable[[tuple[str, ...]], tuple[Any, Accuracy]],
    budget: AccuracyBudget,
    max_float_fraction: float = 0.5,
    progress: Callable[[str], None] = lambda _: None,
    patience: int = 3,
) -> RepairOutcome:
    """Smallest k (within the schedule, then bisected) whose top-k float layers meet the
    budget. Rejected with the reason when the cap is reached first, or when ``patience``
    steps in a row fail to shrink the shortfall by 10% (more float layers stopped
    helping: what is left is noise on samples the FP32 model barely decides)."""
    useful = [s for s in ranking if s.score > 0] or list(ranking)
    cap = max(1, int(len(ranking) * max_float_fraction))
    history: list[RepairIteration] = []
    tried: dict[int, tuple[Any, Accuracy]] = {}

    def attempt(k: int) -> bool:
        nodes = tuple(n for s in useful[:k] for n in s.nodes)
        result, accuracy = build_and_measure(nodes)
        tried[k] = (result, accuracy)
        violations = tuple(budget.violations(accuracy))
        history.append(RepairIteration(k, len(nodes), violations, accuracy.top1_drop,
                                       accuracy.cosine))
        progress(f"{k} layer(s) float: " + ("meets the budget" if not violations
                                              else "; ".join(violations)))
        return not violations

    failed, passed = 0, None
    best, stalled = float("inf"), 0
    for k in k_schedule(len(useful), min(cap, len(useful))):
        if attempt(k):
            passed = k
            break
        failed = k
        gap = budget.shortfall(tried[k][1])
        best, stalled = (gap, 0) if gap < 0.9 * best else (best, stalled + 1)
        if stalled >= patience:
            break
    if passed is None:
        return RepairOutcome(False, (), tuple(history),
                             _rejection(history, tried, len(ranking), max_float_fraction,
                                        stalled >= patience, budget),
                             tuple(ranking))
    while passed - failed > 1:
        middle = (passed + failed) // 2
        if attempt(middle):
            passed = middle
        else:
            failed = middle
    nodes = tuple(n for s in useful[:passed] for n in s.nodes)
    layers = ", ".join(s.layer for s in useful[:passed][:6])
    more = f" and {passed - 6} more" if passed > 6 else ""
    return RepairOutcome(
        True, nodes, tuple(history),
        f"budget met with {passed} of {len(ranking)} layers kept float: {layers}{more}",
        tuple(ranking), tried[passed],
    )


def _rejection(history: Sequence[RepairIteration], tried: dict[int, tuple[Any, Accuracy]],
               layers: int, cap: float, stalled: bool, budget: AccuracyBudget) -> str:
    if not history:
        return "INT8 rejected: no layer to keep float"
    best_k = min(tried, key=lambda k: (budget.shortfall(tried[k][1]), k))
    best = next(h for h in history if h.float_layers == best_k)
    why = (f"keeping up to {history[-1].float_layers} of {layers} layers float stopped "
           "improving accuracy" if stalled
           else f"the cap of {cap:.0%} of {layers} layers was reached")
    detail = f"INT8 rejected: {why}; best with {best_k} float: {'; '.join(best.violations)}"
    agreement = tried[best_k][1].classification
    if agreement is not None and agreement.flips:
        detail += (f" ({agreement.undecided_flips} of {agreement.flips} changed answers are "
                   f"samples whose FP32 top-2 margin is under 5%)")
    return detail
