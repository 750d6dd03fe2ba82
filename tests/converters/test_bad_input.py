"""Bad input through the real command line: a clear error naming the problem, exit
status 2, and the repository exactly as it was (tree listing before == after)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from onnx import TensorProto, helper
from typer.testing import CliRunner

from converters.tiny import build_tiny_model
from infergate.cli import app
from tests.converters.conftest import save_graph, tree

Files = tuple[Path, Path, Path]


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    """A repository that already serves a model: it must survive every refusal."""
    repo = tmp_path / "model_repo"
    build_tiny_model(repo)
    return repo


def _convert(repo: Path, source: Path | str, *extra: str, calib: Path | None = None,
             evaluation: Path | None = None, name: str = "m",
             precisions: str = "fp32,int8") -> tuple[int, str]:
    args = ["convert", str(source), "--name", name, "--repo", str(repo), "--precisions",
            precisions]
    if calib is not None:
        args += ["--calib", str(calib)]
    if evaluation is not None:
        args += ["--eval", str(evaluation)]
    result = CliRunner().invoke(app, [*args, *extra])
    return result.exit_code, result.output


def _refused(repo: Path, run: Callable[[], tuple[int, str]], problem: str) -> str:
    before = tree(repo.parent)
    code, output = run()
    assert code == 2, output
    assert problem in " ".join(output.split()), output
    assert tree(repo.parent) == before
    return output


def test_convert_refuses_corrupt_onnx_when_file_is_not_a_model(
        repo: Path, tmp_path: Path, cnn_files: Callable[[], Files]) -> None:
    _, calib, evaluation = cnn_files()
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage that is not protobuf")
    _refused(repo, lambda: _convert(repo, bad, calib=calib, evaluation=evaluation),
             "bad.onnx is not a valid ONNX model")


@pytest.mark.parametrize("op, domain, named", [
    ("FancyConv", "com.example", "FancyConv (domain com.example)"),
    ("FancyConv", "", "FancyConv (ai.onnx opset 17)"),
])
def test_convert_names_unsupported_operator_when_graph_uses_one(
        repo: Path, tmp_path: Path, cnn_files: Callable[[], Files], op: str, domain: str,
        named: str) -> None:
    _, calib, evaluation = cnn_files()
    model = save_graph(
        tmp_path / "custom.onnx",
        [helper.make_node(op, ["input"], ["logits"], domain=domain)],
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 16, 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        domains=((domain, 1),) if domain else (),
    )
    _refused(repo, lambda: _convert(repo, model, calib=calib, evaluation=evaluation),
             f"operators that ONNX / ONNX Runtime cannot run: {named}")


def test_convert_refuses_input_spec_when_it_does_not_match_the_model(
        repo: Path, cnn_files: Callable[[], Files]) -> None:
    model, calib, evaluation = cnn_files()
    _refused(repo, lambda: _convert(repo, model, "--input-spec", "input:float32[batch,1,16,16]",
                                    calib=calib, evaluation=evaluation),
             "input 'input' axis 1: spec says 1, the model has 3")


def test_convert_refuses_empty_calibration_set_when_folder_holds_nothing(
        repo: Path, tmp_path: Path, cnn_files: Callable[[], Files]) -> None:
    model, _, evaluation = cnn_files()
    empty = tmp_path / "calib"
    empty.mkdir()
    _refused(repo, lambda: _convert(repo, model, calib=empty, evaluation=evaluation),
             f"calibration set {empty} holds no samples")


@pytest.mark.parametrize("name", ["../escape", "a/b", "/abs"])
def test_convert_refuses_name_when_it_contains_path_separators(
        repo: Path, cnn_files: Callable[[], Files], name: str) -> None:
    model, calib, evaluation = cnn_files()
    _refused(repo, lambda: _convert(repo, model, calib=calib, evaluation=evaluation, name=name),
             f"invalid model name {name!r}")


def test_convert_refuses_when_evaluation_set_is_the_calibration_set(
        repo: Path, cnn_files: Callable[[], Files]) -> None:
    model, calib, _ = cnn_files()
    _refused(repo, lambda: _convert(repo, model, calib=calib, evaluation=calib),
             "is the calibration set")


@pytest.mark.parametrize("given, missing", [
    ("eval", "--calib is missing"), ("calib", "--eval is missing"),
    ("", "--calib and --eval are missing"),
])
def test_convert_refuses_int8_in_one_line_when_calibration_or_evaluation_set_missing(
        repo: Path, cnn_files: Callable[[], Files], given: str, missing: str) -> None:
    """FP32/FP16 convert without data (synthetic inputs); INT8 does not, and one line
    names both options before any work starts."""
    import json

    model, calib, evaluation = cnn_files()
    def run(*extra: str) -> tuple[int, str]:
        return _convert(repo, model, *extra, calib=calib if given == "calib" else None,
                        evaluation=evaluation if given == "eval" else None,
                        precisions="fp32,int8")

    line = (f"INT8 needs a calibration set (--calib) and an evaluation set (--eval); {missing} "
            "(fp32 and fp16 convert without them, verified on synthetic inputs)")
    _refused(repo, run, line)
    code, output = run("--json")
    error = json.loads(output)
    assert code == 2 and error["reason"] == line
    assert error["step"] == "validate"  # before the model is even opened


def test_convert_reports_error_as_json_when_json_requested(
        repo: Path, tmp_path: Path, cnn_files: Callable[[], Files]) -> None:
    import json

    _, calib, evaluation = cnn_files()
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"junk")
    result = CliRunner().invoke(app, ["convert", str(bad), "--name", "m", "--repo", str(repo),
                                      "--calib", str(calib), "--eval", str(evaluation), "--json"])
    assert result.exit_code == 2
    error = json.loads(result.stdout)  # progress lines go to stderr
    assert error["step"] == "source" and error["kind"] == "InvalidSource"


def test_convert_refuses_when_no_requested_variant_meets_the_budget(
        repo: Path, cnn_files: Callable[[], Files]) -> None:
    model, calib, evaluation = cnn_files()
    output = _refused(repo, lambda: _convert(
        repo, model, "--min-cosine", "0.999999", "--no-repair", "--max-batch-size", "2",
        "--profile-iterations", "2", calib=calib, evaluation=evaluation, precisions="int8"),
        "Choose the variant to serve: no requested variant can be served")
    assert "int8: outside the accuracy budget: cosine" in " ".join(output.split())
