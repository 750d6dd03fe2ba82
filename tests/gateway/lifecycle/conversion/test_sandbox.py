"""The conversion worker as a sandbox (issue 11): uploads whose pickles import code are
refused before any worker runs; a worker gets only the environment it needs; and a
hostile pickle that does run (a deployment that allows pickled code) finds no token,
cannot write outside its folders, connect, signal the gateway or lift its limits.

Real torch builds the files; the containment tests run a real "gateway" process (with
the token in its environment) that starts a real worker, whose converter opens the
upload with ``torch.export.load``.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import secrets
import socket
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from gateway.config.lifecycle import SandboxSpec
from gateway.lifecycle.conversion.pickles import PickledCode, refuse_pickled_code
from gateway.lifecycle.conversion.sandbox import child_environment, landlock_abi, plan_for
from gateway.lifecycle.conversion.worker_protocol import WorkerTask
from gateway.lifecycle.intake.spec import parse_spec
from infergate.processes import ROOT


class Affine(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 2)
        self.register_buffer("offset", torch.zeros(2, dtype=torch.float16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + self.offset.float()


class Payload:
    """Unpickling this runs ``code``: what a hostile upload carries."""

    def __init__(self, code: str) -> None:
        self.code = code

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (self.code, {}))  # its own globals: functions in it see each other


def _saved(obj: Any, **kwargs: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer, **kwargs)
    return buffer.getvalue()


def _replace_member(source: Path, target: Path, suffix: str, data: bytes) -> Path:
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(target, "w") as out:
        for info in src.infolist():
            out.writestr(info, data if info.filename.endswith(suffix) else src.read(info))
    return target


@pytest.fixture(scope="module")
def torch_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("torch-files")
    model = Affine().eval()
    example = (torch.zeros(1, 4),)
    files = {name: folder / name for name in ("script.pt", "trace.pt", "state_dict.pt",
                                              "export.pt2", "module.pt")}
    torch.jit.script(model).save(str(files["script.pt"]))
    torch.jit.trace(model, example).save(str(files["trace.pt"]))
    torch.save(model.state_dict(), files["state_dict.pt"])
    torch.export.save(torch.export.export(model, example), files["export.pt2"])
    torch.save(model, files["module.pt"])
    return files


def _hostile_pt2(torch_files: dict[str, Path], target: Path, code: str) -> Path:
    """A genuine torch.export archive whose sample inputs unpickle into ``code``:
    torch.export.load falls back to weights_only=False for them."""
    return _replace_member(torch_files["export.pt2"], target, "sample_inputs/model.pt",
                           _saved(Payload(code)))


# -- the scan ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["script.pt", "trace.pt", "state_dict.pt", "export.pt2"])
def test_pickle_scan_accepts_tensors_only_when_archive_is_plain_torch(
    torch_files: dict[str, Path], name: str
) -> None:
    refuse_pickled_code(torch_files[name], name)


def test_pickle_scan_refuses_naming_classes_when_whole_module_pickled(
    torch_files: dict[str, Path]
) -> None:
    with pytest.raises(PickledCode, match=r"module\.pt would run pickled code.*imports "
                                          r"tests\.gateway\.lifecycle\.conversion\.test_sandbox\.Affine"):
        refuse_pickled_code(torch_files["module.pt"], "module.pt")


def test_pickle_scan_refuses_when_export_archive_hides_payload_in_sample_inputs(
    torch_files: dict[str, Path], tmp_path: Path
) -> None:
    hostile = _hostile_pt2(torch_files, tmp_path / "hostile.pt2", "print('hi')")
    with pytest.raises(PickledCode, match=r"sample_inputs/model\.pt/.*imports "
                                          r"(builtins|__builtin__)\.exec"):
        refuse_pickled_code(hostile, "hostile.pt2")


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_pickle_scan_refuses_exec_whatever_the_pickle_protocol(
    torch_files: dict[str, Path], tmp_path: Path, protocol: int
) -> None:
    data = pickle.dumps({"w": [1.0], "x": Payload("print('hi')")}, protocol=protocol)
    hostile = _replace_member(torch_files["state_dict.pt"], tmp_path / "hostile.pt",
                              "data.pkl", data)
    with pytest.raises(PickledCode, match=r"exec"):
        refuse_pickled_code(hostile, "hostile.pt")


def test_pickle_scan_refuses_when_stack_global_name_is_not_a_literal(tmp_path: Path) -> None:
    # protocol 4: push "builtins", memoize, then build the name from a list item (not a
    # string pushed just before STACK_GLOBAL), so no static reader can name the import
    body = (b"\x80\x04\x8c\x08builtins\x94]\x94\x8c\x04exec\x94a" b"h\x00" b"h\x01"
            b"\x93.")
    hostile = _zip_of(tmp_path / "hostile.pt", {"archive/data.pkl": body})
    with pytest.raises(PickledCode, match="computes at load time"):
        refuse_pickled_code(hostile, "hostile.pt")


def test_pickle_scan_refuses_payload_declared_raw_when_another_entry_unpickles_it(
    torch_files: dict[str, Path], tmp_path: Path
) -> None:
    with zipfile.ZipFile(torch_files["export.pt2"]) as src:
        config_name = next(n for n in src.namelist() if n.endswith("model_weights_config.json"))
        config = json.loads(src.read(config_name))
    entries = list(config["config"].values())
    entries[1]["path_name"] = entries[0]["path_name"]
    entries[1]["use_pickle"] = True  # the loader unpickles the file entry 0 calls raw
    raw_member = f"{config_name.rsplit('/', 1)[0]}/{entries[0]['path_name']}"
    staged = _replace_member(torch_files["export.pt2"], tmp_path / "a.pt2",
                             "model_weights_config.json", json.dumps(config).encode())
    hostile = _replace_member(staged, tmp_path / "hostile.pt2", raw_member,
                              pickle.dumps(Payload("print('hi')"), protocol=2))
    with pytest.raises(PickledCode, match="exec"):
        refuse_pickled_code(hostile, "hostile.pt2")


def test_pickle_scan_refuses_when_file_is_not_a_zip_archive(tmp_path: Path) -> None:
    legacy = tmp_path / "legacy.pt"
    legacy.write_bytes(pickle.dumps(119547037146038801333356) + pickle.dumps(Payload("1")))
    with pytest.raises(PickledCode, match="not a zip archive"):
        refuse_pickled_code(legacy, "legacy.pt")


def _zip_of(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as out:
        for name, data in members.items():
            out.writestr(name, data)
    return path


# -- the environment -----------------------------------------------------------------------
def test_child_environment_holds_no_secret_when_gateway_has_them(tmp_path: Path) -> None:
    parent = {"PATH": "/usr/bin", "LANG": "en_US.UTF-8", "OMP_NUM_THREADS": "2",
              "INFERGATE_TOKENS": "tokens: [...]", "AWS_SECRET_ACCESS_KEY": "s3cr3t",
              "HOME": "/root", "TMPDIR": "/tmp", "PYTHONPATH": "/elsewhere"}
    env = child_environment(parent, tmp_path, SandboxSpec(), allow_pickled_code=False)
    assert set(env) == {"PATH", "LANG", "OMP_NUM_THREADS", "HOME", "TMPDIR",
                        "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONNOUSERSITE",
                        "PYTHONPATH", "INFERGATE_PARENT_PID", "TORCH_FORCE_WEIGHTS_ONLY_LOAD"}
    assert env["HOME"] == env["TMPDIR"] == str(tmp_path)
    assert env["PYTHONPATH"] == str(ROOT)
    allowed = child_environment(parent, tmp_path, SandboxSpec(pass_env=("AWS_REGION",)),
                                allow_pickled_code=True)
    assert "TORCH_FORCE_WEIGHTS_ONLY_LOAD" not in allowed


def test_sandbox_plan_lifts_address_space_limit_when_conversion_uses_gpu(
    tmp_path: Path
) -> None:
    spec = SandboxSpec(address_space_bytes=8 << 30)
    cpu = plan_for(spec, tmp_path, [tmp_path / "staging"])
    gpu = plan_for(spec, tmp_path, [tmp_path / "staging"], gpu=True)
    assert cpu.limits["address_space_bytes"] == 8 << 30
    assert gpu.limits["address_space_bytes"] is None  # CUDA reserves far more than it uses
    assert cpu.limits["cpu_seconds"] == gpu.limits["cpu_seconds"] == spec.cpu_seconds


def test_sandbox_plan_reads_only_python_files_when_checkout_holds_secrets(
    tmp_path: Path
) -> None:
    plan = plan_for(SandboxSpec(), tmp_path / "job", [tmp_path / "staging"])
    readable = set(plan.readable)
    assert str(ROOT / "gateway" / "lifecycle" / "conversion" / "worker_main.py") in readable
    assert not {str(ROOT), str(ROOT / "gateway"), str(ROOT / "gateway" / "examples")} & readable
    assert not any(p.endswith((".yaml", ".md", ".txt")) for p in readable)
    assert plan.listable == (str(ROOT),)
    assert set(plan.writable) == {str(tmp_path / "job"), str(tmp_path / "staging")}


def test_sandbox_spec_refuses_when_asked_to_pass_gateway_variables() -> None:
    with pytest.raises(ValueError, match="never reach a worker"):
        SandboxSpec(pass_env=("INFERGATE_TOKENS",))


# -- a hostile pickle that runs -------------------------------------------------------------
PROBE = """
import json, os, resource, socket
from pathlib import Path
plan = json.loads({plan!r})
seen = {{}}
def attempt(name, action):
    try:
        seen[name] = "ok: " + str(action())[:400]
    except (OSError, ValueError) as exc:
        seen[name] = f"denied: {{type(exc).__name__}} {{getattr(exc, 'errno', '')}}"
