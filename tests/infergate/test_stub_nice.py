"""``infergate/triton/stub_nice.sh``, a local tritonserver's ``BASH_ENV``: the shell
that becomes a Python-backend stub starts ``INFERGATE_STUB_NICE`` below the server when
the stub's ``model.py`` names it (ours: it brings its threads back once built), and at
the server's priority for any other. Real bash, as Triton's launcher runs it; the stub a
stand-in that prints its own nice value."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from converters.model_dir import PYTHON_BACKEND_MODEL
from infergate.triton.local import STUB_NICE_SCRIPT


@pytest.fixture()
def stub(tmp_path: Path) -> Path:
    """A stand-in for ``triton_python_backend_stub`` that prints its nice value."""
    path = tmp_path / "backends" / "python" / "triton_python_backend_stub"
    path.parent.mkdir(parents=True)
    path.write_text('#!/bin/sh\nread -r s < /proc/$$/stat\nset -- ${s##*) }\necho "${17}"\n')
    path.chmod(0o755)
    return path


def _model(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "repo" / "m" / "1" / "model.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _started_at(stub: Path, model: Path, stub_nice: int | None, above: int = 0,
                activate: bool = False) -> int:
    """The nice value the stub starts with, launched as Triton's Python backend does
    (``bash -c " exec <stub> <model.py> <shm> ..."``, or through an execution
    environment's activate script) by a server ``above`` this process's nice value."""
    args = f"{stub} {model} triton_python_backend_shm_region_1 1048576 1048576 " \
           f"{os.getpid()} {stub.parent} 140 m_0_0"
    command = (f"source /dev/null && exec env LD_LIBRARY_PATH=/nowhere {args}" if activate
               else f" exec {args}")
    env = {**os.environ, "BASH_ENV": str(STUB_NICE_SCRIPT)}
    env.pop("INFERGATE_STUB_NICE", None)
    if stub_nice is not None:
        env["INFERGATE_STUB_NICE"] = str(stub_nice)
    done = subprocess.run(["nice", "-n", str(above), "bash", "-c", command], env=env,
                          capture_output=True, text=True, check=True, timeout=30)
    return int(done.stdout)


def test_a_stub_whose_model_brings_itself_back_starts_below_the_server(
        stub: Path, tmp_path: Path) -> None:
    ours = _model(tmp_path, PYTHON_BACKEND_MODEL.read_text())
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    assert _started_at(stub, ours, 10) == min(mine + 10, 19)
    assert _started_at(stub, ours, 3, activate=True) == min(mine + 3, 19)
    # relative to the server's own, never past 19
    assert _started_at(stub, ours, 10, above=15) == 19


def test_any_other_stub_starts_at_the_servers_priority(stub: Path, tmp_path: Path) -> None:
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    other = _model(tmp_path, "class TritonPythonModel:\n    pass\n")
    assert _started_at(stub, other, 10) == mine  # it would not come back
    ours = _model(tmp_path, PYTHON_BACKEND_MODEL.read_text())
    assert _started_at(stub, ours, None) == mine  # not asked
    assert _started_at(stub, tmp_path / "missing" / "model.py", 10) == mine
