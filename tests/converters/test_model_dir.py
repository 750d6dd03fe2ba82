"""converters/model_dir.py: an ONNX model written for serving (its large weights in a
file beside the graph). The whole directory, written by a conversion and served by a real
Triton: test_convert_efficientnet.py, test_triton_serving.py."""

from __future__ import annotations

import stat
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from converters.errors import InvalidSource
from converters.model_dir import WEIGHTS_APART_BYTES, write_onnx
from tests.converters.test_footprint import matmul_model

LARGE = 1024  # [1024, 1024] FP32 weights: 4 MiB, past WEIGHTS_APART_BYTES
SMALL = 16


def answers(path: Path, width: int) -> np.ndarray:
    x = np.random.default_rng(1).standard_normal((3, width)).astype(np.float32)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {"x": x})[0])


def kept_apart(path: Path) -> list[str]:
    model = onnx.load(str(path), load_external_data=False)
    return [t.name for t in model.graph.initializer
            if t.data_location == onnx.TensorProto.EXTERNAL]


def test_large_weights_go_beside_the_graph_readable_as_it_is_and_answer_alike(
        tmp_path: Path) -> None:
    source = matmul_model(tmp_path / "source.onnx", LARGE)
    assert LARGE * LARGE * 4 > WEIGHTS_APART_BYTES
    (tmp_path / "served").mkdir()
    target = tmp_path / "served" / "model.onnx"

    written = write_onnx(source, target)

    data = tmp_path / "served" / "model.onnx.data"
    assert written == [target, data]
    assert kept_apart(target) == ["w"]
    assert target.stat().st_size < 4096 and data.stat().st_size == LARGE * LARGE * 4
    assert stat.S_IMODE(data.stat().st_mode) == stat.S_IMODE(target.stat().st_mode)
    np.testing.assert_array_equal(answers(target, LARGE), answers(source, LARGE))


def test_written_again_over_itself_the_weights_file_is_replaced_not_appended(
        tmp_path: Path) -> None:
    source = matmul_model(tmp_path / "source.onnx", LARGE)
    (tmp_path / "served").mkdir()
    target = tmp_path / "served" / "model.onnx"
    write_onnx(source, target)
    write_onnx(source, target)
    assert (tmp_path / "served" / "model.onnx.data").stat().st_size == LARGE * LARGE * 4
    np.testing.assert_array_equal(answers(target, LARGE), answers(source, LARGE))


def test_a_small_model_stays_one_file(tmp_path: Path) -> None:
    source = matmul_model(tmp_path / "source.onnx", SMALL)
    target = tmp_path / "model.onnx"
    assert write_onnx(source, target) == [target]
    assert target.read_bytes() == source.read_bytes()
    assert not (tmp_path / "model.onnx.data").exists()


def test_a_small_model_whose_weights_were_apart_is_written_as_one_file(
        tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    apart = tmp_path / "src" / "model.onnx"
    onnx.save(onnx.load(str(matmul_model(tmp_path / "one.onnx", SMALL))), str(apart),
              save_as_external_data=True, location="weights.bin", size_threshold=0)
    assert kept_apart(apart) == ["w"]
    target = tmp_path / "model.onnx"
    assert write_onnx(apart, target) == [target]
    assert kept_apart(target) == []
    np.testing.assert_array_equal(answers(target, SMALL), answers(apart, SMALL))


def test_a_graph_whose_weights_file_is_missing_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "out").mkdir()
    write_onnx(matmul_model(tmp_path / "source.onnx", LARGE), tmp_path / "src" / "model.onnx")
    (tmp_path / "src" / "model.onnx.data").unlink()
    with pytest.raises(InvalidSource, match="model.onnx.data is missing"):
        write_onnx(tmp_path / "src" / "model.onnx", tmp_path / "out" / "model.onnx")
    assert list((tmp_path / "out").iterdir()) == []
