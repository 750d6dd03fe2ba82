"""MiniLM sentence embeddings (real weights) end to end: INT64 token ids + mask, dynamic
sequence length, agreement measured by cosine similarity; dynamic INT8 for the encoder."""

from __future__ import annotations

import onnxruntime as ort
import pytest

from converters.triton_config import parse_model_config
from tests.converters.conftest import Conversion

pytestmark = pytest.mark.slow


def test_minilm_exports_dynamic_batch_and_sequence_when_converted(
        minilm_conversion: Conversion) -> None:
    result = minilm_conversion.result
    model = result.path / str(result.version) / "model.onnx"
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    assert [(i.name, i.type, i.shape) for i in session.get_inputs()] == [
        ("input_ids", "tensor(int64)", ["batch", "sequence"]),
        ("attention_mask", "tensor(int64)", ["batch", "sequence"])]
    export = result.report["export"]
    assert export["exporter"] == "torchscript" and export["min_cosine"] > 0.9999
    config = parse_model_config((result.path / "config.pbtxt").read_text())
    assert [list(i.dims) for i in config.input] == [[-1], [-1]]
    assert list(config.output[0].dims) == [384]


def test_minilm_measures_cosine_not_top1_when_output_is_embedding(
        minilm_conversion: Conversion) -> None:
    report = minilm_conversion.result.report
    assert report["task"] == "other"
    variants = {v["name"]: v for v in report["variants"]}
    assert set(variants) == {"fp32", "int8", "int8-dynamic"}  # an encoder: dynamic tried too
    for variant in variants.values():
        assert variant["accuracy"]["top1"] is None
        assert variant["accuracy"]["samples"] == 24


def test_minilm_serves_a_variant_within_the_cosine_budget_when_int8_requested(
        minilm_conversion: Conversion) -> None:
    result = minilm_conversion.result
    variants = {v["name"]: v for v in result.report["variants"]}
    chosen = variants[result.chosen]
    assert chosen["accuracy"]["cosine"] >= 0.99
    losers = [v for v in variants.values() if not v["verdict"]["chosen"]]
    assert all(v["verdict"]["reason"] for v in losers)
    dynamic = variants["int8-dynamic"]
    if dynamic["verdict"]["within_budget"]:
        assert dynamic["accuracy"]["cosine"] >= 0.99
    static = variants["int8"]
    if not static["verdict"]["within_budget"]:
        assert "cosine" in static["verdict"]["reason"] or "rejected" in \
            static["verdict"]["reason"]
