"""The models owners actually bring, each converting end to end (published, served
outputs equal to the source's) or refused with a clear, whole error:

- default-IR models from the pinned ``onnx`` (IR 14, newer than ONNX Runtime 1.31 loads);
- a default-opset model (opset 28, newer than the runtime runs) and an op the runtime
  lacks (SwiGLU, opset 28 only): converted down, or refused naming the opset;
- weights in external data files beside the ``.onnx`` (and missing ones);
- FP16 source models; several inputs and outputs of mixed dtypes (int64, bool, fp16);
- dynamic dimensions with odd names, or with no name at all;
- opsets 13-21;
- ``torch.export`` programs with dynamic batch *and* sequence axes; TorchScript modules;
- an ONNX file in a ``.gz``/zip wrapper or under a wrong extension: refused.

Models are tiny (a few hundred parameters) and converted at FP32 with few profiling
runs: this is about what the converter accepts, not about speed.
"""

from __future__ import annotations

import gzip
import json
import shutil
import zipfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from converters.compat import local_runtime_limits, min_ir_for_opset
from converters.errors import ConversionError, InvalidSource, UnsupportedOpset
from converters.pipeline import ConversionFailed, ConversionRequest, ConversionResult, convert
from converters.spec import parse_input_spec
from converters.triton_config import parse_model_config
from infergate.cli import app
from tests.converters.conftest import small_cnn, tree
from tests.converters.torch_models import TinyNet

RNG = np.random.default_rng(7)


def _sets(tmp_path: Path, arrays: Mapping[str, np.ndarray]) -> tuple[Path, Path]:
    """Calibration and evaluation .npz sets: the first and second half of ``arrays``."""
    half = len(next(iter(arrays.values()))) // 2
    calib, evaluation = tmp_path / "calib.npz", tmp_path / "eval.npz"
    np.savez(calib, **{k: v[:half] for k, v in arrays.items()})
    np.savez(evaluation, **{k: v[half:] for k, v in arrays.items()})
    return calib, evaluation


def _convert(source: Path | str, tmp_path: Path, arrays: Mapping[str, np.ndarray],
             precisions: tuple[str, ...] = ("fp32",), **extra: object) -> ConversionResult:
    calib, evaluation = _sets(tmp_path, arrays)
    return convert(ConversionRequest(
        source=str(source), name="zoo", repo=tmp_path / "repo",
        precisions=precisions,  # type: ignore[arg-type]
        calibration=calib if "int8" in precisions else None, evaluation=evaluation,
        max_batch_size=4, profile_iterations=2, profile_warmup=1, sensitivity_samples=4,
        **extra))  # type: ignore[arg-type]


def _served(result: ConversionResult) -> Path:
    return result.path / str(result.version) / "model.onnx"


def _same_outputs(source: Path, served: Path, feeds: Mapping[str, np.ndarray]) -> None:
    want = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]) \
        if onnx.load(str(source), load_external_data=False).ir_version <= \
        local_runtime_limits().max_ir_version else None
    got = ort.InferenceSession(str(served), providers=["CPUExecutionProvider"]).run(None, feeds)
    if want is not None:
        for a, b in zip(want.run(None, feeds), got, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def _images(count: int = 16) -> dict[str, np.ndarray]:
    return {"input": RNG.standard_normal((count, 3, 16, 16)).astype(np.float32)}


def _cnn_with(tmp_path: Path, ir_version: int | None = None, opset: int | None = 17,
              name: str = "cnn.onnx") -> Path:
    """The conftest CNN, re-saved as ``helper.make_model`` leaves it (default IR) or with
    the given IR version / opset."""
    model = onnx.load(str(small_cnn(tmp_path / "base.onnx")))
    rebuilt = helper.make_model(model.graph, opset_imports=[helper.make_opsetid("", opset)]) \
        if opset is not None else helper.make_model(model.graph)
    if ir_version is not None:
        rebuilt.ir_version = ir_version
    onnx.save(rebuilt, str(tmp_path / name))
    return tmp_path / name


# -- IR version and opset ------------------------------------------------------------------

def test_convert_brings_ir_version_down_when_pinned_onnx_writes_a_newer_one(
        tmp_path: Path) -> None:
    source = _cnn_with(tmp_path)  # helper.make_model's default IR version
    written = onnx.load(str(source)).ir_version
    limit = local_runtime_limits().max_ir_version
    assert written > limit, "the pinned onnx no longer writes a newer IR: test is moot"
    result = _convert(source, tmp_path, _images())
    served = onnx.load(str(_served(result)))
    assert served.ir_version == limit
    assert any(f"IR version {written} -> {limit}" in n for n in result.report["notes"])
    assert result.report["facts"]["ir_version"] == limit
    _same_outputs(source, _served(result), {"input": _images(2)["input"]})


def test_convert_brings_opset_down_when_model_uses_the_default_opset(tmp_path: Path) -> None:
    source = _cnn_with(tmp_path, opset=None)  # onnx's newest opset
    opset = onnx.defs.onnx_opset_version()
    limits = local_runtime_limits()
    assert opset > limits.max_opset
    result = _convert(source, tmp_path, _images())
    served = onnx.load(str(_served(result)))
    assert served.opset_import[0].version == limits.max_opset
    assert any(f"opset {opset} -> {limits.max_opset}" in n for n in result.report["notes"])


def _swiglu(tmp_path: Path) -> Path:
    node = helper.make_node("SwiGLU", ["input"], ["output"])
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 4])])
    path = tmp_path / "swiglu.onnx"
    onnx.save(helper.make_model(graph), str(path))
    return path


