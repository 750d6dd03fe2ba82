"""Reduced-precision models with ONNX Runtime's quantization tools.

- FP16: ``onnxruntime.transformers.float16`` with FP32 inputs/outputs and numerically
  unsafe operators (exp/log/pow/normalisations/reductions/softmax) kept in FP32.
- static INT8: calibrate once (MinMax / Entropy / Percentile), then quantize to QDQ with
  per-channel weights, as often as accuracy repair asks, reusing the calibrated ranges.
  Activations per target: U8S8 for x86 CPUs without VNNI (such as this one); symmetric
  S8S8 for TensorRT's explicit quantization.
- dynamic INT8: weight-only INT8 MatMuls with activations quantized at run time; the
  usual path for transformer encoders on CPU.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnx

from converters.bias_correction import apply_corrections, bias_corrections
from converters.datasets import SampleSet
from converters.runtime import RuntimeSettings

Calibration = Literal["minmax", "entropy", "percentile"]
ActivationType = Literal["uint8", "int8"]

# kept in FP32 in FP16 variants: overflow/underflow-prone in half precision
FP16_UNSAFE_OPS = (
    "Exp", "Log", "Pow", "Sqrt", "Reciprocal", "Softmax", "LogSoftmax", "ReduceMean",
    "ReduceSum", "ReduceSumSquare", "ReduceL2", "ReduceLogSumExp", "LayerNormalization",
    "InstanceNormalization", "GroupNormalization", "Erf", "CumSum", "Range",
)
DYNAMIC_OP_TYPES = ("MatMul", "Attention")


@dataclass(frozen=True)
class StaticInt8Recipe:
    calibration: Calibration = "minmax"
    activation: ActivationType = "uint8"
    symmetric: bool = False  # symmetric activations and weights (TensorRT)
    per_channel: bool = True
    bias_correction: bool = True
    equalize: bool = False  # cross-layer equalization first (converters.equalization)
    float_nodes: tuple[str, ...] = ()

    def describe(self) -> str:
        kind = "S8S8 symmetric" if self.symmetric else (
            "U8S8" if self.activation == "uint8" else "S8S8")
        corrected = ", bias-corrected" if self.bias_correction else ""
        equalized = ", cross-layer equalized" if self.equalize else ""
        return f"static QDQ {kind}, {self.calibration} calibration, " \
            f"{'per-channel' if self.per_channel else 'per-tensor'} weights{corrected}" \
            f"{equalized}"


@dataclass(frozen=True)
class DynamicInt8Recipe:
    per_channel: bool = False
    op_types: tuple[str, ...] = DYNAMIC_OP_TYPES
    float_nodes: tuple[str, ...] = ()

    def describe(self) -> str:
        return f"dynamic INT8 ({'/'.join(self.op_types)}), " \
            f"{'per-channel' if self.per_channel else 'per-tensor'} weights"


def to_fp16(source: Path, target: Path) -> Path:
    from onnxruntime.transformers import float16

    model = onnx.load(str(source))
    blocked = sorted(set(float16.DEFAULT_OP_BLOCK_LIST) | set(FP16_UNSAFE_OPS))
    converted = float16.convert_float_to_float16(
        model, keep_io_types=True, op_block_list=blocked, disable_shape_infer=False
    )
    onnx.save(converted, str(target))
    return target


def prepare_for_quantization(source: Path, target: Path) -> Path:
    """``quant_pre_process``: symbolic shape inference + ORT's basic graph optimisations."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    source, target = source.resolve(), target.resolve()
    # When symbolic shape inference fails, ONNX Runtime dumps "sym_shape_infer_temp.onnx"
    # and a ~100 MB "<uuid>.data" into the *current directory*: run it in a scratch one.
    with (
        quiet_ort_quantization(),
        tempfile.TemporaryDirectory(dir=target.parent) as scratch,
        contextlib.chdir(scratch),
    ):
        try:
            quant_pre_process(str(source), str(target), skip_symbolic_shape=False)
        except Exception:  # noqa: BLE001 - symbolic shape inference fails on some graphs
            quant_pre_process(str(source), str(target), skip_symbolic_shape=True)
    return target


class CalibrationReader:
    """Feeds calibration batches to ONNX Runtime's calibrators."""

    def __init__(self, samples: SampleSet, batch_size: int = 8) -> None:
        self._samples, self._batch_size = samples, batch_size
        self._iter: Iterator[dict[str, Any]] | None = None

    @classmethod
    def of(cls, batch: Mapping[str, np.ndarray]) -> CalibrationReader:
        """A reader of exactly one batch."""
        reader = cls(SampleSet("calibration", "batch", ()))
        reader._iter = iter([dict(batch)])
        return reader

    def get_next(self) -> dict[str, Any] | None:
        if self._iter is None:
            self._iter = iter(self._samples.batches(self._batch_size))
        return next(self._iter, None)

    def rewind(self) -> None:
        self._iter = None


