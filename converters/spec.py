"""What a model takes: names, dtypes and shapes with dynamic dimensions.

Shapes include the batch axis. A dimension is an ``int`` (fixed) or a name / ``-1``
(dynamic): ``input:float32[batch,3,224,224]``, ``input_ids:int64[batch,sequence]``.
Datatypes are numpy names (``float32``) or Triton names (``FP32``); both are accepted.
The first axis is the batch axis when it is dynamic; its name is kept for the export.
The JSON form may give an input's value ``range`` (``[low, high]``, both ends included:
``[0, 30521]`` for token ids of a 30,522-word vocabulary); synthetic evaluation inputs
(:mod:`converters.synthetic`) are drawn within it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from converters.errors import InputSpecMismatch, InvalidRequest
from converters.triton_config import NUMPY_TO_TRITON

Dim = int | str
MAX_NAME = 128  # characters in an input's name
TRITON_TO_NUMPY = {v: k for k, v in NUMPY_TO_TRITON.items()}
ONNX_TO_NUMPY = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.DOUBLE: "float64",
    onnx.TensorProto.INT8: "int8",
    onnx.TensorProto.INT16: "int16",
    onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.UINT8: "uint8",
    onnx.TensorProto.BOOL: "bool",
}
_DECL_RE = re.compile(r"^\s*([A-Za-z_][\w.:/-]*)\s*:\s*(\w+)\s*\[([^\]]*)\]\s*$")


def numpy_dtype_name(datatype: str) -> str:
    """``FP32``/``TYPE_FP32``/``float32`` -> ``float32``."""
    name = datatype.strip()
    upper = name.upper().removeprefix("TYPE_")
    if upper in TRITON_TO_NUMPY:
        return TRITON_TO_NUMPY[upper]
    if name.lower() in NUMPY_TO_TRITON:
        return name.lower()
    raise InvalidRequest(
        f"unknown datatype {datatype!r}: use one of {', '.join(sorted(NUMPY_TO_TRITON))} "
        f"or {', '.join(sorted(TRITON_TO_NUMPY))}"
    )


def is_dynamic(dim: Dim) -> bool:
    return isinstance(dim, str) or dim < 0


@dataclass(frozen=True)
class TensorDecl:
    """One input: the converter's, the upload spec's and the CLI's one type.

    Its JSON form (:meth:`from_mapping`, :meth:`to_wire`) is Triton's:
    ``{"name": "input", "datatype": "FP32", "shape": ["batch", 3, 224, 224]}``, with an
    optional ``"range": [low, high]`` (the values the input takes, both ends included).
    """

    name: str
    dtype: str  # numpy name
    shape: tuple[Dim, ...]  # includes the batch axis
    value_range: tuple[float, float] | None = None  # JSON "range"

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidRequest("an input's name is empty")
        if self.dtype not in NUMPY_TO_TRITON:
            raise InvalidRequest(f"input {self.name!r}: dtype {self.dtype!r} is not one of "
                                 f"{', '.join(sorted(NUMPY_TO_TRITON))}")
        for dim in self.shape:
            if isinstance(dim, bool) or not isinstance(dim, int | str):
                raise InvalidRequest(f"input {self.name!r}: dimension {dim!r} is neither a "
                                     "number nor a name")
            if isinstance(dim, int) and dim < 1 and dim != -1:
                raise InvalidRequest(f"input {self.name!r}: dimension {dim} must be >= 1, -1 "
                                     "or a name")
            if isinstance(dim, str) and not dim.strip():
                raise InvalidRequest(f"input {self.name!r}: empty dimension name")
        if self.value_range is not None:
            self._check_range(self.value_range)

    def _check_range(self, bounds: tuple[float, float]) -> None:
        numbers = isinstance(bounds, tuple) and len(bounds) == 2 and all(
            isinstance(b, int | float) and not isinstance(b, bool) and np.isfinite(b)
            for b in bounds)
        if not numbers or bounds[0] > bounds[1]:
            raise InvalidRequest(f"input {self.name!r}: range {list(bounds)} must be two "
                                 "numbers [low, high] with low <= high")
        if np.dtype(self.dtype).kind in "biu" and not all(float(b).is_integer()
                                                          for b in bounds):
            raise InvalidRequest(f"input {self.name!r}: range {list(bounds)} of a "
                                 f"{self.dtype} input must be whole numbers")

    @classmethod
    def from_mapping(cls, item: Mapping[str, Any]) -> TensorDecl:
        """``{"name", "datatype" (or "dtype"), "shape"}``; Triton or numpy type names."""
        if not isinstance(item, Mapping):
            raise InvalidRequest(f"an input is an object with name, datatype and shape, "
                                 f"not {item!r}")
        unknown = sorted(set(item) - {"name", "datatype", "dtype", "shape", "range"})
        if unknown:
            raise InvalidRequest(f"input entry has unknown fields {unknown} (it takes name, "
                                 "datatype, shape and range)")
        dtype = item.get("datatype", item.get("dtype"))
        missing = [k for k, v in (("name", item.get("name")), ("datatype", dtype),
                                  ("shape", item.get("shape"))) if v is None]
        if missing:
            raise InvalidRequest(f"input entry {dict(item)} lacks {', '.join(missing)}")
        name, shape = item["name"], item["shape"]
        if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME:
            raise InvalidRequest(f"input name {name!r} must be a string of 1 to {MAX_NAME} "
                                 "characters")
        if isinstance(shape, str | bytes) or not isinstance(shape, Iterable):
            raise InvalidRequest(f"input {name!r}: shape must be a list, not {shape!r}")
        bounds = item.get("range")
        if bounds is not None:
            if isinstance(bounds, str | bytes | Mapping) or not isinstance(bounds, Iterable):
                raise InvalidRequest(f"input {name!r}: range must be a list [low, high], "
                                     f"not {bounds!r}")
            bounds = tuple(bounds)
        return cls(name, numpy_dtype_name(str(dtype)), _dims(shape), bounds)

    def to_wire(self) -> dict[str, Any]:
        """The JSON form :meth:`from_mapping` reads (Triton's datatype names)."""
        wire = {"name": self.name, "datatype": self.triton_datatype, "shape": list(self.shape)}
        return {**wire, "range": list(self.value_range)} if self.value_range else wire

    @property
    def triton_datatype(self) -> str:
        return NUMPY_TO_TRITON[self.dtype]

    @property
    def batched(self) -> bool:
        return bool(self.shape) and is_dynamic(self.shape[0])

    def dynamic_axes(self) -> dict[int, str]:
        """Axis -> symbolic name, for ``torch.onnx.export(dynamic_axes=...)``."""
        axes = {}
        for axis, dim in enumerate(self.shape):
            if is_dynamic(dim):
                axes[axis] = dim if isinstance(dim, str) else ("batch" if axis == 0 else f"d{axis}")
        return axes

    def triton_dims(self) -> tuple[int, ...]:
        """Config dims without the batch axis; -1 for dynamic ones."""
        dims = self.shape[1:] if self.batched else self.shape
        return tuple(-1 if is_dynamic(d) else int(d) for d in dims)

    def to_dict(self) -> dict[str, Any]:
        plain = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}
        return {**plain, "range": list(self.value_range)} if self.value_range else plain


