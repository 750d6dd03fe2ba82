"""Reduced-precision models with ONNX Runtime's quantization tools.

- FP16: ``onnxruntime.transformers.float16`` with FP32 inputs/outputs and numerically
  unsafe operators (exp/log/pow/normalisations/reductions/softmax) kept in FP32.
- static INT8: calibrate once (MinMax / Entropy / Percentile), then quantize to QDQ with
  per-channel weights, as often as accuracy repair asks, reusing the calibrated ranges.
  Activations per target: U8S8 for x86 CPUs without VNNI (such as this one); symmetric
  S8S8 for TensorRT's explicit quantization. CPU weights are 7-bit (``reduce_range``):
  see :data:`INT16_SAFE_WEIGHT_MAX`.
- dynamic INT8: weight-only INT8 MatMuls with activations quantized at run time; the
  usual path for transformer encoders on CPU.
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnx

from converters.bias_correction import apply_corrections, bias_corrections, empirical_corrections
from converters.datasets import SampleSet
from converters.runtime import RuntimeSettings, open_session, run_batches

Calibration = Literal["minmax", "entropy", "percentile", "auto"]
MEASURED_METHODS: tuple[Calibration, ...] = ("minmax", "entropy", "percentile")
ActivationType = Literal["uint8", "int8"]

# kept in FP32 in FP16 variants: overflow/underflow-prone in half precision
FP16_UNSAFE_OPS = (
    "Exp", "Log", "Pow", "Sqrt", "Reciprocal", "Softmax", "LogSoftmax", "ReduceMean",
    "ReduceSum", "ReduceSumSquare", "ReduceL2", "ReduceLogSumExp", "LayerNormalization",
    "InstanceNormalization", "GroupNormalization", "Erf", "CumSum", "Range",
)
DYNAMIC_OP_TYPES = ("MatMul", "Attention")

# ONNX Runtime's U8S8 QLinearConv/QGemm kernels on x86 CPUs with AVX2 or AVX-512 but no
# VNNI multiply with VPMADDUBSW, which adds two u8*s8 products into a *saturating* int16:
# 255 * 127 * 2 = 64770 is clipped to 32767 (ONNX Runtime 1.31.1). With VNNI (VPDPBUSD)
# the sum is int32 and exact, so the same model computes other numbers there. Measured on
# an AMD EPYC (AVX2, no VNNI) with 8-bit weights, a small CNN's logits were off by 0.056
# RMS (0.0047 with the exact U8U8 kernels, ``session.x64quantprecision``) and one logit
# by 0.148 on average: an error bias correction, which assumes exact integer arithmetic,
# cannot see.
# Weights in [-64, 64] (ONNX Runtime's ``reduce_range``) keep every pair sum within int16
# (255 * 64 * 2 = 32640), so the served model computes the same on every x86 CPU.
INT16_SAFE_WEIGHT_MAX = 64


@dataclass(frozen=True)
class StaticInt8Recipe:
    calibration: Calibration = "minmax"
    activation: ActivationType = "uint8"
    symmetric: bool = False  # symmetric activations and weights (TensorRT)
    per_channel: bool = True
    bias_correction: bool = True
    equalize: bool = False  # cross-layer equalization first (converters.equalization)
    float_outputs: bool = True  # graph outputs not rounded to 8 bits (float_graph_outputs)
    empirical_passes: int = 0  # bias correction refined on measured output means
    adaround: bool = False  # weights rounded up/down for least output error (adaround.py)
    float_nodes: tuple[str, ...] = ()
    # 7-bit weights for ONNX Runtime's x86 U8S8 kernels (see INT16_SAFE_WEIGHT_MAX); off
    # only for TensorRT, whose INT8 kernels accumulate in int32
    reduce_range: bool = True

    def describe(self) -> str:
        kind = "S8S8 symmetric" if self.symmetric else (
            "U8S8" if self.activation == "uint8" else "S8S8")
        corrected = ", bias-corrected" if self.bias_correction else ""
        if self.adaround:
            corrected = f", AdaRound-style rounding{corrected}"
        if self.bias_correction and self.empirical_passes:
            corrected += f" (empirical, {self.empirical_passes} passes)"
        equalized = ", cross-layer equalized" if self.equalize else ""
        bits = " 7-bit" if self.reduce_range else ""
        return f"static QDQ {kind}, {self.calibration} calibration, " \
            f"{'per-channel' if self.per_channel else 'per-tensor'}{bits} weights{corrected}" \
            f"{equalized}"


def weight_range(recipe: StaticInt8Recipe) -> tuple[int, int]:
    """The integers the served INT8 weights take: ONNX Runtime's quantizer asked with the
    settings :meth:`StaticQuantizer._quantize` gives it (QInt8 weights are symmetric, and
    ``reduce_range`` from the recipe). [-64, 64] with ``reduce_range``, [-127, 127]
    without. Whatever re-rounds weights for the quantizer (AdaRound) must stay inside it,
    or the quantizer clips them."""
    from onnx import TensorProto
    from onnxruntime.quantization.quant_utils import get_qmin_qmax_for_qType

    low, high = (int(v) for v in get_qmin_qmax_for_qType(
        TensorProto.INT8, reduce_range=recipe.reduce_range, symmetric=True))
    if recipe.reduce_range and max(-low, high) > INT16_SAFE_WEIGHT_MAX:
        raise RuntimeError(f"ONNX Runtime's reduced INT8 range [{low}, {high}] exceeds "
                           f"{INT16_SAFE_WEIGHT_MAX}: its x86 U8S8 kernels would saturate")
    return low, high


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
    rounded: Mapping[str, tuple[str, np.ndarray]] = field(default_factory=dict, repr=False)
    _base: onnx.ModelProto | None = field(default=None, repr=False)

    choice: Mapping[str, float] = field(default_factory=dict)  # method -> holdout noise

    @classmethod
    def calibrate(
        cls, prepared: Path, samples: SampleSet, recipe: StaticInt8Recipe
    ) -> StaticQuantizer:
        """Calibrated ranges (and bias corrections) for ``recipe``; calibration "auto"
        measures each method and keeps the best (:meth:`choose`)."""
        if recipe.calibration == "auto":
            return cls.choose(prepared, samples, recipe)
        return cls._calibrate(prepared, samples, recipe)

    @classmethod
    def choose(cls, prepared: Path, samples: SampleSet,
               recipe: StaticInt8Recipe) -> StaticQuantizer:
        """The calibration method chosen by measurement: each one calibrates on four fifths
        of the calibration set and is scored by its output noise against FP32 on the other
        fifth (never the evaluation set, which must stay unseen); the winner is then
        calibrated on the whole set."""
        from converters.repair import output_noise

        index = set(range(0, len(samples), 5))
        holdout = SampleSet(samples.role, samples.source,
                            tuple(x for i, x in enumerate(samples.samples) if i in index))
        rest = SampleSet(samples.role, samples.source,
                         tuple(x for i, x in enumerate(samples.samples) if i not in index))
        if not len(holdout) or not len(rest):
            return cls._calibrate(prepared, samples, replace(recipe, calibration="minmax"))
        settings = RuntimeSettings()
        reference = run_batches(open_session(prepared, settings), holdout)
        noise: dict[str, float] = {}
        for method in MEASURED_METHODS:
            trial = cls._calibrate(prepared, rest, replace(recipe, calibration=method))
            got = run_batches(open_session(trial.quantize().SerializeToString(), settings),
                              holdout)
            noise[method] = output_noise(reference, got)
        best = min(MEASURED_METHODS, key=noise.__getitem__)
        chosen = cls._calibrate(prepared, samples, replace(recipe, calibration=best))
        chosen.choice = noise
        return chosen

    def describe_choice(self) -> str:
        if not self.choice:
            return ""
        scores = ", ".join(f"{m} {n:.4g}" for m, n in self.choice.items())
        return f"calibration {self.recipe.calibration} chosen by output noise on held-out " \
            f"calibration samples ({scores})"

    @classmethod
    def _calibrate(
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
        if recipe.adaround:
            from converters.adaround import rounded_weights

            quantizer.rounded = rounded_weights(quantizer.base_model(), quantizer.quantize(),
                                                samples.strided(64), RuntimeSettings(),
                                                levels=weight_range(recipe))
        if recipe.bias_correction:
            quantizer.corrections = bias_corrections(
                quantizer.base_model(), quantizer.quantize(), samples, RuntimeSettings())
            if recipe.empirical_passes:
                quantizer.corrections = empirical_corrections(
                    quantizer.base_model(), quantizer.quantize_with, quantizer.corrections,
                    samples.strided(64), RuntimeSettings(), recipe.empirical_passes)
        return quantizer

    def quantize(self, float_nodes: Sequence[str] = ()) -> onnx.ModelProto:
        """The QDQ model with ``float_nodes`` left in float."""
        return self._quantize(float_nodes, {})

    def quantize_with(self, corrections: Mapping[str, np.ndarray]) -> onnx.ModelProto:
        """Fully quantized with other bias corrections (for refining them)."""
        kept, self.corrections = self.corrections, corrections
        try:
            return self._quantize((), {})
        finally:
            self.corrections = kept

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
        if self.rounded:
            from converters.adaround import apply_rounding

            source = apply_rounding(source, self.rounded, set(float_nodes))
        quantizer = QDQQuantizer(
            source,
            per_channel=self.recipe.per_channel,
            reduce_range=self.recipe.reduce_range,  # weights only (activations: 8 bits)
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
        return float_graph_outputs(model) if self.recipe.float_outputs else model

    def base_model(self) -> onnx.ModelProto:
        return self._base_model()

    def _base_model(self) -> onnx.ModelProto:
        if self._base is None:
            from onnxruntime.quantization.quant_utils import load_model_with_shape_infer

            self._base = load_model_with_shape_infer(self.prepared)
        return self._base


def float_graph_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """Remove the Q/DQ pair in front of each graph output: the served output is float
    anyway, and rounding it to 8 bits flips near-tied classifier logits (on
    EfficientNet-Lite0 the logits' quantization step is about 0.14). The producing node
    (a Gemm, say) still computes in INT8; only its result stays float."""
    graph = model.graph
    producer = {out: n for n in graph.node for out in n.output}
    consumers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            consumers[name] = consumers.get(name, 0) + 1
    for output in graph.output:
        dq = producer.get(output.name)
        if dq is None or dq.op_type != "DequantizeLinear":
            continue
        q = producer.get(dq.input[0])
        if q is None or q.op_type != "QuantizeLinear" or consumers.get(q.output[0]) != 1:
            continue
        source = producer.get(q.input[0])
        if source is None or consumers.get(q.input[0]) != 1:
            continue
        source.output[list(source.output).index(q.input[0])] = output.name
        graph.node.remove(q)
        graph.node.remove(dq)
    return model


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
    "consider pre-processing" after we did), and its histogram calibrators print progress
    to stdout (which would corrupt ``infergate convert --json``): keep both out."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        root.setLevel(level)