def test_convert_names_opset_and_runtime_limit_when_an_op_cannot_be_converted_down(
        tmp_path: Path) -> None:
    source = _swiglu(tmp_path)
    limits = local_runtime_limits()
    with pytest.raises(ConversionFailed) as failed:
        _convert(source, tmp_path, {"input": RNG.standard_normal((8, 8)).astype(np.float32)})
    assert isinstance(failed.value.cause, UnsupportedOpset)
    message = str(failed.value)
    assert message.splitlines()[0].startswith("Re-export swiglu.onnx with opset <= ")
    assert f"uses ai.onnx opset {onnx.defs.onnx_opset_version()}" in message
    assert f"{limits.runtime} runs opsets up to {limits.max_opset}" in message
    assert "SwiGLU" in message  # the version converter's own reason, whole


@pytest.mark.parametrize("opset", range(13, 22))
def test_convert_publishes_model_when_opset_is_between_13_and_21(tmp_path: Path,
                                                                 opset: int) -> None:
    source = _cnn_with(tmp_path, ir_version=min_ir_for_opset(opset), opset=opset)
    result = _convert(source, tmp_path, _images())
    served = onnx.load(str(_served(result)))
    assert served.opset_import[0].version == max(opset, 17)
    _same_outputs(source, _served(result), {"input": _images(3)["input"]})


# -- external data ---------------------------------------------------------------------------

def _external(tmp_path: Path) -> Path:
    model = onnx.load(str(small_cnn(tmp_path / "base.onnx")))
    folder = tmp_path / "upload"
    (folder / "weights").mkdir(parents=True)
    onnx.save(model, str(folder / "model.onnx"), save_as_external_data=True,
              all_tensors_to_one_file=True, location="weights/model.bin", size_threshold=0)
    return folder / "model.onnx"


def test_convert_publishes_one_file_when_weights_are_external_data(tmp_path: Path) -> None:
    """(A small model's: past model_dir.WEIGHTS_APART_BYTES they go beside the graph.)"""
    source = _external(tmp_path)
    assert (source.parent / "weights" / "model.bin").is_file()
    result = _convert(source, tmp_path, _images())
    served = onnx.load(str(_served(result)), load_external_data=False)
    assert not any(t.data_location == TensorProto.EXTERNAL for t in served.graph.initializer)
    _same_outputs(source, _served(result), {"input": _images(2)["input"]})


def test_convert_names_the_missing_weights_file_when_external_data_is_absent(
        tmp_path: Path) -> None:
    source = _external(tmp_path)
    shutil.rmtree(source.parent / "weights")
    with pytest.raises(ConversionFailed) as failed:
        _convert(source, tmp_path, _images())
    assert "model.bin" in str(failed.value)
    assert str(failed.value).splitlines()[0].startswith("Give the model together with")
    assert "or as one file with its weights inlined" in str(failed.value)


# -- dtypes ------------------------------------------------------------------------------------

def _fp16_cnn(tmp_path: Path) -> Path:
    model = onnx.load(str(small_cnn(tmp_path / "base.onnx")))
    for init in model.graph.initializer:
        array = numpy_helper.to_array(init).astype(np.float16)
        init.CopyFrom(numpy_helper.from_array(array, init.name))
    for value in [*model.graph.input, *model.graph.output]:
        value.type.tensor_type.elem_type = TensorProto.FLOAT16
    path = tmp_path / "fp16.onnx"
    onnx.save(model, str(path))
    return path