@dataclass(frozen=True)
class InputSpec:
    inputs: tuple[TensorDecl, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.inputs)

    @property
    def batched(self) -> bool:
        return bool(self.inputs) and all(t.batched for t in self.inputs)

    def __getitem__(self, name: str) -> TensorDecl:
        for tensor in self.inputs:
            if tensor.name == name:
                return tensor
        raise KeyError(name)

    def to_dict(self) -> list[dict[str, Any]]:
        return [t.to_dict() for t in self.inputs]

    def check_sample(self, sample: Mapping[str, np.ndarray], where: str) -> None:
        """A sample (no batch axis) must carry every input with the declared dtype/rank."""
        missing = [n for n in self.names if n not in sample]
        if missing:
            raise InputSpecMismatch(
                f"{where} has no array for input(s) {missing} (it has {sorted(sample)})"
            )
        for tensor in self.inputs:
            array = sample[tensor.name]
            dims = tensor.shape[1:] if tensor.batched else tensor.shape
            if array.dtype != np.dtype(tensor.dtype):
                raise InputSpecMismatch(
                    f"{where}: input {tensor.name!r} is {array.dtype}, the model takes "
                    f"{tensor.dtype}"
                )
            if array.ndim != len(dims) or any(
                not is_dynamic(d) and int(d) != s for d, s in zip(dims, array.shape, strict=False)
            ):
                raise InputSpecMismatch(
                    f"{where}: input {tensor.name!r} has shape {list(array.shape)} per sample, "
                    f"the model takes {list(dims)}"
                )