attempt("env", lambda: os.environ.get("INFERGATE_TOKENS", "absent"))
attempt("env_names", lambda: " ".join(sorted(os.environ)))
attempt("self_environ", lambda: Path("/proc/self/environ").read_bytes().decode("latin-1"))
attempt("parent_environ",
        lambda: Path(f"/proc/{{os.getppid()}}/environ").read_bytes().decode("latin-1"))
attempt("tokens_file", lambda: Path(plan["tokens"]).read_text())
attempt("parent_cmdline", lambda: Path(f"/proc/{{os.getppid()}}/cmdline").read_bytes())
attempt("list_processes", lambda: len(os.listdir("/proc")))
attempt("shared_memory", lambda: os.listdir("/dev/shm"))
attempt("checkout_tokens", lambda: Path(plan["checkout_tokens"]).read_text())
attempt("write_outside", lambda: Path(plan["outside"]).write_text("escaped"))
attempt("write_other_model", lambda: Path(plan["other_model"]).write_text("poisoned"))
attempt("write_repository", lambda: Path(plan["repository_file"]).write_text("planted"))
attempt("write_home", lambda: (Path.home() / "probe.txt").write_text("inside"))
attempt("big_file", lambda: (Path.home() / "big.bin").write_bytes(b"0" * plan["big"]))
attempt("connect", lambda: socket.create_connection(("127.0.0.1", plan["port"]), 5).close())
attempt("signal_parent", lambda: os.kill(os.getppid(), 0))
attempt("raise_limit",
        lambda: resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY,) * 2))