def test_convert_serves_fp16_inputs_when_source_model_is_fp16(tmp_path: Path) -> None:
    source = _fp16_cnn(tmp_path)
    images = {"input": _images()["input"].astype(np.float16)}
    result = _convert(source, tmp_path, images, precisions=("fp32", "fp16"))
    config = (result.path / "config.pbtxt").read_text()
    assert "TYPE_FP16" in config
    _same_outputs(source, _served(result), {"input": images["input"][:2]})


def _mixed_io(tmp_path: Path) -> Path:
    """x fp32 [batch,4], ids int64 [batch,seq], mask bool [batch,seq], h fp16 [batch,4] ->
    y fp32, total int64 [batch], any bool [batch], h2 fp16."""
    value = helper.make_tensor_value_info
    weight = numpy_helper.from_array(RNG.standard_normal((4, 3)).astype(np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["y"]),
        helper.make_node("Cast", ["mask"], ["mask64"], to=TensorProto.INT64),
        helper.make_node("Mul", ["ids", "mask64"], ["kept"]),
        helper.make_node("ReduceSum", ["kept", "one"], ["total"], keepdims=0),
        helper.make_node("Cast", ["mask"], ["maskf"], to=TensorProto.FLOAT),
        helper.make_node("ReduceMax", ["maskf", "one"], ["anyf"], keepdims=0),
        helper.make_node("Cast", ["anyf"], ["any"], to=TensorProto.BOOL),
        helper.make_node("Add", ["h", "h"], ["h2"]),
    ]
    graph = helper.make_graph(
        nodes, "mixed",
        [value("x", TensorProto.FLOAT, ["batch", 4]),
         value("ids", TensorProto.INT64, ["batch", "seq"]),
         value("mask", TensorProto.BOOL, ["batch", "seq"]),
         value("h", TensorProto.FLOAT16, ["batch", 4])],
        [value("y", TensorProto.FLOAT, ["batch", 3]), value("total", TensorProto.INT64, ["batch"]),
         value("any", TensorProto.BOOL, ["batch"]), value("h2", TensorProto.FLOAT16, ["batch", 4])],
        initializer=[weight, numpy_helper.from_array(np.array([1], np.int64), "one")])
    path = tmp_path / "mixed.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]),
              str(path))
    return path


def _mixed_arrays(count: int = 12) -> dict[str, np.ndarray]:
    return {"x": RNG.standard_normal((count, 4)).astype(np.float32),
            "ids": RNG.integers(0, 1000, (count, 6)).astype(np.int64),
            "mask": RNG.random((count, 6)) > 0.3,
            "h": RNG.standard_normal((count, 4)).astype(np.float16)}


def test_convert_serves_every_dtype_when_inputs_and_outputs_mix_int64_bool_fp16(
        tmp_path: Path) -> None:
    source = _mixed_io(tmp_path)
    result = _convert(source, tmp_path, _mixed_arrays(), precisions=("fp32", "int8"))
    config = (result.path / "config.pbtxt").read_text()
    for dtype in ("TYPE_FP32", "TYPE_INT64", "TYPE_BOOL", "TYPE_FP16"):
        assert dtype in config
    arrays = _mixed_arrays(3)
    _same_outputs(source, _served(result), arrays)


# -- dynamic dimensions ---------------------------------------------------------------------

@pytest.mark.parametrize("batch, width", [
    ("N", "width-px"), ("batch size", "w/2"), ("", ""), ("unk__617", "")])
def test_convert_keeps_dynamic_axes_when_names_are_odd_or_missing(
        tmp_path: Path, batch: str, width: str) -> None:
    model = onnx.load(str(small_cnn(tmp_path / "base.onnx")))
    dims = model.graph.input[0].type.tensor_type.shape.dim
    for dim, name in ((dims[0], batch), (dims[3], width)):
        dim.Clear()
        if name:
            dim.dim_param = name
    out = model.graph.output[0].type.tensor_type.shape.dim[0]
    out.Clear()
    if batch:
        out.dim_param = batch
    source = tmp_path / "odd.onnx"
    onnx.save(model, str(source))
    arrays = {"input": np.concatenate([_images(8)["input"],
                                       _images(8)["input"]])}
    result = _convert(source, tmp_path, arrays)
    config = parse_model_config((result.path / "config.pbtxt").read_text())
    assert list(config.input[0].dims) == [3, 16, -1]  # named or not, the width is dynamic
    assert config.max_batch_size >= 1
    wide = RNG.standard_normal((5, 3, 16, 24)).astype(np.float32)
    _same_outputs(source, _served(result), {"input": wide})


