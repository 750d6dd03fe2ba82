"""gateway/lifecycle/client.py: an upload's model file. A model the converter published
with its weights beside it is sent as one file (the CLI's upload of it: test_models_cli;
against a real gateway: conversion/test_conversion.py uploads the sample's)."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from converters.model_dir import write_onnx
from gateway.lifecycle import client
from gateway.lifecycle.client import file_part, model_as_one_file
from tests.converters.test_footprint import matmul_model

WIDTH = 1024  # 4 MiB of weights: published beside the graph


def published_model(folder: Path) -> Path:
    """``folder/1/model.onnx`` as the converter publishes it: its weights in
    ``model.onnx.data`` beside it."""
    (folder / "1").mkdir()
    return write_onnx(matmul_model(folder / "source.onnx", WIDTH), folder / "1" / "model.onnx")[0]


@pytest.fixture
def published(tmp_path: Path) -> Path:
    return published_model(tmp_path)


def test_a_model_with_its_weights_beside_it_is_sent_as_one_file_with_them(
        published: Path) -> None:
    assert (published.parent / "model.onnx.data").is_file()
    sent = model_as_one_file(published)
    assert sent is not None
    model = onnx.load_from_string(sent)
    (weights,) = model.graph.initializer
    assert weights.data_location == onnx.TensorProto.DEFAULT
    assert len(weights.raw_data) == WIDTH * WIDTH * 4
    assert file_part("model", published) == ("model.onnx", sent)


def test_a_model_in_one_file_or_any_other_file_is_sent_as_it_is(tmp_path: Path) -> None:
    one = matmul_model(tmp_path / "one.onnx", 16)
    assert model_as_one_file(one) is None
    assert file_part("model", one) == ("one.onnx", one.read_bytes())
    for name, content in (("model.pt2", b"exported"), ("bad.onnx", b"not an onnx model")):
        (tmp_path / name).write_bytes(content)
        assert model_as_one_file(tmp_path / name) is None
        assert file_part("model", tmp_path / name) == (name, content)


def test_a_model_whose_weights_file_is_missing_is_refused_before_it_is_sent(
        published: Path) -> None:
    (published.parent / "model.onnx.data").unlink()
    with pytest.raises(ValueError, match="keeps its weights in files beside it, and cannot be "
                                         "sent as one file"):
        model_as_one_file(published)


def test_a_file_too_large_to_be_a_graph_alone_is_sent_as_it_is_unread(
        published: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """(One over the bound holds its weights: not parsed, so not held in memory, to find
    out.)"""
    monkeypatch.setattr(client, "GRAPH_ALONE_BYTES", published.stat().st_size - 1)
    assert model_as_one_file(published) is None
    monkeypatch.setattr(client, "GRAPH_ALONE_BYTES", published.stat().st_size)
    assert model_as_one_file(published) is not None
