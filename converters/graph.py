"""Check and optimise an ONNX graph; record what it is (opsets, size, parameters).

- ``onnx.checker`` (full check, with shape inference) and a scan for operators neither
  ONNX nor ONNX Runtime knows: an unsupported operator is named, not buried in a trace.
- opsets below 17 are converted up (``onnx.version_converter``).
- ``onnxslim`` simplification (constant folding, dead-code removal, fusions); the result
  must reproduce the unsimplified model on real samples, else the unsimplified one is kept.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError

from converters.errors import InvalidSource, UnsupportedOperator
from converters.metrics import compare_outputs
from converters.runtime import RuntimeSettings, open_session
from converters.spec import ONNX_TO_NUMPY

MIN_OPSET = 17
KNOWN_DOMAINS = ("", "ai.onnx", "com.microsoft", "ai.onnx.ml")


@dataclass(frozen=True)
class ModelFacts:
    ir_version: int
    opsets: Mapping[str, int]
    size_bytes: int
    parameters: int
    nodes: int
    op_types: Mapping[str, int]
    outputs: tuple[tuple[str, str, tuple[int | str, ...]], ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "ir_version": self.ir_version,
            "opsets": dict(self.opsets),
            "size_bytes": self.size_bytes,
            "parameters": self.parameters,
            "nodes": self.nodes,
            "op_types": dict(self.op_types),
            "outputs": [{"name": n, "dtype": d, "shape": list(s)} for n, d, s in self.outputs],
        }


def load_onnx(path: Path) -> onnx.ModelProto:
    """The model with its external data (weights files beside it) loaded."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise InvalidSource(f"{path} is not a valid ONNX model (cannot parse: {exc})") from None
    except OSError as exc:
        raise InvalidSource(f"{path} cannot be read: {exc}") from None
    missing = sorted({location for location in external_locations(model)
                      if not (path.parent / location).is_file()})
    if missing:
        raise InvalidSource(
            f"{path.name} keeps its weights in external data files, and "
            f"{', '.join(missing)} is missing beside it (in {path.parent})",
            action="Give the model together with its external weights files, at the "
                   "relative paths it names, or as one file with its weights inlined (an "
                   "upload's model is one file: `infergate models upload` sends a model so)")
    try:
        onnx.load_external_data_for_model(model, str(path.parent))
    except Exception as exc:  # noqa: BLE001 - onnx raises ValidationError/OSError here
        raise InvalidSource(f"{path.name}: its external data cannot be read: {exc}") from None
    return model


def external_locations(model: onnx.ModelProto) -> list[str]:
    """The external data files the model's initializers name (as loaded, unresolved)."""
    return [entry.value for t in model.graph.initializer
            if t.data_location == onnx.TensorProto.EXTERNAL
            for entry in t.external_data if entry.key == "location"]


def save_onnx(model: onnx.ModelProto, path: Path) -> Path:
    """One file when it fits protobuf's 2 GB limit, else the weights beside it."""
    large = model.ByteSize() > 1_900_000_000
    onnx.save(model, str(path), save_as_external_data=large,
              location=f"{path.name}.data" if large else None)
    return path


def facts(model: onnx.ModelProto, path: Path) -> ModelFacts:
    parameters = sum(int(np.prod(i.dims)) for i in model.graph.initializer)
    outputs = []
    for value in model.graph.output:
        tensor_type = value.type.tensor_type
        shape = tuple(
            d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
            for d in tensor_type.shape.dim
        )
        outputs.append((value.name, ONNX_TO_NUMPY.get(tensor_type.elem_type, "?"), shape))
    return ModelFacts(
        ir_version=model.ir_version,
        opsets={(o.domain or "ai.onnx"): o.version for o in model.opset_import},
        size_bytes=path.stat().st_size,
        parameters=parameters,
        nodes=len(model.graph.node),
        op_types=dict(Counter(n.op_type for n in model.graph.node).most_common()),
        outputs=tuple(outputs),
    )


def default_opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def unsupported_operators(model: onnx.ModelProto) -> list[str]:
    """Operators of unknown domains, or unknown to the ONNX schema at the model's opset."""
    opset = default_opset(model)
    unknown = []
    for node in model.graph.node:
        domain = node.domain or ""
        if domain not in KNOWN_DOMAINS:
            unknown.append(f"{node.op_type} (domain {domain})")
        elif domain in ("", "ai.onnx") and not onnx.defs.has(node.op_type, opset, ""):
            unknown.append(f"{node.op_type} (ai.onnx opset {opset})")
    return sorted(set(unknown))


def check(model: onnx.ModelProto, path: Path, name: str | None = None) -> None:
    """Refuse what ONNX or ONNX Runtime cannot run, with their whole reason; ``name`` is
    what the owner calls the model (``path`` may be a work copy)."""
    name = name or path.name
    unknown = unsupported_operators(model)
    if unknown:
        raise UnsupportedOperator(
            f"{name} uses operators that ONNX / ONNX Runtime cannot run: "
            f"{', '.join(unknown)}", tuple(unknown)
        )
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except onnx.checker.ValidationError as exc:
        raise InvalidSource(f"{name} fails the ONNX checker: {str(exc).strip()}") from None
    except onnx.shape_inference.InferenceError as exc:
        raise InvalidSource(f"{name} fails ONNX shape inference: {exc}") from None
    try:
        open_session(path, RuntimeSettings())
    except Exception as exc:  # noqa: BLE001 - ORT raises its own Fail/NotImplemented types
        message = str(exc).strip()
        if "NOT_IMPLEMENTED" in message or "Could not find an implementation" in message:
            raise UnsupportedOperator(
                f"ONNX Runtime has no kernel for an operator in {name}. "
                f"ONNX Runtime says: {message}"
            ) from None
        raise InvalidSource(f"ONNX Runtime cannot load {name}. "
                            f"ONNX Runtime says: {message}") from None


def upgrade_opset(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str | None]:
    """Convert to opset 17 when older; returns (model, note)."""
    current = default_opset(model)
    if current >= MIN_OPSET:
        return model, None
    try:
        upgraded = onnx.version_converter.convert_version(model, MIN_OPSET)
        onnx.checker.check_model(upgraded)
    except Exception as exc:  # noqa: BLE001 - the converter raises generic errors
        return model, f"kept opset {current}: conversion to {MIN_OPSET} failed ({exc})"
    return upgraded, f"converted opset {current} -> {MIN_OPSET}"


def simplify(
    source: Path, target: Path, feeds: Mapping[str, np.ndarray]
) -> tuple[Path, str]:
    """onnxslim, kept only when it reproduces ``source`` on ``feeds``."""
    import onnxslim

    try:
        slim = onnxslim.slim(onnx.load(str(source)))
    except Exception as exc:  # noqa: BLE001 - onnxslim may fail on exotic graphs
        return source, f"simplification failed, unsimplified graph kept ({exc})"
    onnx.save(slim, str(target))
    before = open_session(source, RuntimeSettings())
    after = open_session(target, RuntimeSettings())
    names = [o.name for o in before.get_outputs()]
    expected = before.run(names, dict(feeds))
    got = after.run(names, dict(feeds))
    for name, want, have in zip(names, expected, got, strict=True):
        stats = compare_outputs(want, have)
        if stats.min_cosine < 0.99999 or stats.max_rel_err > 1e-4:
            return source, f"simplified graph changed output {name!r}; unsimplified kept"
    return target, f"simplified: {len(onnx.load(str(source)).graph.node)} -> " \
        f"{len(slim.graph.node)} nodes"
