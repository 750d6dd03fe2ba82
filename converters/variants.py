"""The variants a conversion tries, and how each is built from the optimised FP32 model.

A variant is a file plus the runtime settings it must be served with (what was verified
is what is served). Which variants to try follows from the requested precisions, the
target and the model:

- ``fp32``: the checked, simplified graph.
- ``fp16``: FP16 weights/compute, FP32 I/O, unsafe operators in FP32.
- ``int8``: static QDQ; U8S8 with 7-bit weights on ``cpu`` (x86 without VNNI, whose
  U8S8 kernels saturate with 8-bit ones), symmetric S8S8 for TensorRT (``tensorrt``, and
  ``onnxruntime`` whose TensorRT accelerator consumes QDQ models).
- ``int8-dynamic``: for transformer encoders (token-id inputs feeding MatMul/Softmax),
  where static activation ranges often lose; tried beside static INT8 on ``cpu``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import onnx

from converters.quantize import (
    Calibration,
    DynamicInt8Recipe,
    StaticInt8Recipe,
)
from converters.runtime import MIXED_PRECISION_DISABLED_OPTIMIZERS, RuntimeSettings
from converters.spec import InputSpec

Precision = Literal["fp32", "fp16", "int8"]
PRECISIONS: tuple[Precision, ...] = ("fp32", "fp16", "int8")
VariantKind = Literal["fp32", "fp16", "int8-static", "int8-dynamic"]


@dataclass(frozen=True)
class VariantPlan:
    """One variant to build: its name, precision and recipe."""

    name: str
    precision: Precision
    kind: VariantKind
    static: StaticInt8Recipe | None = None
    dynamic: DynamicInt8Recipe | None = None

    def describe(self) -> str:
        if self.static is not None:
            return self.static.describe()
        if self.dynamic is not None:
            return self.dynamic.describe()
        return "FP16 compute, FP32 inputs/outputs" if self.kind == "fp16" else "FP32"


@dataclass(frozen=True)
class Variant:
    plan: VariantPlan
    path: Path
    runtime: RuntimeSettings
    float_nodes: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def precision(self) -> Precision:
        return self.plan.precision

    @property
    def size_bytes(self) -> int:
        return self.path.stat().st_size if self.path.exists() else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "precision": self.precision,
            "recipe": self.plan.describe(),
            "size_bytes": self.size_bytes,
            "float_nodes": list(self.float_nodes),
            "disabled_optimizers": list(self.runtime.disabled_optimizers),
            "notes": list(self.notes),
        }


def is_transformer_encoder(model: onnx.ModelProto, spec: InputSpec) -> bool:
    """Integer (token id) inputs, and attention: Softmax beside MatMuls."""
    ops = {n.op_type for n in model.graph.node}
    integer_inputs = any(t.dtype.startswith("int") for t in spec.inputs)
    return integer_inputs and "Softmax" in ops and "MatMul" in ops


def plan_variants(
    precisions: tuple[Precision, ...],
    target: str,
    encoder: bool,
    calibration: Calibration = "minmax",
    per_channel: bool = True,
) -> tuple[VariantPlan, ...]:
    plans: list[VariantPlan] = []
    for precision in precisions:
        if precision == "fp32":
            plans.append(VariantPlan("fp32", "fp32", "fp32"))
        elif precision == "fp16":
            plans.append(VariantPlan("fp16", "fp16", "fp16"))
        else:
            tensorrt = target in ("tensorrt", "onnxruntime")
            recipe = StaticInt8Recipe(
                calibration=calibration,
                activation="int8" if tensorrt else "uint8",
                symmetric=tensorrt,
                per_channel=per_channel,
                reduce_range=not tensorrt,  # x86 U8S8 kernels saturate int16 without it
                # measured on EfficientNet-Lite0 (loadtests/bench_converter.py): top-1
                # agreement +1 to 2 points over bias correction alone, no run-time cost
                adaround=True,
            )
            plans.append(VariantPlan("int8", "int8", "int8-static", static=recipe))
            if encoder and target == "cpu":
                # per-channel: measured on MiniLM, cosine 0.994 (per-tensor 0.968) at
                # about the same speed-up, so no layer needs to stay float
                plans.append(VariantPlan(
                    "int8-dynamic", "int8", "int8-dynamic",
                    dynamic=DynamicInt8Recipe(per_channel=per_channel),
                ))
    return tuple(plans)


def runtime_for(plan: VariantPlan, base: RuntimeSettings,
                float_nodes: tuple[str, ...]) -> RuntimeSettings:
    """Mixed-precision static INT8 must be served with WeightBiasQuantization off."""
    if plan.kind == "int8-static" and float_nodes:
        return RuntimeSettings(
            intra_op_threads=base.intra_op_threads,
            disabled_optimizers=MIXED_PRECISION_DISABLED_OPTIMIZERS,
            providers=base.providers,
        )
    return base
