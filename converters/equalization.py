"""Cross-layer equalization (Nagel et al., "Data-Free Quantization", 2019).

For two convolutions in a row, ``conv2(f(conv1(x)))`` with ``f`` positively homogeneous
(identity or ReLU), scaling output channel ``i`` of ``conv1`` by ``1/s_i`` and input
channel ``i`` of ``conv2`` by ``s_i`` computes the same function. Choosing
``s_i = sqrt(r1_i / r2_i)`` (``r`` = the channel's weight range) gives both layers equal
per-channel ranges, which per-tensor weight quantization needs.

Only pairs where the rescaling is exact are equalized: ``conv1``'s output feeds ``conv2``
alone, through nothing or a ReLU. ReLU6 (``Clip(0, 6)``) is not homogeneous: rescaling
through it would move the clipping point per channel, which a scalar ``Clip`` cannot
express, so those pairs are left alone (on EfficientNet-Lite0 that is most of them: its
report says how many pairs were equalized).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

HOMOGENEOUS = ("Relu",)


@dataclass(frozen=True)
class Equalization:
    model: onnx.ModelProto
    pairs: tuple[tuple[str, str], ...]  # (conv1, conv2) node names that were equalized
    candidates: int  # consecutive conv pairs seen (equalizable or not)


def _conv_pairs(model: onnx.ModelProto) -> tuple[list[tuple[onnx.NodeProto, onnx.NodeProto]],
                                                  int]:
    inits = {i.name for i in model.graph.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    outputs = {o.name for o in model.graph.output}
    pairs, candidates = [], 0
    for node in model.graph.node:
        if node.op_type != "Conv" or len(node.input) < 2 or node.input[1] not in inits:
            continue
        tensor, via = node.output[0], consumers.get(node.output[0], [])
        if len(via) == 1 and via[0].op_type in (*HOMOGENEOUS, "Clip"):
            tensor, via = via[0].output[0], consumers.get(via[0].output[0], [])
            through = consumers[node.output[0]][0].op_type
        else:
            through = ""
        if len(via) != 1 or via[0].op_type != "Conv" or tensor in outputs:
            continue
        candidates += 1
        second = via[0]
        if through == "Clip" or second.input[1] not in inits or _group(second) != 1:
            continue
        pairs.append((node, second))
    return pairs, candidates


def _group(node: onnx.NodeProto) -> int:
    return next((int(a.i) for a in node.attribute if a.name == "group"), 1)


def equalize(model: onnx.ModelProto, iterations: int = 2) -> Equalization:
    """A copy of ``model`` with every exactly-rescalable conv pair equalized."""
    result = copy.deepcopy(model)
    inits = {i.name: i for i in result.graph.initializer}
    pairs, candidates = _conv_pairs(result)
    users: dict[str, int] = {}
    for node in result.graph.node:
        for name in node.input:
            users[name] = users.get(name, 0) + 1
    done = []
    for first, second in pairs:
        names = [first.input[1], second.input[1], *(first.input[2:3])]
        if any(users.get(n, 0) != 1 for n in names):
            continue  # a shared weight cannot be rescaled for one layer only
        w1 = numpy_helper.to_array(inits[first.input[1]]).astype(np.float64)
        w2 = numpy_helper.to_array(inits[second.input[1]]).astype(np.float64)
        if w2.shape[1] != w1.shape[0] or _group(first) not in (1, w1.shape[0]):
            continue
        b1 = numpy_helper.to_array(inits[first.input[2]]).astype(np.float64) \
            if len(first.input) > 2 and first.input[2] else None
        for _ in range(iterations):
            r1 = np.abs(w1).reshape(w1.shape[0], -1).max(axis=1)
            r2 = np.abs(w2).transpose(1, 0, 2, 3).reshape(w2.shape[1], -1).max(axis=1)
            scale = np.where((r1 > 0) & (r2 > 0), np.sqrt(r1 / np.maximum(r2, 1e-12)), 1.0)
            w1 = w1 / scale.reshape(-1, 1, 1, 1)
            w2 = w2 * scale.reshape(1, -1, 1, 1)
            if b1 is not None:
                b1 = b1 / scale
        inits[first.input[1]].CopyFrom(numpy_helper.from_array(w1.astype(np.float32),
                                                               first.input[1]))
        inits[second.input[1]].CopyFrom(numpy_helper.from_array(w2.astype(np.float32),
                                                                second.input[1]))
        if b1 is not None:
            inits[first.input[2]].CopyFrom(numpy_helper.from_array(b1.astype(np.float32),
                                                                   first.input[2]))
        done.append((first.name, second.name))
    return Equalization(result, tuple(done), candidates)