seen["limits"] = {{n: resource.getrlimit(getattr(resource, n))[0]
                  for n in ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_NOFILE")}}
(Path.home() / "probe.json").write_text(json.dumps(seen))  # HOME: the job's scratch
raise RuntimeError("hostile payload ran")
"""

DRIVER = """
import asyncio, json, sys
from pathlib import Path
from gateway.config.lifecycle import SandboxSpec
from gateway.lifecycle.conversion.worker_protocol import ConversionFailed, WorkerTask
from gateway.lifecycle.conversion.workers import ConversionWorkers
task = WorkerTask.read(Path(sys.argv[1]))
workers = ConversionWorkers(sandbox=SandboxSpec.model_validate_json(sys.argv[2]),
                            allow_pickled_code=sys.argv[3] == "1")
try:
    asyncio.run(workers.run(task, lambda event: None))
    print(json.dumps({"error": None}))
except ConversionFailed as exc:
    print(json.dumps({"error": str(exc)}))
"""

SANDBOX = SandboxSpec(address_space_bytes=24 << 30, cpu_seconds=600, file_size_bytes=1 << 20,
                      open_files=512)


@pytest.fixture
def listener() -> Iterator[int]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


def _run_hostile(torch_files: dict[str, Path], tmp_path: Path, port: int, token: str,
                 spec: SandboxSpec, allow_pickled_code: bool) -> tuple[str, Path]:
    """A gateway stand-in (the token in its environment and in a tokens file) converts a
    hostile .pt2 in a real worker; returns the job's error and the job folder."""
    (tmp_path / "tokens.yaml").write_text(f"tokens: [{{name: a, token: {token}}}]\n")
    outside = tmp_path / "outside.txt"
    job = tmp_path / "state" / "jobs" / "job-hostile"
    job.mkdir(parents=True)
    (tmp_path / "repo" / "served").mkdir(parents=True)  # another model's folder
    plan = json.dumps({"tokens": str(tmp_path / "tokens.yaml"), "outside": str(outside),
                       "checkout_tokens": str(ROOT / "gateway" / "examples" / "tokens.yaml"),
                       "other_model": str(tmp_path / "repo" / "served" / "config.pbtxt"),
                       "repository_file": str(tmp_path / "repo" / "planted.txt"),
                       "big": 2 << 20, "port": port})
    model = _hostile_pt2(torch_files, job / "model.pt2", PROBE.format(plan=plan))
    spec_text = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": ["batch", 4]}]})
    np.savez(job / "evaluation.npz", x=np.ones((4, 4), np.float32))
    task = WorkerTask(job_id="job-hostile", model="hostile", repository=str(tmp_path / "repo"),
                      model_file=str(model), model_format="pt2",
                      spec=parse_spec(spec_text).model_dump(mode="json"), work_dir=str(job),
                      evaluation=str(job / "evaluation.npz"))
    task.write(tmp_path / "task-in.json")
    env = {**os.environ, "INFERGATE_TOKENS": f"tokens: [{{name: a, token: {token}}}]",
           "AWS_SECRET_ACCESS_KEY": token}
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(tmp_path / "task-in.json"), spec.model_dump_json(),
         "1" if allow_pickled_code else "0"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=True)
    error = json.loads(done.stdout.strip().splitlines()[-1])["error"]
    assert error is not None, "the hostile conversion succeeded"
    return error, job


def _probe(job: Path) -> dict[str, Any]:
    report = job / "tmp" / "probe.json"
    assert report.is_file(), "the hostile payload did not run"
    return json.loads(report.read_text())  # type: ignore[no-any-return]


def _readable_files(folder: Path) -> str:
    return "".join(p.read_bytes().decode("latin-1") for p in folder.rglob("*") if p.is_file())


@pytest.mark.integration
def test_hostile_pickle_contained_when_deployment_allows_pickled_code(
    torch_files: dict[str, Path], tmp_path: Path, listener: int
) -> None:
    assert landlock_abi() >= 6, "this kernel cannot confine the worker (Landlock ABI < 6)"
    token = secrets.token_hex(16)
    error, job = _run_hostile(torch_files, tmp_path, listener, token, SANDBOX,
                              allow_pickled_code=True)
    seen = _probe(job)  # the payload ran: torch.export.load unpickled it
    assert "is not a torch.export program" in error
    assert token not in error and token not in json.dumps(seen)
    assert seen["env"] == "ok: absent"
    assert "INFERGATE_TOKENS" not in seen["env_names"]
    assert "AWS_SECRET_ACCESS_KEY" not in seen["env_names"]
    for probe in ("parent_environ", "parent_cmdline", "list_processes", "shared_memory",
                  "tokens_file", "checkout_tokens", "write_outside",
                  "write_other_model", "write_repository", "connect", "signal_parent",
                  "raise_limit"):
        assert seen[probe].startswith("denied"), (probe, seen[probe])
    assert seen["big_file"] == "denied: OSError 27"  # EFBIG: past file_size_bytes
    assert seen["write_home"].startswith("ok")  # its own scratch folder
    assert not (tmp_path / "outside.txt").exists()
    assert sorted(p.name for p in (tmp_path / "repo").rglob("*")) == ["served"]
    assert seen["limits"] == {"RLIMIT_AS": 24 << 30, "RLIMIT_CPU": 600,
                              "RLIMIT_FSIZE": 1 << 20, "RLIMIT_NOFILE": 512}
    assert token not in _readable_files(job)
    assert not (tmp_path / "repo" / "hostile").exists()  # made for the worker, removed


@pytest.mark.integration
def test_hostile_pickle_reaches_outside_when_file_sandbox_off(
    torch_files: dict[str, Path], tmp_path: Path, listener: int
) -> None:
    """The control: the probes see an escape where there is one (so the test above can
    fail), and the environment allow-list alone does not keep the token out of reach.
    (``/proc/<gateway>/environ`` stays closed here all the same: the worker dropped its
    capabilities, and a process without them cannot read a root process's memory.)"""
    token = secrets.token_hex(16)
    _, job = _run_hostile(torch_files, tmp_path, listener, token,
                          SANDBOX.model_copy(update={"filesystem": "off"}),
                          allow_pickled_code=True)
    seen = _probe(job)
    assert seen["env"] == "ok: absent"
    assert token in seen["tokens_file"] and seen["checkout_tokens"].startswith("ok")
    assert seen["write_outside"].startswith("ok") and (tmp_path / "outside.txt").exists()


@pytest.mark.integration
def test_hostile_pickle_never_runs_when_worker_forces_weights_only(
    torch_files: dict[str, Path], tmp_path: Path, listener: int
) -> None:
    """Behind the upload's scan, the worker's torch.load is weights-only too."""
    error, job = _run_hostile(torch_files, tmp_path, listener, secrets.token_hex(16),
                              SANDBOX, allow_pickled_code=False)
    assert "is not a torch.export program" in error
    assert not (job / "tmp" / "probe.json").exists(), "the payload ran"
    assert "Weights only load failed" in error and "GLOBAL exec" in error, error
