"""Synthetic evaluation inputs: drawn the same way every time, within the ranges the spec,
the preprocessing or the graph say, bounded in size; and FP32/FP16 conversions without an
evaluation set verified on them through the real pipeline (ONNX Runtime), the report and
the command line saying so."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from typer.testing import CliRunner

from converters.images import EFFICIENTNET_LITE, IMAGENET
from converters.metrics import AccuracyBudget
from converters.pipeline import ConversionRequest, convert
from converters.spec import InputSpec, TensorDecl, parse_input_spec
from converters.synthetic import (
    DYNAMIC_LENGTH,
    MAX_SAMPLES,
    MIN_SAMPLES,
    SYNTHETIC_SEED,
    embedding_rows,
    synthetic_set,
)
from infergate.cli import app
from tests.converters.conftest import save_graph, small_cnn
from tests.converters.torch_models import TOKEN_VOCAB

VOCAB = 50


def token_classifier(path: Path) -> Path:
    """``input_ids`` int64 [batch, sequence] -> embedding table of VOCAB rows (through a
    Cast to int32), masked by ``attention_mask`` int64, mean over the sequence, Gemm ->
    ``logits`` [batch, 10]."""
    rng = np.random.default_rng(3)
    table = onnx.numpy_helper.from_array(rng.standard_normal((VOCAB, 8)).astype(np.float32),
                                         "embeddings")
    weights = onnx.numpy_helper.from_array(rng.standard_normal((10, 8)).astype(np.float32), "w")
    nodes = [
        helper.make_node("Cast", ["input_ids"], ["ids32"], to=TensorProto.INT32),
        helper.make_node("Gather", ["embeddings", "ids32"], ["vectors"]),
        helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["maskf", "two"], ["mask3"]),
        helper.make_node("Mul", ["vectors", "mask3"], ["masked"]),
        helper.make_node("ReduceMean", ["masked"], ["pooled"], axes=[1], keepdims=0),
        helper.make_node("Gemm", ["pooled", "w"], ["logits"], transB=1),
    ]
    two = onnx.numpy_helper.from_array(np.array([2], np.int64), "two")
    return save_graph(
        path, nodes,
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                       ["batch", "sequence"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        [table, weights, two])


def _spec(*decls: TensorDecl) -> InputSpec:
    return InputSpec(decls)


def test_synthetic_set_is_the_same_when_drawn_twice_with_the_same_seed() -> None:
    spec = parse_input_spec("x:float32[batch,4]; ids:int64[batch,seq]")
    first, second = synthetic_set(spec), synthetic_set(spec)
    other = synthetic_set(spec, seed=SYNTHETIC_SEED + 1)
    assert len(first) == len(second) == MAX_SAMPLES
    for a, b in zip(first.samples, second.samples, strict=True):
        assert all(np.array_equal(a[k], b[k]) for k in ("x", "ids"))
    assert not np.array_equal(first.samples[0]["x"], other.samples[0]["x"])
    assert first.synthetic is not None and first.synthetic.seed == SYNTHETIC_SEED
    assert first.labels is None and first.source == "synthetic"


def test_synthetic_set_respects_declared_ranges_when_spec_gives_them() -> None:
    spec = _spec(TensorDecl("x", "float32", ("batch", 6), (-2.0, 3.0)),
                 TensorDecl("k", "int32", ("batch", 5), (5, 9)),
                 TensorDecl("h", "float16", ("batch", 3), (0.25, 0.5)))
    samples = synthetic_set(spec)
    x = np.stack([s["x"] for s in samples.samples])
    k = np.stack([s["k"] for s in samples.samples])
    h = np.stack([s["h"] for s in samples.samples])
    assert x.dtype == np.float32 and x.min() >= -2.0 and x.max() <= 3.0 and x.std() > 1.0
    assert k.dtype == np.int32 and set(np.unique(k)) == {5, 6, 7, 8, 9}
    assert h.dtype == np.float16 and h.min() >= 0.25 and h.max() <= 0.5
    assert samples.synthetic is not None
    assert [(r.name, r.distribution, r.low, r.high) for r in samples.synthetic.ranges] == [
        ("x", "uniform", -2.0, 3.0), ("k", "uniform", 5, 9), ("h", "uniform", 0.25, 0.5)]


def test_synthetic_set_draws_token_ids_within_vocabulary_and_mask_of_ones_when_graph_tells(
        tmp_path: Path) -> None:
    model = onnx.load(str(token_classifier(tmp_path / "tokens.onnx")))
    rows = embedding_rows(model)
    assert rows == {"input_ids": VOCAB}  # through the Cast; the mask indexes nothing
    spec = parse_input_spec("input_ids:int64[batch,sequence]; attention_mask:int64[batch,sequence]")
    samples = synthetic_set(spec, embedding_rows=rows)
    ids = np.stack([s["input_ids"] for s in samples.samples])
    mask = np.stack([s["attention_mask"] for s in samples.samples])
    assert ids.shape == (MAX_SAMPLES, DYNAMIC_LENGTH) and ids.dtype == np.int64
    assert ids.min() == 0 and ids.max() == VOCAB - 1
    assert (mask == 1).all()
    assert samples.synthetic is not None
    reasons = {r.name: r.reason for r in samples.synthetic.ranges}
    assert reasons["input_ids"] == f"token ids: indexes an embedding table of {VOCAB} rows"


@pytest.mark.parametrize("preprocessing", [EFFICIENTNET_LITE, IMAGENET])
def test_synthetic_images_stay_within_normalised_pixel_range_when_preprocessing_declared(
        preprocessing: object) -> None:
    spec = parse_input_spec("image:float32[batch,3,height,width]")
    samples = synthetic_set(spec, preprocessing=preprocessing)  # type: ignore[arg-type]
    pixels = np.stack([s["image"] for s in samples.samples])
    assert pixels.shape[1:] == (3, 224, 224)  # dynamic sides: the preprocessing's size
    mean = np.asarray(preprocessing.mean).reshape(3, 1, 1)  # type: ignore[attr-defined]
    std = np.asarray(preprocessing.std).reshape(3, 1, 1)  # type: ignore[attr-defined]
    lows, highs = (0 - mean) / std, (255 - mean) / std
    per_channel = pixels.transpose(1, 0, 2, 3).reshape(3, -1)
    assert (per_channel.min(axis=1) >= lows.ravel() - 1e-5).all()
    assert (per_channel.max(axis=1) <= highs.ravel() + 1e-5).all()
    assert (per_channel.max(axis=1) - per_channel.min(axis=1) > 0.95 * (highs - lows).ravel()).all()
    assert samples.synthetic is not None and samples.synthetic.ranges[0].reason.startswith("image")


def test_synthetic_set_defaults_when_nothing_says_a_range() -> None:
    spec = parse_input_spec("x:float32[batch,64]; pixels:uint8[batch,8]; flag:bool[batch,2]; "
                            "n:int64[batch,1]")
    samples = synthetic_set(spec)
    x = np.stack([s["x"] for s in samples.samples])
    assert abs(float(x.mean())) < 0.1 and 0.9 < float(x.std()) < 1.1  # standard normal
    pixels = np.stack([s["pixels"] for s in samples.samples])
    assert pixels.dtype == np.uint8 and int(pixels.max()) - int(pixels.min()) > 240
    assert set(np.unique(np.stack([s["flag"] for s in samples.samples]))) == {False, True}
    assert set(np.unique(np.stack([s["n"] for s in samples.samples]))) == {0, 1}


def test_synthetic_set_draws_fewer_samples_when_inputs_are_large() -> None:
    assert len(synthetic_set(parse_input_spec("x:float32[batch,3,224,224]"))) == MAX_SAMPLES
    big = synthetic_set(parse_input_spec("x:float32[batch,3,1024,1024]"))  # 12 MB each
    assert MIN_SAMPLES <= len(big) < MAX_SAMPLES
    assert len(synthetic_set(parse_input_spec("x:float32[batch,4]"), limit=10)) == 10


def test_convert_publishes_fp32_and_fp16_verified_on_synthetic_inputs_when_no_evaluation_set(
        tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    result = convert(ConversionRequest(
        source=str(token_classifier(tmp_path / "tokens.onnx")), name="tokens", repo=repo,
        precisions=("fp32", "fp16"), budget=AccuracyBudget(max_top1_drop=0.1, min_cosine=0.99),
        max_batch_size=4, profile_iterations=2, profile_warmup=1))
    assert result.version == 1 and (repo / "tokens" / "1" / "model.onnx").is_file()
    evaluation = result.report["evaluation"]
    assert evaluation["synthetic"] is True and evaluation["source"] == "synthetic"
    assert evaluation["seed"] == SYNTHETIC_SEED and evaluation["samples"] == MAX_SAMPLES
    assert evaluation["labelled"] is False
    ranges = {r["name"]: r for r in evaluation["ranges"]}
    assert ranges["input_ids"]["range"] == [0, VOCAB - 1]
    assert ranges["attention_mask"]["distribution"] == "ones"
    variants = {v["name"]: v for v in result.report["variants"]}
    assert result.report["task"] == "classification"  # top-1 against FP32, as with real data
    for name in ("fp32", "fp16"):
        accuracy = variants[name]["accuracy"]
        assert accuracy["samples"] == MAX_SAMPLES and accuracy["cosine"] > 0.999
        assert accuracy["top1"] is not None and accuracy["max_abs_err"] is not None
    assert [s.label for s in result.steps if s.label == "synthetic"] == ["synthetic"]
    markdown = (repo / "tokens" / "1" / "report" / "report.md").read_text()
    assert "verified on 64 synthetic inputs (seed 0), not on real data" in markdown
    assert "not how accurate it is on real data" in markdown
    assert "`input_ids`: uniform in [0, 49] (token ids" in markdown
    metadata = json.loads((repo / "tokens" / "1" / "metadata.json").read_text())
    assert metadata["evaluation"]["synthetic"] is True
    assert np.array_equal(result.evaluation.samples[3]["input_ids"],
                          synthetic_set(InputSpec(tuple(
                              TensorDecl(n, "int64", ("batch", "sequence"))
                              for n in ("input_ids", "attention_mask"))),
                              embedding_rows={"input_ids": VOCAB}).samples[3]["input_ids"])


def test_convert_cli_says_variants_were_verified_on_synthetic_inputs_when_no_eval(
        tmp_path: Path) -> None:
    spec = json.dumps([{"name": "input", "datatype": "FP32", "shape": ["batch", 3, 16, 16],
                        "range": [-1, 1]}])
    result = CliRunner().invoke(app, [
        "convert", str(small_cnn(tmp_path / "cnn.onnx")), "--name", "cnn",
        "--repo", str(tmp_path / "repo"), "--precisions", "fp32,fp16", "--input-spec", spec,
        "--max-batch-size", "2", "--profile-iterations", "2"])
    assert result.exit_code == 0, result.output
    said = " ".join(result.stdout.split())
    assert "verified on 64 synthetic inputs (seed 0), not on real data" in said
    assert "published cnn version 1" in said
    assert "Draw synthetic evaluation inputs (synthetic): done" in result.stderr
    report = json.loads((tmp_path / "repo" / "cnn" / "1" / "report" / "report.json").read_text())
    assert report["evaluation"]["ranges"] == [{"name": "input", "distribution": "uniform",
                                               "range": [-1, 1],
                                               "reason": "declared in the input spec"}]
    assert report["input_spec"][0]["range"] == [-1, 1]


def test_convert_draws_token_ids_from_exported_graph_when_source_is_pytorch(
        tmp_path: Path) -> None:
    """The vocabulary is read from the exported graph: a PyTorch source declares only
    ``ids:int64[batch,sequence]``."""
    result = convert(ConversionRequest(
        source="tests.converters.torch_models:token_with_spec", name="tokens",
        repo=tmp_path / "repo", precisions=("fp32",), max_batch_size=2, profile_iterations=2,
        profile_warmup=1))
    (ids,) = result.report["evaluation"]["ranges"]
    assert ids["range"] == [0, TOKEN_VOCAB - 1] and "embedding table" in ids["reason"]
    drawn = np.stack([s["ids"] for s in result.evaluation.samples])
    assert drawn.max() > 1 and drawn.max() < TOKEN_VOCAB
    assert result.report["variants"][0]["accuracy"]["cosine"] > 0.9999
