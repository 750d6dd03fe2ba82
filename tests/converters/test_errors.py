"""Errors reach the owner whole: wrapped between words, never cut, first line saying what
to do; on the command line, in --json, and in the text the upload job records."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from typer.testing import CliRunner

from converters.compat import local_runtime_limits
from converters.errors import InvalidSource, wrap_message
from infergate.cli import app

SIGNATURE = ("onnxruntime::Model::Model(onnx::ModelProto&&,const_onnxruntime::PathString&,"
             "const_onnxruntime::IOnnxRuntimeOpSchemaRegistryList*,const_onnxruntime::Logger&)")


def test_wrap_message_never_cuts_a_word_when_a_token_is_longer_than_the_line() -> None:
    text = f"ONNX Runtime cannot load m.onnx. ONNX Runtime says: {SIGNATURE} failed here"
    wrapped = wrap_message(text, 40)
    assert wrapped.split() == text.split()  # every word intact, in order
    assert SIGNATURE in wrapped.splitlines()[1].strip() or any(
        line.strip() == SIGNATURE for line in wrapped.splitlines())
    assert all(len(line) <= 40 for line in wrapped.splitlines() if SIGNATURE not in line)


def test_wrap_message_keeps_lines_apart_when_text_has_several() -> None:
    assert wrap_message("Do this.\nstep: why", 80).splitlines() == ["Do this.", "step: why"]


def _swiglu(tmp_path: Path) -> tuple[Path, Path]:
    graph = helper.make_graph(
        [helper.make_node("SwiGLU", ["input"], ["output"])], "g",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 4])])
    model = tmp_path / "swiglu.onnx"
    onnx.save(helper.make_model(graph), str(model))
    evaluation = tmp_path / "eval.npy"
    np.save(evaluation, np.ones((4, 8), np.float32))
    return model, evaluation


def _cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner(env={"COLUMNS": "60"}).invoke(app, ["convert", *args])
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture()
def refused(tmp_path: Path) -> tuple[list[str], str]:
    """The CLI arguments of a model ONNX Runtime cannot run, and the whole reason."""
    from converters.compat import make_compatible

    model, evaluation = _swiglu(tmp_path)
    with pytest.raises(InvalidSource) as error:
        make_compatible(onnx.load(str(model)), local_runtime_limits(), model.name)
    args = [str(model), "--name", "m", "--repo", str(tmp_path / "repo"), "--precisions",
            "fp32", "--eval", str(evaluation)]
    return args, str(error.value)


def test_cli_prints_the_whole_reason_wrapped_when_conversion_is_refused(
        refused: tuple[list[str], str]) -> None:
    args, reason = refused
    assert len(reason) > 200  # long enough that a cut or a mid-word fold would show
    code, _, stderr = _cli(*args)
    assert code == 2
    lines = stderr.splitlines()
    error_at = next(i for i, line in enumerate(lines) if line.startswith("error: "))
    assert lines[error_at].startswith("error: Re-export swiglu.onnx with opset <= ")
    shown = " ".join(lines[error_at:]).split()
    words = reason.split()
    # every word of the reason appears whole and in order: nothing cut, nothing folded
    assert any(shown[i:i + len(words)] == words for i in range(len(shown)))
    block = lines[error_at:next(i for i, line in enumerate(lines) if line.startswith("repo"))]
    assert all(len(line) <= 60 for line in block if " " in line.strip())


def test_cli_json_carries_the_whole_reason_and_action_when_refused(
        refused: tuple[list[str], str]) -> None:
    args, reason = refused
    code, stdout, _ = _cli(*args, "--json")
    assert code == 2
    error = json.loads(stdout)
    assert error["reason"] == reason
    assert error["error"].splitlines()[0] == error["action"].rstrip(".") + "."
    assert error["error"].endswith(reason)
    assert error["step"] == "check" and error["kind"] == "UnsupportedOpset"
