"""Model sources: torch.export programs, TorchScript, entry points and ONNX, each
converted with a dynamic batch axis; plus the command line's success path."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from typer.testing import CliRunner

from converters.errors import InvalidSource
from converters.pipeline import ConversionRequest, convert
from converters.repository import existing_versions
from converters.sources import load_source, source_kind
from converters.spec import parse_input_spec
from infergate.cli import app
from tests.converters.conftest import cnn_samples
from tests.converters.torch_models import TinyNet

SPEC = "image:float32[batch,3,16,16]"


def _sets(tmp_path: Path) -> tuple[Path, Path]:
    calib = tmp_path / "calib"
    evaluation = tmp_path / "eval"
    calib.mkdir()
    evaluation.mkdir()
    for folder, seed in ((calib, 1), (evaluation, 2)):
        np.savez(folder / "s.npz", image=np.load(cnn_samples(tmp_path / "x.npy", 8, seed)))
    return calib, evaluation


def _fp32(source: str, tmp_path: Path, **extra: object) -> tuple[Path, int]:
    calib, evaluation = _sets(tmp_path)
    result = convert(ConversionRequest(
        source=source, name="tiny", repo=tmp_path / "repo", precisions=("fp32",),
        evaluation=evaluation, max_batch_size=4, profile_iterations=2, profile_warmup=1,
        **extra))  # type: ignore[arg-type]
    return result.path / str(result.version) / "model.onnx", result.version


def _batch_dynamic(model: Path, input_name: str = "image") -> None:
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((5, 3, 16, 16)).astype(np.float32)
    with torch.no_grad():
        want = TinyNet().eval()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(session.run(None, {input_name: x})[0], want, atol=1e-5)


def test_convert_exports_torch_export_program_when_source_is_pt2(tmp_path: Path) -> None:
    batch = torch.export.Dim("batch", min=1, max=64)
    program = torch.export.export(TinyNet().eval(), (torch.randn(2, 3, 16, 16),),
                                  dynamic_shapes={"x": {0: batch}})
    torch.export.save(program, tmp_path / "tiny.pt2")
    model, _ = _fp32(str(tmp_path / "tiny.pt2"), tmp_path, input_spec=parse_input_spec(SPEC))
    _batch_dynamic(model)


def test_convert_exports_torchscript_when_source_is_pt(tmp_path: Path) -> None:
    torch.jit.script(TinyNet().eval()).save(str(tmp_path / "tiny.pt"))
    model, _ = _fp32(str(tmp_path / "tiny.pt"), tmp_path, input_spec=parse_input_spec(SPEC))
    _batch_dynamic(model)


def test_convert_uses_factory_spec_when_entry_point_declares_one(tmp_path: Path) -> None:
    model, _ = _fp32("tests.converters.torch_models:tiny_with_spec", tmp_path)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == ["scores"]
    _batch_dynamic(model)


@pytest.mark.parametrize("location, problem", [
    ("tests.converters.torch_models:missing", "cannot be imported"),
    ("tests.converters.torch_models:not_a_model", "returned dict"),
    ("model.weird", "cannot tell what"),
])
def test_load_source_names_the_problem_when_source_is_unusable(location: str,
                                                               problem: str) -> None:
    with pytest.raises(InvalidSource, match=problem):
        load_source(location)


def test_load_source_refuses_pickled_state_dict_when_given_as_torchscript(
        tmp_path: Path) -> None:
    torch.save(TinyNet().state_dict(), tmp_path / "weights.pt")
    assert source_kind(str(tmp_path / "weights.pt")) == "torchscript"
    with pytest.raises(InvalidSource, match="not a TorchScript archive"):
        load_source(str(tmp_path / "weights.pt"))


def test_convert_cli_publishes_next_version_when_run_twice(tmp_path: Path) -> None:
    calib, evaluation = _sets(tmp_path)
    args = ["convert", "tests.converters.torch_models:tiny_module", "--name", "tiny",
            "--input-spec", SPEC, "--repo", str(tmp_path / "repo"), "--precisions", "fp32,int8",
            "--calib", str(calib), "--eval", str(evaluation), "--max-batch-size", "2",
            "--profile-iterations", "2", "--json"]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    result = json.loads(first.stdout)
    assert result["version"] == 1 and result["chosen"] in ("fp32", "int8")
    assert {s["label"] for s in result["steps"]} >= {"export", "verify", "publish"}
    second = CliRunner().invoke(app, args)
    assert second.exit_code == 0, second.output
    assert json.loads(second.stdout)["version"] == 2
    assert existing_versions(tmp_path / "repo", "tiny") == [1, 2]
    version_one = tmp_path / "repo" / "tiny" / "1"
    assert (version_one / "model.onnx").is_file()
    assert (version_one / "report" / "report.md").is_file()


def test_convert_cli_prints_summary_and_progress_when_not_json(tmp_path: Path) -> None:
    _, evaluation = _sets(tmp_path)
    result = CliRunner().invoke(app, [
        "convert", "tests.converters.torch_models:tiny_with_spec", "--name", "tiny",
        "--repo", str(tmp_path / "repo"), "--precisions", "fp32", "--eval", str(evaluation),
        "--max-batch-size", "2", "--profile-iterations", "2"])
    assert result.exit_code == 0, result.output
    assert "tiny: variants on cpu (served: fp32)" in result.stdout
    assert "published tiny version 1 (fp32)" in " ".join(result.stdout.split())
    assert "Export to ONNX (export): done" in result.stderr
    assert "TensorRT engines (tensorrt): skipped" in result.stderr
