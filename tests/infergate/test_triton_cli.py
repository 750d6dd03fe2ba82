"""``infergate triton``: members started by hand, as docs/residency.md ("Starting members
for residency") does, serve a pool with residency configured like
gateway/examples/residency.yaml; a signal stops each without leaving a process."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml

from converters.samples import SAMPLE_MODEL_NAME, cat_input
from infergate.processes import stop_process
from infergate.triton.local import free_port
from tests.conftest import RUNTIME_ENV
from tests.procs import ROOT, run_gateway, triton_processes, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EXAMPLE = ROOT / "gateway" / "examples" / "residency.yaml"
UPLOAD_TOKEN = "upload-token-change-me-0002"  # the example's, gateway/examples/tokens.yaml
LOAD_WAIT = "infergate-load-wait-ms"
IMAGENET_CATS = range(281, 286)


@dataclass
class Member:
    """One ``infergate triton`` process and the ports it was given."""

    proc: subprocess.Popen[bytes]
    log: Path
    http_port: int
    grpc_port: int
    metrics_port: int

    @property
    def key(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def yaml_line(self) -> str:
        return (f"- {{host: 127.0.0.1, http_port: {self.http_port}, grpc_port: "
                f"{self.grpc_port}, metrics_port: {self.metrics_port}}}")

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"infergate triton exited: {self.log.read_text()[-2000:]}")
        return "Triton member ready" in self.log.read_text()


def start_member(repo: Path, log_dir: Path, *extra: str) -> Member:
    ports = [free_port() for _ in range(3)]
    log_dir.mkdir(parents=True)
    log = log_dir / "infergate-triton.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "infergate.cli", "triton", "--repo", str(repo),
             "--runtime-env", str(RUNTIME_ENV), "--http-port", str(ports[0]),
             "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2]),
             "--log-dir", str(log_dir), *extra],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
        )
    return Member(proc, log, *ports)


@pytest.fixture()
def own_repo(sample_repo: Path, tmp_path: Path) -> Path:
    """A private copy of the sample repository (its path marks this test's processes)."""
    repo = tmp_path / "model_repo"
    shutil.copytree(sample_repo, repo)
    return repo


@pytest.fixture()
def members(own_repo: Path, tmp_path: Path) -> Iterator[list[Member]]:
    started = [start_member(own_repo, tmp_path / f"member-{i}") for i in range(2)]
    try:
        assert wait_until(lambda: all(m.ready() for m in started), 120)
        yield started
    finally:
        for member in started:
            stop_process(member.proc, 60)


def example_config(path: Path, members: list[Member]) -> Path:
    """gateway/examples/residency.yaml, its members on these ports."""
    data: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    assert len(data["pools"][0]["members"]) == len(members)
    data["pools"][0]["members"] = [
        {"host": "127.0.0.1", "http_port": m.http_port, "grpc_port": m.grpc_port,
         "metrics_port": m.metrics_port} for m in members]
    data["auth"]["tokens_file"] = str(EXAMPLE.parent / data["auth"]["tokens_file"])
    path.write_text(yaml.safe_dump(data))
    return path


def classify_cat(url: str) -> httpx.Response:
    x = cat_input()
    body = {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                        "data": x.ravel().tolist()}]}
    resp = httpx.post(f"{url}/v2/models/{SAMPLE_MODEL_NAME}/infer", json=body, timeout=90)
    assert resp.status_code == 200, resp.text
    logits = np.asarray(resp.json()["outputs"][0]["data"])
    assert int(logits.argmax()) in IMAGENET_CATS
    return resp


def test_triton_members_serve_a_miss_then_a_hit_and_leave_nothing_when_sigterm(
    own_repo: Path, members: list[Member], tmp_path: Path
) -> None:
    for member in members:  # the line to paste into the gateway's YAML is printed
        assert member.yaml_line() in member.log.read_text()
    with run_gateway(example_config(tmp_path / "residency.yaml", members), tmp_path) as gw:
        url = f"http://{gw.http_url}"
        miss = classify_cat(url)
        assert int(miss.headers[LOAD_WAIT]) > 0  # it waited for the load
        hit = classify_cat(url)
        assert LOAD_WAIT not in hit.headers

        assert httpx.get(f"{url}/v1/residency").status_code == 401  # upload scope
        report = httpx.get(f"{url}/v1/residency",
                           headers={"Authorization": f"Bearer {UPLOAD_TOKEN}"}).json()
        holders = report["models"][SAMPLE_MODEL_NAME]["members"]
        assert len(holders) == 1 and holders[0] in {m.key for m in members}

    assert triton_processes(str(own_repo))  # the members and the stub still run
    for member in members:
        assert stop_process(member.proc, 60, signal.SIGTERM) == 0
        assert "Triton stopped" in member.log.read_text()
    assert triton_processes(str(own_repo)) == []


SLOW_CONFIG = """name: "slow_start"
backend: "python"
max_batch_size: 0
input [{ name: "x", data_type: TYPE_FP32, dims: [1] }]
output [{ name: "y", data_type: TYPE_FP32, dims: [1] }]
instance_group [{ kind: KIND_CPU, count: 1 }]
"""
SLOW_MODEL = """import time


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(600)  # never ready within the test: it is stopped while it loads
"""


def test_triton_sigterm_during_start_up_leaves_nothing(own_repo: Path, tmp_path: Path
                                                       ) -> None:
    (own_repo / "slow_start" / "1").mkdir(parents=True)
    (own_repo / "slow_start" / "config.pbtxt").write_text(SLOW_CONFIG)
    (own_repo / "slow_start" / "1" / "model.py").write_text(SLOW_MODEL)
    member = start_member(own_repo, tmp_path / "member", "--load", "slow_start")
    try:
        # its stub runs: Triton is loading the model, the member is not ready yet
        assert wait_until(lambda: bool(triton_processes(str(own_repo / "slow_start"))), 60)
        assert not member.ready()
        assert stop_process(member.proc, 60, signal.SIGTERM) == 0
    finally:
        stop_process(member.proc, 60)
    log = member.log.read_text()
    assert "SIGTERM: stopping Triton" in log and "Triton member ready" not in log
    assert triton_processes(str(own_repo)) == []
