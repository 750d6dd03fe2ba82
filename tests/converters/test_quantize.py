"""Reduced-precision builders: FP16 keeps unsafe operators in FP32, bias correction
cancels the mean shift of INT8 weights, CPU INT8 computes the same on every x86 CPU,
dynamic INT8 sensitivity ranks real MatMuls."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from converters.bias_correction import apply_corrections
from converters.datasets import load_samples
from converters.quantize import (
    INT16_SAFE_WEIGHT_MAX,
    StaticInt8Recipe,
    StaticQuantizer,
    prepare_for_quantization,
    to_fp16,
)
from converters.repair import dynamic_sensitivity
from converters.runtime import RuntimeSettings, open_session, run_batches
from converters.spec import parse_input_spec
from converters.variants import is_transformer_encoder, plan_variants
from tests.converters.conftest import cnn_samples, save_graph, small_cnn

SPEC = parse_input_spec("input:float32[batch,3,16,16]")


def _mean_shift(model: onnx.ModelProto, reference: list[dict[str, np.ndarray]],
                samples: object) -> float:
    got = run_batches(open_session(model.SerializeToString(), RuntimeSettings()), samples)  # type: ignore[arg-type]
    errors = np.concatenate([g["logits"] - r["logits"] for g, r in zip(got, reference,
                                                                       strict=True)])
    return float(np.abs(errors.mean(axis=0)).mean())


def test_bias_correction_shrinks_mean_output_shift_when_weights_quantized(tmp_path: Path) -> None:
    """Measured on the served kernels (fused QLinearConv/QGemm). With 8-bit weights, CPUs
    without VNNI saturated int16 pair sums there and shifted one logit by 0.148, which
    bias correction cannot see (after/before 0.93 on an AMD EPYC, 0.27 on the exact
    kernels); 7-bit weights make the integer arithmetic exact, the same on every x86."""
    prepared = prepare_for_quantization(small_cnn(tmp_path / "cnn.onnx", seed=3),
                                        tmp_path / "p.onnx")
    calibration = load_samples(cnn_samples(tmp_path / "c.npy", 64, 1), SPEC, "calibration")
    evaluation = load_samples(cnn_samples(tmp_path / "e.npy", 64, 2), SPEC, "evaluation")
    plain = StaticQuantizer.calibrate(prepared, calibration,
                                      StaticInt8Recipe(bias_correction=False))
    corrected = StaticQuantizer.calibrate(prepared, calibration, StaticInt8Recipe())
    assert set(corrected.corrections) == {"conv1", "conv2", "fc"}
    reference = run_batches(open_session(prepared, RuntimeSettings()), evaluation)
    before = _mean_shift(plain.quantize(), reference, evaluation)
    after = _mean_shift(corrected.quantize(), reference, evaluation)
    assert after < before / 2


def _exact_u8u8_session(model: onnx.ModelProto) -> ort.InferenceSession:
    """ONNX Runtime's U8U8 kernels, which never saturate (slower; a no-op with VNNI)."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.add_session_config_entry("session.x64quantprecision", "1")
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def test_cpu_int8_computes_exactly_when_u8s8_kernels_would_saturate(tmp_path: Path) -> None:
    """ONNX Runtime's x86 U8S8 kernels without VNNI add two u8*s8 products in a saturating
    int16 (``quantize.INT16_SAFE_WEIGHT_MAX``). Checked on the weights, which holds on any
    CPU, and on the outputs: the served kernels agree with the exact U8U8 ones (they
    differed by 0.056 RMS on an AVX2 EPYC with 8-bit weights; with VNNI they never do)."""
    prepared = prepare_for_quantization(small_cnn(tmp_path / "cnn.onnx", seed=3),
                                        tmp_path / "p.onnx")
    samples = load_samples(cnn_samples(tmp_path / "c.npy", 32, 1), SPEC, "calibration")
    quantized = StaticQuantizer.calibrate(prepared, samples, StaticInt8Recipe()).quantize()
    inits = {i.name: numpy_helper.to_array(i) for i in quantized.graph.initializer}
    weights = [inits[n.input[0]] for n in quantized.graph.node
               if n.op_type == "DequantizeLinear" and n.input[0] in inits
               and inits[n.input[0]].dtype == np.int8]
    assert len(weights) == 3  # conv1, conv2, fc
    peak = max(int(np.abs(w.astype(np.int32)).max()) for w in weights)
    assert 2 * 255 * peak <= np.iinfo(np.int16).max
    assert peak <= INT16_SAFE_WEIGHT_MAX
    served = run_batches(open_session(quantized.SerializeToString(), RuntimeSettings()), samples)
    exact = run_batches(_exact_u8u8_session(quantized), samples)
    for got, want in zip(served, exact, strict=True):
        np.testing.assert_allclose(got["logits"], want["logits"], rtol=0, atol=1e-5)


