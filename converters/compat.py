"""Bring a model's IR version and opset within what the serving runtime loads.

Owners' tooling is often newer than the runtime: the pinned ``onnx`` writes IR version 14
by default, which the pinned ONNX Runtime (1.31) refuses ("max supported IR version: 13").
The IR version only says which file-format features a model may use; a model whose opsets
the older IR allows (``onnx.helper.VERSION_TABLE``) is brought down to the newest IR
version the runtime loads, and the report records it. An opset newer than the runtime's
is converted down with ``onnx.version_converter`` when that succeeds; otherwise the error
names the opset and what the runtime supports.

The limits are probed from the installed ONNX Runtime (a tiny model per IR version and
opset, once per process), so they follow the pin. GPU targets are served by Triton's own
``onnxruntime_onnx`` backend, whose runtime is older: its limits are a table entry.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import onnx
from onnx import TensorProto, helper

from converters.errors import UnsupportedOpset

DEFAULT_DOMAINS = ("", "ai.onnx")


@dataclass(frozen=True)
class RuntimeLimits:
    runtime: str  # for messages: "ONNX Runtime 1.31.1"
    max_ir_version: int
    max_opset: int  # ai.onnx

    def tighter(self, other: RuntimeLimits) -> RuntimeLimits:
        if (other.max_ir_version, other.max_opset) >= (self.max_ir_version, self.max_opset):
            return self
        return RuntimeLimits(f"{self.runtime} and {other.runtime}",
                             min(self.max_ir_version, other.max_ir_version),
                             min(self.max_opset, other.max_opset))


# Triton 2.51 (24.10) builds its onnxruntime backend with ONNX Runtime 1.19.2:
# IR version 10, ai.onnx opset 21 (ONNX Runtime's compatibility table).
TRITON_ONNXRUNTIME_BACKEND = RuntimeLimits("Triton 2.51's ONNX Runtime 1.19 backend", 10, 21)


@dataclass(frozen=True)
class CompatibilityChange:
    model: onnx.ModelProto
    notes: tuple[str, ...]


def _probe_model(ir_version: int, opset: int) -> bytes:
    value = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe",
                              [value("x", TensorProto.FLOAT, [1])],
                              [value("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir_version
    return bytes(model.SerializeToString())


def _loads(ir_version: int, opset: int) -> bool:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4
    try:
        ort.InferenceSession(_probe_model(ir_version, opset), options,
                             providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001 - ORT's Fail type is not importable by a stable name
        return False
    return True


@functools.cache
def local_runtime_limits() -> RuntimeLimits:
    """The newest IR version and ai.onnx opset the installed ONNX Runtime loads."""
    import onnxruntime as ort

    ir_version = next((v for v in range(onnx.IR_VERSION, 2, -1) if _loads(v, 13)), 3)
    opset = next((o for o in range(onnx.defs.onnx_opset_version(), 6, -1)
                  if _loads(ir_version, o)), 7)
    return RuntimeLimits(f"ONNX Runtime {ort.__version__}", ir_version, opset)


def limits_for(target: str) -> RuntimeLimits:
    """What the served model must satisfy: the local runtime verifies every variant; GPU
    targets are also loaded by Triton's onnxruntime backend (TensorRT parses ONNX that
    backend loads)."""
    local = local_runtime_limits()
    return local if target == "cpu" else local.tighter(TRITON_ONNXRUNTIME_BACKEND)


def min_ir_for_opset(opset: int) -> int | None:
    """The oldest IR version that allows ai.onnx ``opset`` (None: unknown to this onnx)."""
    return next((ir for _, ir, op, *_ in helper.VERSION_TABLE if op >= opset), None)


def default_opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS), 0)


def make_compatible(model: onnx.ModelProto, limits: RuntimeLimits,
                    name: str = "the model") -> CompatibilityChange:
    """``model`` with its opset and IR version within ``limits`` (notes say what changed);
    :class:`UnsupportedOpset` when it cannot be brought there."""
    notes: list[str] = []
    opset = default_opset(model)
    if opset > limits.max_opset:
        model = _opset_down(model, opset, limits, name)
        notes.append(f"converted ai.onnx opset {opset} -> {limits.max_opset}: "
                     f"{limits.runtime} runs opsets up to {limits.max_opset}")
        opset = limits.max_opset
    if model.ir_version > limits.max_ir_version:
        needed = min_ir_for_opset(opset) or model.ir_version
        if needed > limits.max_ir_version:  # cannot happen after _opset_down; kept as a guard
            raise UnsupportedOpset(
                f"{name} uses ai.onnx opset {opset}, which needs IR version {needed}; "
                f"{limits.runtime} loads IR versions up to {limits.max_ir_version}",
                action=f"Re-export {name} with opset <= {limits.max_opset}")
        lowered = onnx.ModelProto()
        lowered.CopyFrom(model)
        lowered.ir_version = limits.max_ir_version
        _check_lowered(lowered, model, limits, name)
        notes.append(f"IR version {model.ir_version} -> {limits.max_ir_version}: "
                     f"{limits.runtime} loads IR versions up to {limits.max_ir_version} "
                     f"(opset {opset} needs IR >= {needed})")
        model = lowered
    return CompatibilityChange(model, tuple(notes))


def _opset_down(model: onnx.ModelProto, opset: int, limits: RuntimeLimits,
                name: str) -> onnx.ModelProto:
    from onnx import version_converter

    try:
        converted = version_converter.convert_version(model, limits.max_opset)
        onnx.checker.check_model(converted)
    except Exception as exc:  # noqa: BLE001 - the converter raises generic errors
        raise UnsupportedOpset(
            f"{name} uses ai.onnx opset {opset}; {limits.runtime} runs opsets up to "
            f"{limits.max_opset}, and converting it down failed: {type(exc).__name__}: {exc}",
            action=f"Re-export {name} with opset <= {limits.max_opset} "
                   f"(torch.onnx.export(opset_version={limits.max_opset}))") from None
    return converted


def _passes_checker(model: onnx.ModelProto) -> bool:
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError:
        return False
    return True


def _check_lowered(model: onnx.ModelProto, original_model: onnx.ModelProto,
                   limits: RuntimeLimits, name: str) -> None:
    original = original_model.ir_version
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        if not _passes_checker(original_model):
            return  # not the IR version's fault: the checker step reports it whole
        raise UnsupportedOpset(
            f"{name} has IR version {original}; {limits.runtime} loads IR versions up to "
            f"{limits.max_ir_version}, and the model uses features of the newer IR: {exc}",
            action=f"Re-export {name} for IR version <= {limits.max_ir_version}") from None
