"""Payloads built from model metadata: what the locustfiles send."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from loadtests.workload import (
    ModelMeta,
    ModelMix,
    example_inputs,
    grpc_inputs,
    http_binary_payload,
    http_json_payload,
)

META = ModelMeta.from_json({
    "name": "m",
    "inputs": [{"name": "input", "datatype": "FP32", "shape": ["-1", "3", "4"]},
               {"name": "ids", "datatype": "INT64", "shape": [-1, -1]}],
    "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}],
})


def test_model_mix_parse_rejects_empty_or_negative_weights() -> None:
    with pytest.raises(ValueError):
        ModelMix.parse("")
    with pytest.raises(ValueError):
        ModelMix.parse("a:-1")
    with pytest.raises(ValueError):
        ModelMix.parse("a:0")


def test_model_mix_choose_follows_weights_when_sampled() -> None:
    mix = ModelMix.parse("a:3,b:1")
    rng = random.Random(0)
    picks = [mix.choose(rng) for _ in range(4000)]
    assert picks.count("a") / len(picks) == pytest.approx(0.75, abs=0.03)


def test_example_inputs_put_the_batch_on_the_dynamic_first_axis() -> None:
    arrays = example_inputs(META, batch_size=4)
    assert arrays["input"].shape == (4, 3, 4) and arrays["input"].dtype == np.float32
    assert arrays["ids"].shape == (4, 1) and arrays["ids"].dtype == np.int64


def test_http_json_payload_carries_every_value() -> None:
    arrays = example_inputs(META, batch_size=2)
    body = json.loads(http_json_payload(META, arrays).body)
    first = body["inputs"][0]
    assert first["shape"] == [2, 3, 4] and len(first["data"]) == 24
    np.testing.assert_allclose(first["data"], arrays["input"].ravel(), rtol=1e-6)


def test_http_binary_payload_is_json_header_then_raw_tensors() -> None:
    arrays = example_inputs(META, batch_size=2)
    payload = http_binary_payload(META, arrays)
    header_len = int(payload.headers["Inference-Header-Content-Length"])
    header = json.loads(payload.body[:header_len])
    assert [i["name"] for i in header["inputs"]] == ["input", "ids"]
    raw = payload.body[header_len:]
    assert raw[: arrays["input"].nbytes] == arrays["input"].tobytes()
    assert len(raw) == arrays["input"].nbytes + arrays["ids"].nbytes
    assert header["outputs"] == [{"name": "logits", "parameters": {"binary_data": True}}]


def test_grpc_inputs_match_metadata_names_and_shapes() -> None:
    inputs = grpc_inputs(META, example_inputs(META, batch_size=3))
    assert [(i.name(), i.shape(), i.datatype()) for i in inputs] == [
        ("input", [3, 3, 4], "FP32"), ("ids", [3, 1], "INT64")]