def parse_input_spec(text: str) -> InputSpec:
    """``name:dtype[d0,d1,...]`` entries separated by ``;``, or a JSON list / JSON file
    of ``{"name", "datatype"|"dtype", "shape"}`` objects."""
    text = text.strip()
    if text.endswith(".json") and Path(text).is_file():
        text = Path(text).read_text()
    if text.startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidRequest(f"input spec is not valid JSON: {exc}") from None
        return InputSpec(tuple(TensorDecl.from_mapping(item) for item in items))
    decls = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        match = _DECL_RE.match(part)
        if not match:
            raise InvalidRequest(
                f"cannot read input spec entry {part!r}: expected name:dtype[dim,...], "
                "e.g. input:float32[batch,3,224,224]"
            )
        name, dtype, dims = match.groups()
        decls.append(TensorDecl(name, numpy_dtype_name(dtype), _dims(dims.split(","))))
    if not decls:
        raise InvalidRequest("input spec is empty")
    return InputSpec(tuple(decls))


def _dims(raw: Iterable[Any]) -> tuple[Dim, ...]:
    dims: list[Dim] = []
    for value in raw:
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise InvalidRequest(f"dimension {value!r} is neither a whole number nor a name")
        text = str(value).strip()
        if not text:
            raise InvalidRequest("empty dimension in input spec")
        dims.append(int(text) if re.fullmatch(r"-?\d+", text) else text)
    return tuple(dims)  # checked by TensorDecl


def spec_from_onnx(model: onnx.ModelProto) -> InputSpec:
    """The graph's own inputs (initializers excluded) as an input spec."""
    initializers = {i.name for i in model.graph.initializer}
    decls = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor_type = value.type.tensor_type
        dtype = ONNX_TO_NUMPY.get(tensor_type.elem_type)
        if dtype is None:
            raise InputSpecMismatch(
                f"input {value.name!r} has ONNX element type {tensor_type.elem_type}, which "
                "the converter does not serve"
            )
        shape: list[Dim] = []
        for axis, dim in enumerate(tensor_type.shape.dim):
            if dim.HasField("dim_value") and dim.dim_value > 0:
                shape.append(int(dim.dim_value))
            else:
                shape.append(dim.dim_param or ("batch" if axis == 0 else f"d{axis}"))
        decls.append(TensorDecl(value.name, dtype, tuple(shape)))
    return InputSpec(tuple(decls))


def check_spec_matches(declared: InputSpec, model_spec: InputSpec) -> None:
    """Raise :class:`InputSpecMismatch` naming the first difference that matters."""
    model_names, declared_names = set(model_spec.names), set(declared.names)
    if model_names != declared_names:
        raise InputSpecMismatch(
            f"input spec names {sorted(declared_names)} but the model's inputs are "
            f"{sorted(model_names)}"
        )
    for decl in declared.inputs:
        actual = model_spec[decl.name]
        if decl.dtype != actual.dtype:
            raise InputSpecMismatch(
                f"input {decl.name!r}: spec says {decl.dtype}, the model takes {actual.dtype}"
            )
        if len(decl.shape) != len(actual.shape):
            raise InputSpecMismatch(
                f"input {decl.name!r}: spec has rank {len(decl.shape)} {list(decl.shape)}, "
                f"the model has rank {len(actual.shape)} {list(actual.shape)}"
            )
        for axis, (want, have) in enumerate(zip(decl.shape, actual.shape, strict=True)):
            if not is_dynamic(want) and not is_dynamic(have) and want != have:
                raise InputSpecMismatch(
                    f"input {decl.name!r} axis {axis}: spec says {want}, the model has {have}"
                )
            if is_dynamic(want) and not is_dynamic(have):
                raise InputSpecMismatch(
                    f"input {decl.name!r} axis {axis}: spec says dynamic ({want}), the model "
                    f"fixes it to {have}; re-export with a dynamic axis"
                )


def describe(spec: InputSpec) -> str:
    return "; ".join(f"{t.name}:{t.dtype}[{','.join(map(str, t.shape))}]" for t in spec.inputs)
