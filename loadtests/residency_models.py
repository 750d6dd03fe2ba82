"""The residency benchmark's models: MLPs of three sizes, made by the converter.

Every model takes the same input (``x``: FP32 ``[batch, 256]``) and gives the same output
(``y``: FP32 ``[batch, 16]``), so one request body serves all of them; each has weights of
its own (a seed per model), so no two files are alike. ``y = relu(relu(x W1) W2) W3`` with
``W1`` [256, H], ``W2`` [H, H], ``W3`` [H, 16]: H sets the weights' size.

Built once into a cache folder (a Triton repository) and reused: a model whose folder has
a published version is not converted again.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from converters.model_dir import read_footprint
from converters.pipeline import ConversionRequest, convert
from converters.repository import existing_versions
from loadtests.harness import refresh_runtime

INPUT_WIDTH = 256
OUTPUT_WIDTH = 16
INPUT_NAME, OUTPUT_NAME = "x", "y"
MAX_BATCH = 8


@dataclass(frozen=True)
class SizeClass:
    label: str
    weight_bytes: int  # aimed at
    count: int

    @property
    def hidden(self) -> int:
        """H whose weights (256 H + H^2 + 16 H floats) come closest to ``weight_bytes``."""
        floats = self.weight_bytes / 4
        b = INPUT_WIDTH + OUTPUT_WIDTH
        return max(8, round((-b + math.sqrt(b * b + 4 * floats)) / 2))


# 36 models: many small ones, fewer large ones (a team's catalogue). On this host a
# member's Python-backend stub of each takes 31, 64 and 131 MB (its USS once loaded:
# ~30 MB of runtime and about 1.0x the weights), near issue 34's check (30, 65, 140)
SIZES = (SizeClass("1MB", 1_000_000, 14), SizeClass("32MB", 32_000_000, 12),
         SizeClass("100MB", 100_000_000, 10))


def catalogue_name(sizes: Sequence[SizeClass] = SIZES) -> str:
    """``14x1mb-12x32mb-10x100mb``: the cache folder's name, so that a catalogue of other
    sizes never shares a repository with this one (a model the benchmark does not list
    would be pinned on every member by the gateway)."""
    return "-".join(f"{s.count}x{s.label.lower()}" for s in sizes)


@dataclass(frozen=True)
class BenchModel:
    name: str
    size: str  # its size class's label
    weight_bytes: int  # of its ONNX initialisers
    footprint_bytes: int | None  # the converter's measurement (None: not measured)


def model_names(sizes: Sequence[SizeClass] = SIZES) -> list[tuple[str, SizeClass]]:
    """``m00_1mb``, ``m01_1mb``... and each one's size class, in catalogue order (the
    size in the name: a cached model of that name has that size)."""
    classes = [size for size in sizes for _ in range(size.count)]
    return [(f"m{i:02d}_{size.label.lower()}", size) for i, size in enumerate(classes)]


def mlp_onnx(path: Path, hidden: int, seed: int) -> int:
    """Write the MLP; the bytes of its weights."""
    rng = np.random.default_rng(seed)
    shapes = {"w1": (INPUT_WIDTH, hidden), "w2": (hidden, hidden), "w3": (hidden, OUTPUT_WIDTH)}
    weights = [numpy_helper.from_array(
        (rng.standard_normal(shape) / math.sqrt(shape[0])).astype(np.float32), name)
        for name, shape in shapes.items()]
    nodes = [helper.make_node("MatMul", [INPUT_NAME, "w1"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["a1"]),
             helper.make_node("MatMul", ["a1", "w2"], ["h2"]),
             helper.make_node("Relu", ["h2"], ["a2"]),
             helper.make_node("MatMul", ["a2", "w3"], [OUTPUT_NAME])]
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["batch", INPUT_WIDTH])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["batch", OUTPUT_WIDTH])],
        weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return sum(int(np.prod(s)) * 4 for s in shapes.values())


def build_models(repo: Path, sizes: Sequence[SizeClass] = SIZES,
                 say: Callable[[str], None] = print) -> list[BenchModel]:
    """Every model in ``repo`` (converted FP32 by the converter where not there yet)."""
    repo.mkdir(parents=True, exist_ok=True)
    models = []
    for index, (name, size) in enumerate(model_names(sizes)):
        hidden = size.hidden
        weight_bytes = 4 * hidden * (INPUT_WIDTH + hidden + OUTPUT_WIDTH)
        versions = existing_versions(repo, name)
        for version in versions:  # built earlier: its weights kept, today's runtime code
            if refresh_runtime(repo / name / str(version)):
                say(f"{name} v{version}: model.py as the converter writes it today")
        if not versions:
            with tempfile.TemporaryDirectory() as tmp:
                source = Path(tmp) / f"{name}.onnx"
                mlp_onnx(source, hidden, seed=1000 + index)
                convert(ConversionRequest(
                    source=str(source), name=name, repo=repo, precisions=("fp32",),
                    max_batch_size=MAX_BATCH, intra_op_threads=1, profile_iterations=2,
                    profile_warmup=1))
            say(f"converted {name} ({size.label}: H={hidden}, "
                f"{weight_bytes / 1e6:.1f} MB of weights)")
        models.append(BenchModel(name, size.label, weight_bytes, read_footprint(repo / name)))
    return models


def request_body(seed: int = 0) -> bytes:
    """One HTTP/JSON inference request every model answers (batch 1)."""
    x = np.random.default_rng(seed).standard_normal(INPUT_WIDTH).astype(np.float32)
    return json.dumps({"inputs": [{"name": INPUT_NAME, "shape": [1, INPUT_WIDTH],
                                   "datatype": "FP32", "data": [round(float(v), 5) for v in x]}]
                       }).encode()