@dataclass
class StaticQuantizer:
    """A calibrated float model, quantizable repeatedly with different float nodes.

    ``corrections`` (node -> corrected bias, see :mod:`converters.bias_correction`) apply
    to the layers that are quantized; a layer kept float keeps its original bias."""

    prepared: Path
    recipe: StaticInt8Recipe
    ranges: Any = field(repr=False)  # onnxruntime.quantization.TensorsData
    corrections: Mapping[str, np.ndarray] = field(default_factory=dict, repr=False)
    equalized: tuple[tuple[str, str], ...] = ()  # conv pairs cross-layer equalized
    _base: onnx.ModelProto | None = field(default=None, repr=False)

    @classmethod
    def calibrate(
        cls, prepared: Path, samples: SampleSet, recipe: StaticInt8Recipe
    ) -> StaticQuantizer:
        from onnxruntime.quantization.calibrate import CalibrationMethod, create_calibrator

        equalized: tuple[tuple[str, str], ...] = ()
        if recipe.equalize:
            from converters.equalization import equalize

            result = equalize(onnx.load(str(prepared)))
            prepared = prepared.with_name(f"{prepared.stem}.equalized.onnx")
            onnx.save(result.model, str(prepared))
            equalized = result.pairs
        method = {
            "minmax": CalibrationMethod.MinMax,
            "entropy": CalibrationMethod.Entropy,
            "percentile": CalibrationMethod.Percentile,
        }[recipe.calibration]
        with tempfile.TemporaryDirectory(prefix="calib.") as tmp, quiet_ort_quantization():
            calibrator = create_calibrator(
                prepared,
                _op_types(),
                augmented_model_path=str(Path(tmp) / "augmented.onnx"),
                calibrate_method=method,
                extra_options={"symmetric": recipe.symmetric},
            )
            # one batch per call: ORT's histogram calibrators stack every batch's outputs
            # into one array (a smaller last batch, or another sequence length, fails with
            # "inhomogeneous shape") and hold them all in memory; its collectors merge
            # ranges and histograms across calls
            for batch in samples.batches(8):
                calibrator.collect_data(CalibrationReader.of(batch))
            ranges = calibrator.compute_data()
            del calibrator
        quantizer = cls(prepared, recipe, ranges, equalized=equalized)
        if recipe.bias_correction:
            quantizer.corrections = bias_corrections(
                quantizer.base_model(), quantizer.quantize(), samples, RuntimeSettings())
        return quantizer

    def quantize(self, float_nodes: Sequence[str] = ()) -> onnx.ModelProto:
        """The QDQ model with ``float_nodes`` left in float."""
        return self._quantize(float_nodes, {})

    def quantize_keep_activations(self) -> onnx.ModelProto:
        """Fully quantized, with Clip/Relu kept as nodes (for per-layer analysis)."""
        return self._quantize((), {"QDQKeepRemovableActivations": True})

    def _quantize(self, float_nodes: Sequence[str], extra: dict[str, Any]) -> onnx.ModelProto:
        from onnxruntime.quantization import QuantType
        from onnxruntime.quantization.qdq_quantizer import QDQQuantizer

        activation = QuantType.QUInt8 if self.recipe.activation == "uint8" else QuantType.QInt8
        if self.recipe.symmetric:
            extra = {**extra, "ActivationSymmetric": True, "WeightSymmetric": True}
        source = apply_corrections(self._base_model(), self.corrections, set(float_nodes)) \
            if self.corrections else copy.deepcopy(self._base_model())
        quantizer = QDQQuantizer(
            source,
            per_channel=self.recipe.per_channel,
            reduce_range=False,
            weight_qType=QuantType.QInt8,
            activation_qType=activation,
            tensors_range=self.ranges,
            nodes_to_quantize=[],
            nodes_to_exclude=list(float_nodes),
            op_types_to_quantize=_op_types(),
            extra_options=extra,
        )
        with quiet_ort_quantization():
            quantizer.quantize_model()
        model: onnx.ModelProto = quantizer.model.model
        return model

    def base_model(self) -> onnx.ModelProto:
        return self._base_model()

    def _base_model(self) -> onnx.ModelProto:
        if self._base is None:
            from onnxruntime.quantization.quant_utils import load_model_with_shape_infer

            self._base = load_model_with_shape_infer(self.prepared)
        return self._base


def quantize_dynamic(source: Path, target: Path, recipe: DynamicInt8Recipe) -> Path:
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization import quantize_dynamic as ort_quantize_dynamic

    with quiet_ort_quantization():
        ort_quantize_dynamic(
            str(source),
            str(target),
            per_channel=recipe.per_channel,
            weight_type=QuantType.QInt8,
            op_types_to_quantize=list(recipe.op_types),
            nodes_to_exclude=list(recipe.float_nodes),
        )
    return target


def _op_types() -> list[str]:
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    return sorted(set(QDQRegistry) | set(QLinearOpsRegistry))


@contextlib.contextmanager
def quiet_ort_quantization() -> Iterator[None]:
    """ORT's quantization tools log warnings on the root logger for every call (e.g.
    "consider pre-processing" after we did); keep them out of the pipeline's log."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))
    try:
        yield
    finally:
        root.setLevel(level)
