"""The JSON spec a model owner uploads with a model: what the model takes, which
precisions to try under which accuracy budget, the latency SLO, and where to serve it.

Example::

    {
      "inputs": [{"name": "input", "datatype": "FP32", "shape": ["batch", 3, 224, 224]}],
      "precisions": ["fp32", "int8"],
      "accuracy_budget": {"max_top1_drop": 0.01, "min_cosine": 0.99},
      "latency_slo_ms": 50,
      "target": "cpu",
      "pools": ["cpu-a"],
      "max_batch_size": 32,
      "keep_warm": {"interval_s": 10, "idle_after_s": 30, "batch_sizes": [1, 8]},
      "rollout": {"steps": [5, 25, 50, 100], "step_seconds": 60, "min_requests": 200}
    }

An input may declare its values' ``range`` (``[low, high]``, both included), which
synthetic evaluation inputs respect. Samples, as on the command line: INT8 needs a
``calibration`` and an ``evaluation`` part; FP32/FP16 may omit both, and are then verified
against the source model on synthetic inputs (the report says so).

Optional: ``drop_expired`` (Triton's queue drops a request that waited ``latency_slo_ms``;
off: ``converters/triton_config.DynamicBatching`` says why), ``preprocessing`` (for
folders of images), ``instance_count``,
``intra_op_threads``, ``profile_iterations``, ``repair`` (INT8 accuracy repair, on),
``rollout`` (a progressive rollout, :class:`gateway.config.rollout.RolloutSpec`, or
``"none"``; absent: the model's configured one, else all at once).

Shapes include the batch axis; a string (or -1) is a dynamic dimension.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    ValidationError,
    field_validator,
    model_validator,
)

from converters.errors import InvalidRequest
from converters.metrics import AccuracyBudget
from converters.spec import TensorDecl
from gateway.config.lifecycle import KeepWarmPolicy
from gateway.config.rollout import Rollout, parse_rollout
from gateway.errors import InvalidInput

Precision = Literal["fp32", "fp16", "int8"]
ModelFormat = Literal["onnx", "pt2", "torchscript"]
T = TypeVar("T")


def _json_form(kind: type[T], parse: Callable[[Any], T]) -> PlainValidator:
    """A pydantic validator for a converter type read by its own ``from_mapping``."""
    def validate(value: Any) -> T:
        if isinstance(value, kind):
            return value
        try:
            return parse(value)
        except InvalidRequest as exc:
            raise ValueError(str(exc)) from None

    return PlainValidator(validate)


# The converter's own types, read and written in their JSON form (one parser, one set of
# checks: converters/spec.py and converters/metrics.py).
Tensor = Annotated[TensorDecl, _json_form(TensorDecl, TensorDecl.from_mapping),
                   PlainSerializer(TensorDecl.to_wire)]
Budget = Annotated[AccuracyBudget, _json_form(AccuracyBudget, AccuracyBudget.from_mapping),
                   PlainSerializer(AccuracyBudget.to_dict)]


class UploadSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    format: ModelFormat | None = None  # default: from the model file's extension
    inputs: tuple[Tensor, ...]
    precisions: tuple[Precision, ...] = ("fp32",)
    accuracy_budget: Budget | None = None
    latency_slo_ms: float | None = Field(None, gt=0)
    # Triton's queue drops a request that waited latency_slo_ms (off by default:
    # converters/triton_config.DynamicBatching says why)
    drop_expired: bool = False
    target: Literal["cpu", "onnxruntime", "tensorrt"] = "cpu"
    pools: tuple[str, ...] = ()  # default: the pools that serve the model by configuration
    max_batch_size: int = Field(32, ge=1, le=1024)
    keep_warm: KeepWarmPolicy | None = None
    # image folders in an archive need their preprocessing: a preset
    # ("efficientnet-lite", "imagenet") or a JSON object of ImagePreprocessing fields
    preprocessing: str | None = None
    instance_count: int = Field(1, ge=1, le=64)
    intra_op_threads: int = Field(0, ge=0, le=256)  # ONNX Runtime threads; 0 = its default
    profile_iterations: int = Field(20, ge=1, le=1000)  # per batch size when profiling
    # INT8 that misses the budget: keep its most sensitive layers in float and retry
    repair: bool = True
    rollout: Annotated[Rollout, BeforeValidator(parse_rollout)] = None

    @field_validator("inputs")
    @classmethod
    def _some_inputs(cls, value: tuple[TensorDecl, ...]) -> tuple[TensorDecl, ...]:
        if not value:
            raise ValueError("declare at least one input (name, datatype, shape)")
        return value

    @field_validator("precisions")
    @classmethod
    def _unique(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("precisions must name at least one of fp32, fp16, int8")
        return tuple(dict.fromkeys(value))

    @model_validator(mode="after")
    def _budget_for_reduced_precision(self) -> UploadSpec:
        reduced = [p for p in self.precisions if p != "fp32"]
        if reduced and self.accuracy_budget is None:
            raise ValueError(
                f"precisions {reduced} need an accuracy_budget (max_top1_drop and/or "
                "min_cosine): a reduced-precision variant is only served within a budget"
            )
        names = [t.name for t in self.inputs]
        if len(set(names)) != len(names):
            raise ValueError(f"input names repeat: {names}")
        for tensor in self.inputs:
            if not tensor.batched:
                raise ValueError(f"input {tensor.name!r}: the first (batch) dimension must be "
                                 "dynamic (a name such as \"batch\", or -1)")
        return self

    @property
    def needs_calibration(self) -> bool:
        return "int8" in self.precisions

    @property
    def needs_evaluation(self) -> bool:
        """INT8 only, as on the command line: FP32/FP16 without evaluation samples are
        verified against the source model on synthetic inputs (converters/synthetic.py)."""
        return "int8" in self.precisions


def parse_spec(text: str) -> UploadSpec:
    """Parse and validate; every problem is an :class:`InvalidInput` naming the field."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"spec is not valid JSON: {exc}") from None
    try:
        return UploadSpec.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'spec'}: "
            f"{err['msg'].removeprefix('Value error, ')}"
            for err in exc.errors()
        )
        raise InvalidInput(f"invalid spec: {problems}") from None
