"""Converter fixtures: real photo/text sample sets and the two end-to-end conversions
(EfficientNet-Lite0 and MiniLM), each run once per session and shared by the tests that
inspect them. Sizes are small on purpose (2 shared cores); loadtests/bench_converter.py
does the full-size measurement."""

from __future__ import annotations

import fcntl
import os
import pickle
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from converters.images import EFFICIENTNET_LITE, SAMPLE_PHOTOS
from converters.metrics import AccuracyBudget
from converters.minilm import SENTENCES, write_token_set
from converters.pipeline import ConversionRequest, ConversionResult, convert
from converters.samples import SAMPLE_MODEL_NAME, write_photo_views
from converters.steps.base import ProgressEvent


@dataclass(frozen=True)
class Conversion:
    request: ConversionRequest
    result: ConversionResult
    events: tuple[ProgressEvent, ...]


@pytest.fixture(scope="session")
def photo_sets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(calibration, evaluation) image folders: crops/flips of the bundled photos with
    different seeds, so no evaluation view is a calibration view."""
    root = tmp_path_factory.mktemp("photos")
    calibration = write_photo_views(root / "calib", SAMPLE_PHOTOS, per_photo=3, seed=1000)
    evaluation = write_photo_views(root / "eval", SAMPLE_PHOTOS, per_photo=4, seed=0)
    return calibration, evaluation


@pytest.fixture(scope="session")
def token_sets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(calibration, evaluation) token sets from disjoint sentences; two sequence
    lengths in each, so batches of different lengths run through the dynamic axis."""
    root = tmp_path_factory.mktemp("tokens")
    calibration = write_token_set(root / "calib", SENTENCES[:24], lengths=(16, 32))
    evaluation = write_token_set(root / "eval", SENTENCES[32:56], lengths=(24, 40))
    return calibration, evaluation


@pytest.fixture(scope="session")
def effnet_onnx(sample_repo: Path) -> Path:
    """The sample model's ONNX export (real ImageNet weights), exported once per session."""
    return sample_repo / SAMPLE_MODEL_NAME / "1" / "model.onnx"


def _run(request: ConversionRequest) -> Conversion:
    events: list[ProgressEvent] = []
    result = convert(request, progress=events.append)
    return Conversion(request, result, tuple(events))


def _once_per_run(name: str, tmp_path_factory: pytest.TempPathFactory,
                  make: Callable[[], Conversion]) -> Conversion:
    """``make()`` once per test run, whichever pytest-xdist worker asks first: under
    ``--dist loadfile`` the files that need a conversion may run on both workers, and
    each converted it again (EfficientNet's 30-45 s of a core, MiniLM's 30 s). The
    others wait for it (a lock in the run's shared temporary folder) and read what it
    made; every test of theirs only reads the published folders, which stay in the
    first worker's temporary folder until the run's end. Without xdist: ``make()``."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return make()
    shared = tmp_path_factory.getbasetemp().parent  # popen-gw0, popen-gw1... live here
    made = shared / f"{name}.pickle"
    with (shared / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released as the file closes
        if made.is_file():
            return pickle.loads(made.read_bytes())  # noqa: S301 - this run's own file
        conversion = make()
        made.write_bytes(pickle.dumps(conversion))
        return conversion


@pytest.fixture(scope="session")
def effnet_conversion(effnet_onnx: Path, photo_sets: tuple[Path, Path],
                      tmp_path_factory: pytest.TempPathFactory) -> Conversion:
    calibration, evaluation = photo_sets
    return _once_per_run("effnet", tmp_path_factory, lambda: _run(ConversionRequest(
        source=str(effnet_onnx), name="effnet",
        repo=tmp_path_factory.mktemp("effnet") / "model_repo",
        precisions=("fp32", "fp16", "int8"), calibration=calibration, evaluation=evaluation,
        preprocessing=EFFICIENTNET_LITE, budget=AccuracyBudget(max_top1_drop=0.01,
                                                               min_cosine=0.99),
        max_batch_size=2, profile_iterations=3, profile_warmup=1, sensitivity_samples=6,
        max_float_fraction=0.5,
    )))


@pytest.fixture(scope="session")
def minilm_conversion(token_sets: tuple[Path, Path],
                      tmp_path_factory: pytest.TempPathFactory) -> Conversion:
    calibration, evaluation = token_sets
    return _once_per_run("minilm", tmp_path_factory, lambda: _run(ConversionRequest(
        source="converters.minilm:sentence_encoder", name="minilm",
        repo=tmp_path_factory.mktemp("minilm") / "model_repo",
        precisions=("fp32", "int8"), calibration=calibration, evaluation=evaluation,
        budget=AccuracyBudget(max_top1_drop=None, min_cosine=0.99),
        max_batch_size=2, profile_iterations=3, profile_warmup=1, sensitivity_samples=6,
    )))


def tree(root: Path) -> list[tuple[str, int, int]]:
    """Every path under ``root`` with its size and mtime: equal listings = untouched."""
    if not root.exists():
        return []
    return sorted((str(p.relative_to(root)), p.stat().st_size if p.is_file() else -1,
                   p.stat().st_mtime_ns) for p in root.rglob("*"))


def save_graph(path: Path, nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
               outputs: list[onnx.ValueInfoProto], initializers: Sequence[onnx.TensorProto] = (),
               opset: int = 17, domains: tuple[tuple[str, int], ...] = ()) -> Path:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    opsets = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, v) for d, v in domains)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def small_cnn(path: Path, seed: int = 0) -> Path:
    """Conv(3->8)+Relu -> Conv(8->8)+Clip -> GlobalAveragePool -> Flatten -> Gemm(8->10),
    FP32 ``input`` [batch, 3, 16, 16] -> ``logits`` [batch, 10]."""
    rng = np.random.default_rng(seed)

    def init(name: str, *shape: int) -> onnx.TensorProto:
        return onnx.numpy_helper.from_array(
            (rng.standard_normal(shape) * 0.3).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], name="conv1", pads=[1] * 4),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1] * 4),
        helper.make_node("Clip", ["c2", "lo", "hi"], ["r2"], name="clip2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["logits"], name="fc", transB=1),
    ]
    inits = [init("w1", 8, 3, 3, 3), init("b1", 8), init("w2", 8, 8, 3, 3), init("b2", 8),
             init("w3", 10, 8), init("b3", 10),
             onnx.numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
             onnx.numpy_helper.from_array(np.array(6.0, np.float32), "hi")]
    return save_graph(
        path, nodes,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 16, 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])], inits)


def cnn_samples(path: Path, count: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    np.save(path, rng.standard_normal((count, 3, 16, 16)).astype(np.float32))
    return path


@pytest.fixture()
def cnn_files(tmp_path: Path) -> Callable[[], tuple[Path, Path, Path]]:
    """A small CNN with separate calibration/evaluation .npy sets."""
    def make() -> tuple[Path, Path, Path]:
        model = small_cnn(tmp_path / "cnn.onnx")
        return (model, cnn_samples(tmp_path / "calib.npy", 16, 1),
                cnn_samples(tmp_path / "eval.npy", 16, 2))
    return make


def copy_repo(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target
