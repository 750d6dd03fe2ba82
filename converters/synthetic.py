"""Synthetic evaluation inputs: what FP32 and FP16 variants are verified on when the owner
gives no evaluation set (INT8 still needs real calibration and evaluation data).

Drawn from the model's input spec with one fixed seed (:data:`SYNTHETIC_SEED`), so a
model gets the same inputs on every run. Each input, by the first rule that applies:

1. a ``range`` declared in the input spec: uniform within it (integers: every whole
   number from low to high);
2. a float image tensor (3 channels where the declared preprocessing's layout puts them)
   with a declared preprocessing (``--preprocess``): pixels uniform in 0..255, normalised
   with its mean and std;
3. an integer input that indexes an embedding table (an ONNX ``Gather`` on axis 0 of a
   weight, in the checked graph): token ids uniform in [0, rows - 1];
4. an integer or boolean input named like a mask (``attention_mask``): ones;
5. otherwise: floats standard normal; ``uint8`` 0..255; other integers and booleans 0 or 1
   (valid for masks, flags and small indices: declare a range for anything else).

Dynamic non-batch dimensions take the preprocessing's image size for images, else
:data:`DYNAMIC_LENGTH`. :data:`MAX_SAMPLES` samples, fewer for large inputs (the set
stays within :data:`MAX_BYTES`, never under :data:`MIN_SAMPLES`).

Agreement on such inputs says a variant computes the same function as the source model,
not how accurate it is on real data; the report says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import onnx

from converters.datasets import SampleSet, SyntheticOrigin, ValueRange
from converters.images import ImagePreprocessing
from converters.spec import InputSpec, TensorDecl, is_dynamic

SYNTHETIC_SEED = 0
MAX_SAMPLES = 64
MIN_SAMPLES = 8
MAX_BYTES = 64 << 20  # the whole set
DYNAMIC_LENGTH = 16  # a dynamic non-batch dimension (sequence length) outside images
SOURCE = "synthetic"

Draw = Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]


@dataclass(frozen=True)
class _InputPlan:
    tensor: TensorDecl
    shape: tuple[int, ...]  # one sample's, no batch axis
    value_range: ValueRange
    draw: Draw


def synthetic_set(spec: InputSpec, preprocessing: ImagePreprocessing | None = None,
                  embedding_rows: Mapping[str, int] | None = None, limit: int | None = None,
                  seed: int = SYNTHETIC_SEED) -> SampleSet:
    """An evaluation set drawn from ``spec`` (same arguments, same samples)."""
    plans = [_plan(t, preprocessing, (embedding_rows or {}).get(t.name)) for t in spec.inputs]
    sample_bytes = sum(math.prod(p.shape) * np.dtype(p.tensor.dtype).itemsize for p in plans)
    rng = np.random.default_rng(seed)
    samples = tuple(
        {p.tensor.name: p.draw(rng, p.shape).astype(p.tensor.dtype) for p in plans}
        for _ in range(sample_count(sample_bytes, limit))
    )
    return SampleSet("evaluation", SOURCE, samples, None,
                     SyntheticOrigin(seed, tuple(p.value_range for p in plans)))


def sample_count(sample_bytes: int, limit: int | None = None) -> int:
    count = max(MIN_SAMPLES, min(MAX_SAMPLES, MAX_BYTES // max(1, sample_bytes)))
    return min(count, limit) if limit else count


def embedding_rows(model: onnx.ModelProto) -> dict[str, int]:
    """Graph input -> rows of the embedding table it indexes (a ``Gather`` on axis 0 of an
    initializer, directly or through a ``Cast``); the smallest table when several."""
    tables = {i.name: int(i.dims[0]) for i in model.graph.initializer if i.dims}
    origin = {i.name: i.name for i in model.graph.input if i.name not in tables}
    for node in model.graph.node:  # topologically sorted: a Cast before its readers
        if node.op_type == "Cast" and node.input and node.input[0] in origin:
            origin[node.output[0]] = origin[node.input[0]]
    rows: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type != "Gather" or len(node.input) < 2:
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        name, table = origin.get(node.input[1]), tables.get(node.input[0])
        if name is not None and table is not None and axis == 0:
            rows[name] = min(rows.get(name, table), table)
    return rows


def _plan(tensor: TensorDecl, preprocessing: ImagePreprocessing | None,
          rows: int | None) -> _InputPlan:
    kind = np.dtype(tensor.dtype).kind
    image = preprocessing if kind == "f" and _is_image(tensor, preprocessing) else None
    shape = _sample_shape(tensor, image)
    if tensor.value_range is not None:
        low, high = tensor.value_range
        return _uniform(tensor, shape, low, high, "declared in the input spec")
    if image is not None:
        return _image(tensor, shape, image)
    if kind in "iu" and rows:
        return _uniform(tensor, shape, 0, rows - 1,
                        f"token ids: indexes an embedding table of {rows} rows")
    if kind in "biu" and "mask" in tensor.name.lower():
        return _InputPlan(tensor, shape, ValueRange(tensor.name, "ones", 1, 1, "a mask"),
                          lambda rng, s: np.ones(s))
    if kind == "f":
        return _InputPlan(tensor, shape, ValueRange(tensor.name, "normal", None, None,
                                                    "no range known"),
                          lambda rng, s: rng.standard_normal(s))
    if tensor.dtype == "uint8":
        return _uniform(tensor, shape, 0, 255, "uint8: its whole range")
    return _uniform(tensor, shape, 0, 1, "no range known: 0 or 1")


def _uniform(tensor: TensorDecl, shape: tuple[int, ...], low: float, high: float,
             reason: str) -> _InputPlan:
    if np.dtype(tensor.dtype).kind in "biu":
        def draw(rng: np.random.Generator, s: tuple[int, ...]) -> np.ndarray:
            return rng.integers(int(low), int(high), size=s, endpoint=True)
    else:
        def draw(rng: np.random.Generator, s: tuple[int, ...]) -> np.ndarray:
            return rng.uniform(low, high, size=s)
    return _InputPlan(tensor, shape, ValueRange(tensor.name, "uniform", low, high, reason),
                      draw)


def _image(tensor: TensorDecl, shape: tuple[int, ...],
           preprocessing: ImagePreprocessing) -> _InputPlan:
    channel = _channel_axis(preprocessing)
    stats = [np.reshape(np.asarray(v, np.float64), [3 if a == channel else 1 for a in range(3)])
             for v in (preprocessing.mean, preprocessing.std)]
    mean, std = stats
    lows, highs = (0 - mean) / std, (255 - mean) / std

    def draw(rng: np.random.Generator, s: tuple[int, ...]) -> np.ndarray:
        return (rng.uniform(0, 255, size=s) - mean) / std

    reason = (f"image: pixels uniform in 0..255, normalised with the declared preprocessing "
              f"(mean {list(preprocessing.mean)}, std {list(preprocessing.std)})")
    return _InputPlan(tensor, shape, ValueRange(tensor.name, "uniform", float(lows.min()),
                                                float(highs.max()), reason), draw)


def _channel_axis(preprocessing: ImagePreprocessing) -> int:
    return 0 if preprocessing.layout == "NCHW" else 2


def _is_image(tensor: TensorDecl, preprocessing: ImagePreprocessing | None) -> bool:
    dims = tensor.shape[1:]
    if preprocessing is None or len(dims) != 3:
        return False
    channels = dims[_channel_axis(preprocessing)]
    return is_dynamic(channels) or channels == 3


def _sample_shape(tensor: TensorDecl, image: ImagePreprocessing | None) -> tuple[int, ...]:
    def size(axis: int, dim: int | str) -> int:
        if not is_dynamic(dim):
            return int(dim)
        if image is None:
            return DYNAMIC_LENGTH
        return 3 if axis == _channel_axis(image) else image.size

    return tuple(size(axis, dim) for axis, dim in enumerate(tensor.shape[1:]))