def test_apply_corrections_keeps_original_bias_when_layer_stays_float(tmp_path: Path) -> None:
    model = onnx.load(str(small_cnn(tmp_path / "cnn.onnx")))
    new_bias = np.full(8, 7.0, np.float32)
    fixed = apply_corrections(model, {"conv1": new_bias, "conv2": new_bias}, skip={"conv2"})
    inits = {i.name: numpy_helper.to_array(i) for i in fixed.graph.initializer}
    original = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    assert (inits["b1"] == 7.0).all()
    assert (inits["b2"] == original["b2"]).all()


def test_to_fp16_keeps_io_and_unsafe_ops_in_fp32_when_converting(tmp_path: Path) -> None:
    weight = numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")
    source = save_graph(
        tmp_path / "m.onnx",
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
         helper.make_node("Softmax", ["h"], ["y"], name="softmax", axis=-1)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], [weight])
    converted = onnx.load(str(to_fp16(source, tmp_path / "fp16.onnx")))
    assert converted.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert converted.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    inits = {i.name: i for i in converted.graph.initializer}
    assert inits["w"].data_type == TensorProto.FLOAT16
    softmax = next(n for n in converted.graph.node if n.name == "softmax")
    cast_in = next(n for n in converted.graph.node if softmax.input[0] in n.output)
    assert cast_in.op_type == "Cast"  # Softmax runs on an FP32 copy of h
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    got = open_session(tmp_path / "fp16.onnx", RuntimeSettings()).run(None, {"x": x})[0]
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(axis=1, keepdims=True), atol=2e-3)


def _encoder_like(path: Path) -> Path:
    rng = np.random.default_rng(0)
    big = (rng.standard_normal((16, 16)) * 3).astype(np.float32)
    big[0, 0] = 80.0  # an outlier: per-tensor INT8 rounds this layer coarsely
    small = (rng.standard_normal((16, 16)) * 0.1).astype(np.float32)
    return save_graph(
        path,
        [helper.make_node("Cast", ["ids"], ["f"], to=TensorProto.FLOAT),
         helper.make_node("MatMul", ["f", "w_outlier"], ["h"], name="outlier"),
         helper.make_node("Softmax", ["h"], ["p"], axis=-1),
         helper.make_node("MatMul", ["p", "w_plain"], ["y"], name="plain")],
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])],
        [numpy_helper.from_array(big, "w_outlier"), numpy_helper.from_array(small, "w_plain")])


def test_dynamic_sensitivity_ranks_outlier_layer_first_when_weights_skewed(
        tmp_path: Path) -> None:
    model_path = _encoder_like(tmp_path / "enc.onnx")
    spec = parse_input_spec("ids:int64[batch,16]")
    np.savez(tmp_path / "s.npz", ids=np.random.default_rng(1).integers(0, 5, (8, 16)))
    samples = load_samples(tmp_path / "s.npz", spec, "calibration")
    model = onnx.load(str(model_path))
    assert is_transformer_encoder(model, spec)
    ranking = dynamic_sensitivity(model, samples, per_channel=False, settings=RuntimeSettings())
    assert [r.layer for r in ranking] == ["outlier", "plain"]
    assert ranking[0].score > 10 * ranking[1].score


def test_plan_variants_tries_dynamic_int8_when_encoder_on_cpu() -> None:
    names = [p.name for p in plan_variants(("fp32", "int8"), "cpu", encoder=True)]
    assert names == ["fp32", "int8", "int8-dynamic"]
    (int8,) = [p for p in plan_variants(("int8",), "tensorrt", encoder=True)]
    assert int8.static is not None and int8.static.symmetric and int8.static.activation == "int8"
