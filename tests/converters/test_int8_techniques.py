"""The INT8 techniques the benchmark measures, each on a small CNN: calibration methods
(and the measured choice between them), float graph outputs, cross-layer equalization,
empirical bias correction; the agreement intervals; the bundled photo pool."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from converters.confidence import photo_bootstrap, wilson
from converters.datasets import SampleSet, load_samples
from converters.equalization import equalize
from converters.photos import available_photos, photo_of, varied_views, write_varied_views
from converters.quantize import StaticInt8Recipe, StaticQuantizer, prepare_for_quantization
from converters.runtime import RuntimeSettings, open_session, run_batches
from converters.spec import parse_input_spec
from tests.converters.conftest import cnn_samples, save_graph, small_cnn

SPEC = parse_input_spec("input:float32[batch,3,16,16]")


@pytest.fixture()
def prepared(tmp_path: Path) -> Path:
    return prepare_for_quantization(small_cnn(tmp_path / "cnn.onnx", seed=3),
                                    tmp_path / "p.onnx")


def _samples(tmp_path: Path, count: int, seed: int) -> SampleSet:
    return load_samples(cnn_samples(tmp_path / f"s{seed}.npy", count, seed), SPEC, "calibration")


@pytest.mark.parametrize("method", ["entropy", "percentile", "minmax"])
def test_calibration_succeeds_when_last_batch_is_smaller(prepared: Path, tmp_path: Path,
                                                         method: str) -> None:
    samples = _samples(tmp_path, 11, 1)  # batches of 8 and 3
    quantizer = StaticQuantizer.calibrate(prepared, samples,
                                          StaticInt8Recipe(calibration=method))  # type: ignore[arg-type]
    assert any(n.op_type == "QuantizeLinear" for n in quantizer.quantize().graph.node)


def test_auto_calibration_keeps_the_method_with_least_holdout_noise(prepared: Path,
                                                                    tmp_path: Path) -> None:
    quantizer = StaticQuantizer.calibrate(prepared, _samples(tmp_path, 20, 1),
                                          StaticInt8Recipe(calibration="auto"))
    assert set(quantizer.choice) == {"minmax", "entropy", "percentile"}
    assert quantizer.recipe.calibration == min(quantizer.choice, key=quantizer.choice.get)  # type: ignore[arg-type]
    assert "chosen by output noise on held-out calibration samples" in \
        quantizer.describe_choice()


def test_graph_outputs_stay_float_when_float_outputs_is_on(prepared: Path,
                                                           tmp_path: Path) -> None:
    samples = _samples(tmp_path, 16, 1)
    for float_outputs, want in ((True, "Gemm"), (False, "DequantizeLinear")):
        model = StaticQuantizer.calibrate(
            prepared, samples, StaticInt8Recipe(float_outputs=float_outputs)).quantize()
        producer = {o: n for n in model.graph.node for o in n.output}
        assert producer["logits"].op_type == want
        out = run_batches(open_session(model.SerializeToString(), RuntimeSettings()), samples)
        assert out[0]["logits"].dtype == np.float32


def _conv_relu_conv(path: Path) -> Path:
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    w1[0] *= 20.0  # one channel with a much wider range than the others
    w2 = rng.standard_normal((5, 4, 1, 1)).astype(np.float32)
    inits = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(np.ones(4, np.float32),
                                                                        "b1"),
             numpy_helper.from_array(w2, "w2")]
    nodes = [helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], name="conv1", pads=[1] * 4),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["logits"], name="conv2")]
    return save_graph(
        path, nodes,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 16, 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 5, 16, 16])],
        inits)


def test_equalization_keeps_outputs_and_evens_ranges_when_pair_is_linked_by_relu(
        tmp_path: Path) -> None:
    model = onnx.load(str(_conv_relu_conv(tmp_path / "pair.onnx")))
    result = equalize(model)
    assert result.pairs == (("conv1", "conv2"),)
    x = {"input": np.random.default_rng(1).standard_normal((2, 3, 16, 16)).astype(np.float32)}
    before = open_session(model.SerializeToString(), RuntimeSettings()).run(None, x)[0]
    after = open_session(result.model.SerializeToString(), RuntimeSettings()).run(None, x)[0]
    np.testing.assert_allclose(after, before, rtol=1e-4, atol=1e-4)
    w1 = {i.name: numpy_helper.to_array(i) for i in result.model.graph.initializer}["w1"]
    ranges = np.abs(w1).reshape(4, -1).max(axis=1)
    assert ranges.max() / ranges.min() < 20.0  # was ~20x wider before


def test_equalization_leaves_pairs_alone_when_linked_by_relu6(tmp_path: Path) -> None:
    result = equalize(onnx.load(str(small_cnn(tmp_path / "cnn.onnx"))))  # Conv-Relu-Conv-Clip
    assert result.pairs == (("conv1", "conv2"),)  # Relu pair only; Clip feeds no conv
    assert result.candidates == 1


def _mismatch(quantizer: StaticQuantizer, samples: SampleSet) -> float:
    float_out = run_batches(open_session(quantizer.base_model().SerializeToString(),
                                         RuntimeSettings()), samples)
    quant_out = run_batches(open_session(quantizer.quantize().SerializeToString(),
                                         RuntimeSettings()), samples)
    diff = np.concatenate([q["logits"] - f["logits"] for q, f in zip(quant_out, float_out,
                                                                     strict=True)])
    return float(np.abs(diff.mean(axis=0)).mean())


def test_empirical_bias_correction_matches_output_means_when_fitted(prepared: Path,
                                                                    tmp_path: Path) -> None:
    samples = _samples(tmp_path, 32, 1)
    analytic = StaticQuantizer.calibrate(prepared, samples, StaticInt8Recipe())
    empirical = StaticQuantizer.calibrate(prepared, samples,
                                          StaticInt8Recipe(empirical_passes=3))
    assert set(empirical.corrections) == set(analytic.corrections)
    assert _mismatch(empirical, samples) < _mismatch(analytic, samples)


def test_wilson_interval_is_asymmetric_when_agreement_is_near_one() -> None:
    interval = wilson(99, 100)
    assert interval.rate == pytest.approx(0.99)
    assert interval.low == pytest.approx(0.9455, abs=1e-3)
    assert interval.high == pytest.approx(0.9982, abs=1e-3)
    assert wilson(0, 0).n == 0


def test_photo_bootstrap_is_wider_when_misses_cluster_in_one_photo() -> None:
    matches = [True] * 90 + [False] * 10
    spread = photo_bootstrap(matches, [f"p{i % 10}" for i in range(100)])
    clustered = photo_bootstrap(matches, [f"p{i // 10}" for i in range(100)])
    assert spread.rate == clustered.rate == pytest.approx(0.9)
    assert clustered.high - clustered.low > spread.high - spread.low


def test_photo_pool_has_many_bundled_photos_when_packages_are_installed() -> None:
    photos = available_photos()
    assert len(photos) >= 20
    assert all(path.is_file() for _, path in photos)


def test_varied_views_are_deterministic_and_named_by_photo(tmp_path: Path) -> None:
    name, path = available_photos()[1]
    folder = write_varied_views(tmp_path / "views", 3, 5, [(name, path)])
    files = sorted(folder.iterdir())
    assert [photo_of(f.stem) for f in files] == [name] * 3
    from converters.images import load_image

    first = [np.asarray(v) for v in varied_views(load_image(path), 3, 5 + 0)]
    again = [np.asarray(v) for v in varied_views(load_image(path), 3, 5 + 0)]
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert len({a.shape for a in first}) > 1  # different crops


def _smooth_samples(path: Path, count: int, seed: int) -> Path:
    """Inputs whose neighbouring pixels correlate, as an image's do (a 3x3 box blur of
    normal noise). On i.i.d. noise a conv's input correlation is nearly diagonal, and on
    the 7-bit CPU grid nearest rounding is then already the best rounding (searched
    exhaustively): AdaRound has nothing to win there."""
    x = np.load(cnn_samples(path, count, seed))
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), mode="edge")
    blurred = sum(padded[:, :, i:i + 16, j:j + 16] for i in range(3) for j in range(3)) / 9
    np.save(path, np.asarray(blurred, np.float32) * 3)
    return path


def test_adaround_lowers_layer_output_error_and_stays_on_the_int8_grid_when_enabled(
        prepared: Path, tmp_path: Path) -> None:
    from converters.bias_correction import _dequantized_weights

    samples = load_samples(_smooth_samples(tmp_path / "s.npy", 32, 1), SPEC, "calibration")
    nearest = StaticQuantizer.calibrate(prepared, samples,
                                        StaticInt8Recipe(bias_correction=False))
    rounded = StaticQuantizer.calibrate(prepared, samples,
                                        StaticInt8Recipe(bias_correction=False, adaround=True))
    assert set(rounded.rounded) == {"conv1", "conv2", "fc"}
    served = _dequantized_weights(rounded.quantize())
    for node, (_, values) in rounded.rounded.items():
        # ONNX Runtime re-quantizes the rounded weights to exactly themselves
        np.testing.assert_allclose(served[node], values, rtol=0, atol=1e-6)
    base = rounded.base_model()
    weights = {i.name: numpy_helper.to_array(i) for i in base.graph.initializer}
    x = samples.first_batch(32)["input"]
    patches = np.lib.stride_tricks.sliding_window_view(
        np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3), axis=(2, 3))
    patches = patches.transpose(0, 2, 3, 1, 4, 5).reshape(-1, 27)

    def error(w: np.ndarray) -> float:
        return float(np.sum((patches @ (w - weights["w1"]).reshape(8, -1).T) ** 2))

    nearest_w = _dequantized_weights(nearest.quantize())["conv1"]
    assert error(served["conv1"]) < error(nearest_w)  # on the data it was fitted to


def test_cli_json_stays_parseable_when_a_histogram_calibrator_prints(tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from infergate.cli import app

    model = small_cnn(tmp_path / "cnn.onnx")
    calib, evaluation = cnn_samples(tmp_path / "c.npy", 16, 1), cnn_samples(tmp_path / "e.npy",
                                                                            16, 2)
    result = CliRunner().invoke(app, [
        "convert", str(model), "--name", "m", "--repo", str(tmp_path / "repo"),
        "--precisions", "fp32,int8", "--calib", str(calib), "--eval", str(evaluation),
        "--calibration", "entropy", "--min-cosine", "0.5", "--max-batch-size", "2",
        "--profile-iterations", "2", "--json"])
    assert result.exit_code == 0, result.output
    published = json.loads(result.stdout)  # ORT's "Collecting tensor data..." kept out
    assert published["name"] == "m"