# -- PyTorch sources ----------------------------------------------------------------------

class _Pool(torch.nn.Module):
    """Token embeddings mean-pooled over a dynamic sequence axis."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(50, 8)
        self.proj = torch.nn.Linear(8, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.proj(self.embed(ids).mean(dim=1))


def test_convert_keeps_batch_and_sequence_dynamic_when_torch_export_declares_both(
        tmp_path: Path) -> None:
    batch, seq = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("seq", min=2,
                                                                             max=128)
    module = _Pool().eval()
    program = torch.export.export(module, (torch.randint(0, 50, (2, 8)),),
                                  dynamic_shapes={"ids": {0: batch, 1: seq}})
    torch.export.save(program, tmp_path / "pool.pt2")
    ids = RNG.integers(0, 50, (12, 10)).astype(np.int64)
    result = _convert(tmp_path / "pool.pt2", tmp_path, {"ids": ids},
                      input_spec=parse_input_spec("ids:int64[batch,seq]"))
    session = ort.InferenceSession(str(_served(result)), providers=["CPUExecutionProvider"])
    longer = RNG.integers(0, 50, (3, 37)).astype(np.int64)
    with torch.no_grad():
        want = module(torch.from_numpy(longer)).numpy()
    np.testing.assert_allclose(session.run(None, {"ids": longer})[0], want, atol=1e-5)


def test_convert_publishes_torchscript_module_when_source_is_scripted(tmp_path: Path) -> None:
    scripted = torch.jit.script(TinyNet().eval())
    scripted.save(str(tmp_path / "tiny.pt"))
    images = {"image": _images()["input"]}
    result = _convert(tmp_path / "tiny.pt", tmp_path, images,
                      input_spec=parse_input_spec("image:float32[batch,3,16,16]"))
    session = ort.InferenceSession(str(_served(result)), providers=["CPUExecutionProvider"])
    x = _images(5)["input"]
    with torch.no_grad():
        want = scripted(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(session.run(None, {"image": x})[0], want, atol=1e-5)


# -- wrappers and extensions: refused -----------------------------------------------------

def _wrapped(tmp_path: Path, kind: str) -> Path:
    onnx_bytes = small_cnn(tmp_path / "base.onnx").read_bytes()
    if kind == "gz":
        path = tmp_path / "model.onnx.gz"
        path.write_bytes(gzip.compress(onnx_bytes))
    elif kind == "gz-named-onnx":
        path = tmp_path / "model.onnx"
        path.write_bytes(gzip.compress(onnx_bytes))
    elif kind == "zip-named-onnx":
        path = tmp_path / "model.onnx"
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("model.onnx", onnx_bytes)
    else:
        path = tmp_path / "model.bin"
        path.write_bytes(onnx_bytes)
    return path


@pytest.mark.parametrize("kind, first_line, reason", [
    ("gz", "Decompress model.onnx.gz and give the .onnx file inside it",
     "model.onnx.gz is gzip-compressed, not an ONNX model"),
    ("gz-named-onnx", "Decompress model.onnx and give the .onnx file inside it",
     "model.onnx is gzip-compressed, not an ONNX model"),
    ("zip-named-onnx", "Give the ONNX model itself, or a TorchScript archive named .pt",
     "model.onnx is named .onnx but is a zip archive"),
    ("wrong-extension", "Rename model.bin to model.onnx",
     "model.bin looks like an ONNX model but its extension is .bin"),
])
def test_convert_refuses_clearly_when_onnx_is_wrapped_or_misnamed(
        tmp_path: Path, kind: str, first_line: str, reason: str) -> None:
    source = _wrapped(tmp_path, kind)
    _, evaluation = _sets(tmp_path, _images())
    repo = tmp_path / "repo"
    result = CliRunner().invoke(app, ["convert", str(source), "--name", "m", "--repo",
                                      str(repo), "--precisions", "fp32", "--eval",
                                      str(evaluation), "--json"])
    assert result.exit_code == 2, result.output
    error = json.loads(result.stdout)
    assert error["action"] == first_line
    assert error["error"].splitlines()[0] == first_line + "."
    assert reason in error["reason"]
    assert error["kind"] == "InvalidSource"
    assert tree(repo) == []


def test_load_errors_are_conversion_errors_when_source_is_wrapped(tmp_path: Path) -> None:
    from converters.sources import load_source

    with pytest.raises(InvalidSource) as refused:
        load_source(str(_wrapped(tmp_path, "gz")))
    assert isinstance(refused.value, ConversionError)
