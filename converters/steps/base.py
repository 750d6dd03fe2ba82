"""The request, the state a conversion accumulates, and the shape of a step.

A step is a small class with three methods:

- ``inputs(state) -> I``: pick what it needs from the state into a *frozen dataclass*;
  a missing precondition fails here, typed, instead of a keyword silently defaulting;
- ``run(inputs, ctx) -> O``: the work; reports progress through ``ctx``;
- ``apply(state, output) -> state``: a new state with the result recorded.

The runner (:mod:`converters.pipeline`) owns logging, timing, the failure policy and
progress; a step's ``fatal`` flag says whether its failure ends the conversion (bad
model, bad data) or only removes one variant from the running (FP16 that will not build).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, Literal, TypeVar

import numpy as np

from converters.datasets import SampleSet
from converters.footprint import Footprint
from converters.graph import ModelFacts
from converters.images import ImagePreprocessing
from converters.metrics import Accuracy, AccuracyBudget
from converters.model_dir import WrittenModel
from converters.profile import VariantProfile
from converters.quantize import Calibration, StaticQuantizer
from converters.repair import RepairOutcome
from converters.select import Selection, ServingPlan
from converters.sources import LoadedSource
from converters.spec import InputSpec
from converters.triton_config import Target
from converters.variants import Precision, Variant, VariantPlan

Task = Literal["auto", "classification", "other"]
T = TypeVar("T")
StepState = Literal["started", "running", "done", "skipped", "failed"]


@dataclass(frozen=True)
class ConversionRequest:
    """Everything a conversion needs; picklable, so a worker process can receive it."""

    source: str  # .onnx / .pt2 / .pt path, or package.module:factory
    name: str
    repo: Path
    precisions: tuple[Precision, ...] = ("fp32", "fp16", "int8")
    target: Target = "cpu"
    calibration: Path | None = None
    evaluation: Path | None = None
    input_spec: InputSpec | None = None
    output_names: tuple[str, ...] = ()
    preprocessing: ImagePreprocessing | None = None
    budget: AccuracyBudget = AccuracyBudget()
    task: Task = "auto"
    calibration_method: Calibration = "minmax"
    per_channel: bool = True
    repair: bool = True
    max_float_fraction: float = 0.5  # repair keeps at most this share of layers float
    sensitivity_samples: int = 32
    max_calibration_samples: int | None = 512
    max_evaluation_samples: int | None = None
    opset: int = 17
    max_batch_size: int = 32
    latency_budget_ms: float | None = None
    # Triton's queue drops what waited latency_budget_ms (off: triton_config.DynamicBatching)
    drop_expired: bool = False
    instance_count: int = 1
    intra_op_threads: int = 0
    profile_iterations: int = 20
    profile_warmup: int = 3
    trt_accelerator: bool = False  # onnxruntime target: Triton builds TRT engines at load
    keep_workdir: Path | None = None
    # publish as at least this version (the lifecycle: one above every number it issued)
    min_version: int = 1


@dataclass(frozen=True)
class EngineRecord:
    variant: str
    precision: str
    path: Path
    tag_path: Path
    compute_capability: str
    tensorrt_version: str
    accuracy: Accuracy | None = None


@dataclass(frozen=True)
class StepRecord:
    label: str
    title: str
    state: StepState
    seconds: float
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "title": self.title, "state": self.state,
                "seconds": round(self.seconds, 3), "detail": self.detail}


@dataclass(frozen=True)
class ConversionState:
    request: ConversionRequest
    workdir: Path
    source: LoadedSource | None = None
    spec: InputSpec | None = None
    calibration: SampleSet | None = None
    evaluation: SampleSet | None = None
    exported: Path | None = None
    export_info: Mapping[str, Any] = field(default_factory=dict)
    model: Path | None = None  # checked, simplified FP32 model
    prepared: Path | None = None  # quant_pre_process'ed FP32 model (INT8 input)
    facts: ModelFacts | None = None
    notes: tuple[str, ...] = ()
    reference: tuple[Mapping[str, np.ndarray], ...] = ()
    primary_output: str = ""
    classify: bool = False
    encoder: bool = False
    plans: tuple[VariantPlan, ...] = ()
    variants: Mapping[str, Variant] = field(default_factory=dict)
    quantizers: Mapping[str, StaticQuantizer] = field(default_factory=dict)
    failures: Mapping[str, str] = field(default_factory=dict)
    accuracy: Mapping[str, Accuracy] = field(default_factory=dict)
    repairs: Mapping[str, RepairOutcome] = field(default_factory=dict)
    profiles: Mapping[str, VariantProfile] = field(default_factory=dict)
    selection: Selection | None = None
    serving: ServingPlan | None = None
    footprint: Footprint | None = None  # the chosen variant's, measured
    engines: tuple[EngineRecord, ...] = ()
    report: Mapping[str, Any] = field(default_factory=dict)
    report_files: Mapping[str, Path] = field(default_factory=dict)
    written: WrittenModel | None = None
    records: tuple[StepRecord, ...] = ()  # kept by the runner

    def require(self, value: T | None, what: str) -> T:
        """``value``, known to be set (a step's precondition); typed ``T | None -> T``."""
        if value is None:
            raise RuntimeError(f"pipeline wiring: {what} is not available yet")
        return value


@dataclass(frozen=True)
class ProgressEvent:
    step: str
    title: str
    index: int  # 1-based
    total: int
    state: StepState
    detail: str = ""
    fraction: float | None = None  # within the step, when it knows
    elapsed_s: float = 0.0


ProgressCallback = Callable[[ProgressEvent], None]


@dataclass
class StepContext:
    """Handed to ``Step.run``: progress within the step, the work folder, the logger."""

    workdir: Path
    log: logging.Logger
    emit: Callable[[float | None, str], None]

    def report(self, fraction: float | None = None, detail: str = "") -> None:
        self.emit(fraction, detail)


I = TypeVar("I")  # noqa: E741 - the conventional name for a step's input type
O = TypeVar("O")  # noqa: E741


class Step(ABC, Generic[I, O]):
    name: ClassVar[str]
    title: ClassVar[str]
    fatal: ClassVar[bool] = True

    @property
    def label(self) -> str:
        """Unique within a pipeline (steps built per variant override this)."""
        return self.name

    @abstractmethod
    def inputs(self, state: ConversionState) -> I: ...

    @abstractmethod
    def run(self, inputs: I, ctx: StepContext) -> O: ...

    @abstractmethod
    def apply(self, state: ConversionState, output: O) -> ConversionState: ...

    def summary(self, output: O) -> str:
        return ""

    def on_failure(self, state: ConversionState, reason: str) -> ConversionState:
        """Non-fatal steps record their failure in the state (fatal ones never get here)."""
        return state
