"""Version numbers are never reused, through the lifecycle: an upload whose version
Triton refuses (published, then taken back out) is followed by a good one that gets the
next number, and the model's record lists the failed version with its state and why; a
rollout cut short by a restart leaves its candidate recorded rolled back."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any
from unittest.mock import create_autospec

import httpx
import pytest
from typer.testing import CliRunner

from converters.tiny import TINY_MODEL_NAME, build_tiny_model
from gateway.config import GatewayConfig
from gateway.config.lifecycle import LifecycleSpec
from gateway.config.pools import MemberSpec, PoolSpec
from gateway.core import Core
from gateway.lifecycle.assembly import build_lifecycle
from gateway.lifecycle.records.jobs import (
    LifecycleStore,
    ModelRecord,
    RolloutRecord,
    VersionRecord,
    with_step,
)
from gateway.lifecycle.service import RESTART_REASON
from gateway.lifecycle.warmup.rollout import INTERRUPTED as ROLLOUT_INTERRUPTED
from gateway.models_cli import app as models_app
from gateway.upstream.triton import MemberAdmin
from infergate.triton.local import locate_tritonserver
from tests.conftest import RUNTIME_ENV, triton_settings
from tests.gateway.lifecycle.conftest import (
    TINY_SPEC,
    TOKENS,
    affine_onnx,
    finished,
    lifecycle_config,
    show,
    upload,
)
from tests.procs import run_gateway, started_triton

TINY = TINY_MODEL_NAME


@pytest.mark.integration
def test_good_upload_gets_the_next_number_when_the_previous_upload_failed_after_publishing(
    tmp_path: Path
) -> None:
    # target "onnxruntime": converted and published, then refused by this Triton (the
    # pytriton build has the Python backend only), so the job fails after publishing
    if (locate_tritonserver(RUNTIME_ENV)[1] / "onnxruntime").is_dir():
        pytest.skip("this Triton has an onnxruntime backend: it would load the version")
    repo = tmp_path / "model_repo"
    build_tiny_model(repo)  # version 1 (2x+1), adopted as serving
    with started_triton(triton_settings(repo, tmp_path, TINY)) as triton:
        assert triton.endpoints is not None
        config = lifecycle_config(tmp_path / "gateway.yaml", {"local": [triton.endpoints]},
                                  repo)
        with run_gateway(config, tmp_path) as gw:
            url = f"http://{gw.http_url}"
            refused = finished(url, upload(url, TINY, affine_onnx(tmp_path / "k3.onnx", 3.0),
                                           {**TINY_SPEC, "target": "onnxruntime"}, None)["id"])
            assert refused["state"] == "failed", refused
            assert refused["version"] == 2 and "did not go live" in refused["error"]
            assert not (repo / TINY / "2").exists()  # taken back out

            good = finished(url, upload(url, TINY, affine_onnx(tmp_path / "k5.onnx", 5.0),
                                        TINY_SPEC, None)["id"])
            assert good["state"] == "succeeded", good["error"]
            assert good["version"] == 3  # not 2 again
            answer = httpx.post(f"{url}/v2/models/{TINY}/infer", json={"inputs": [
                {"name": "x", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}]},
                timeout=30).json()
            assert answer["model_version"] == "3" and answer["outputs"][0]["data"][0] == 6.0

            shown = show(url, TINY)
            assert (shown["serving_version"], shown["previous_version"]) == (3, 1)
            versions = {v["version"]: v for v in shown["versions"]}
            assert {n: v["state"] for n, v in versions.items()} == {
                1: "available", 2: "failed", 3: "serving"}
            failed = versions[2]
            assert failed["job"] == refused["id"] and failed["reason"] == refused["error"]
            assert failed["report"] is None and failed["ended_at"] is not None
            assert versions[3]["report"] is not None and versions[3]["reason"] is None

            cli = CliRunner().invoke(models_app, ["show", TINY, "--url", url, "--token",
                                                  TOKENS["upload"]])
            assert cli.exit_code == 0 and "failed:" in cli.output, cli.output
            cli = CliRunner().invoke(models_app, ["list", "--url", url, "--token",
                                                  TOKENS["upload"]])
            assert cli.exit_code == 0 and "1, 3" in cli.output, cli.output  # kept ones


def test_candidate_of_a_rollout_cut_by_a_restart_is_recorded_rolled_back(
    tmp_path: Path
) -> None:
    repo = tmp_path / "model_repo"
    build_tiny_model(repo)
    text = (repo / TINY / "config.pbtxt").read_text()
    (repo / TINY / "2").mkdir()  # the candidate, published
    store = LifecycleStore(tmp_path / "state" / "lifecycle.db")
    store.put_version(VersionRecord(TINY, 1, "serving", text, time.time()))
    store.put_version(VersionRecord(TINY, 2, "available", text, time.time()))
    store.put_model(ModelRecord(TINY, "serving", 0.0, serving_version=1))
    store.create_job("job-r", TINY, "ci")
    store.update_job("job-r", state="rolling_out", version=2,
                     steps=with_step((), "rollout", "running", "step 1 of 2: 50%"))
    now = time.time()
    store.put_rollout(RolloutRecord("job-r", TINY, 1, 2, {"steps": [50, 100]}, "running",
                                    now, now, percent=50))
    store.close()

    spec = LifecycleSpec(repository=repo, state_dir=tmp_path / "state")
    gateway = GatewayConfig(pools=(PoolSpec(name="p", members=(MemberSpec(),)),))
    admin: Any = create_autospec(MemberAdmin, instance=True)
    lifecycle = build_lifecycle(spec, gateway, Core.for_config(gateway), admin,
                                on_version_changed=lambda model: None)
    lifecycle.recover()
    store = lifecycle.catalog.store
    candidate = store.version(TINY, 2)
    assert candidate is not None and candidate.state == "rolled_back"
    # a rollout's words, not a conversion's ("its worker died")
    assert candidate.reason == ROLLOUT_INTERRUPTED != RESTART_REASON
    assert not (repo / TINY / "2").exists()
    assert store.version_floor(TINY) == 3
    cut = store.job("job-r")
    assert (cut.state, cut.error) == ("failed", "interrupted: the control plane restarted")
    assert [(s.name, s.state, s.detail) for s in cut.steps] == [
        ("rollout", "failed", cut.error)]
    rollout = store.rollout(TINY)
    assert rollout is not None and rollout.state == "interrupted"
    assert rollout.detail.startswith("interrupted: the control plane restarted: stable "
                                     "version 1 serves")
