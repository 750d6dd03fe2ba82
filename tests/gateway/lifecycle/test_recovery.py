"""A gateway that dies mid-job: restarted, it reports every job truthfully (finished
ones as they ended, the running one failed with the reason), its worker died with it,
and the repository holds no version the dead job published but never served."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any
from unittest.mock import create_autospec

import httpx
import pytest

from converters.samples import SAMPLE_MODEL_NAME
from converters.tiny import TINY_MODEL_NAME
from gateway.config import GatewayConfig
from gateway.config.lifecycle import LifecycleSpec
from gateway.config.pools import MemberSpec, PoolSpec
from gateway.core import Core
from gateway.lifecycle.assembly import build_lifecycle
from gateway.lifecycle.records.jobs import LifecycleStore, ModelRecord, VersionRecord
from gateway.lifecycle.service import RESTART_REASON
from gateway.upstream.triton import MemberAdmin
from tests.conftest import triton_settings
from tests.gateway.lifecycle.conftest import (
    EFFNET_SPEC,
    TINY_SPEC,
    finished,
    job,
    lifecycle_config,
    photo_crops,
    show,
    tiny_samples,
    tree,
    upload,
)
from tests.procs import run_gateway, started_triton, wait_until

TINY = TINY_MODEL_NAME


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.mark.integration
@pytest.mark.slow
def test_restarted_gateway_reports_jobs_truthfully_when_killed_mid_conversion(
    two_version_repo: Path, sample_repo: Path, tmp_path: Path
) -> None:
    repo = two_version_repo  # tiny 1 (2x+1) and 2 (3x+1); Triton serves 2
    with started_triton(triton_settings(repo, tmp_path, TINY)) as triton:
        assert triton.endpoints is not None
        config = lifecycle_config(tmp_path / "gateway.yaml", {"local": [triton.endpoints]},
                                  repo)
        with run_gateway(config, tmp_path) as gw:
            url = f"http://{gw.http_url}"
            good = finished(url, upload(url, TINY, (repo / TINY / "1" / "model.onnx"),
                                        TINY_SPEC, tiny_samples(8, 1))["id"])
            bad = finished(url, upload(url, TINY, b"not onnx", TINY_SPEC,
                                       tiny_samples(8, 1))["id"])
            assert (good["state"], bad["state"]) == ("succeeded", "failed")
            before = tree(repo)
            running = upload(url, "effnet", sample_repo / SAMPLE_MODEL_NAME / "1" / "model.onnx",
                             {**EFFNET_SPEC, "precisions": ["fp32", "int8"],
                              "accuracy_budget": {"max_top1_drop": 0.1}},
                             photo_crops(8, 1), photo_crops(16, 50))
            assert wait_until(lambda: any(s["name"] == "build-int8"
                                          for s in job(url, running["id"])["steps"]), 120, 0.1)
            worker = job(url, running["id"])["worker_pid"]
            gw.proc.kill()  # SIGKILL: no drain, no clean-up
            gw.proc.wait(10)
            assert wait_until(lambda: not _alive(worker), 10), "the worker outlived its gateway"

        # the same command again: it adopts the HAProxy the crash left serving
        with run_gateway(config, tmp_path, ports=(gw.http_port, gw.grpc_port)) as gw:
            url = f"http://{gw.http_url}"
            assert job(url, good["id"])["state"] == "succeeded"
            assert job(url, good["id"])["version"] == good["version"]
            assert job(url, bad["id"])["error"] == bad["error"]
            died = job(url, running["id"])
            assert died["state"] == "failed" and died["error"] == RESTART_REASON
            assert [s["state"] for s in died["steps"] if s["name"] == "build-int8"] == ["failed"]
            assert show(url, TINY)["serving_version"] == good["version"]  # preloaded
            answer = httpx.post(f"{url}/v2/models/{TINY}/infer", json={"inputs": [
                {"name": "x", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}]})
            assert answer.json()["model_version"] == str(good["version"])
            assert tree(repo) == before  # no trace of effnet
            assert not (tmp_path / "state" / "jobs" / running["id"]).exists()


def test_restart_removes_version_published_but_never_served_when_job_died_deploying(
    tmp_path: Path, two_version_repo: Path
) -> None:
    repo = two_version_repo
    text = (repo / TINY / "config.pbtxt").read_text()
    store = LifecycleStore(tmp_path / "state" / "lifecycle.db")
    store.put_version(VersionRecord(TINY, 1, "serving", text, time.time()))
    store.put_version(VersionRecord(TINY, 2, "available", text, time.time()))
    store.put_model(ModelRecord(TINY, "serving", 0.0, serving_version=1))
    store.create_job("job-x", TINY, "ci")
    store.update_job("job-x", state="deploying", version=2)
    (tmp_path / "state" / "jobs" / "job-x").mkdir(parents=True)
    store.close()

    spec = LifecycleSpec(repository=repo, state_dir=tmp_path / "state")
    gateway = GatewayConfig(pools=(PoolSpec(name="p", members=(MemberSpec(),)),))
    core = Core.for_config(gateway)
    admin: Any = create_autospec(MemberAdmin, instance=True)
    lifecycle = build_lifecycle(spec, gateway, core, admin,
                                on_version_changed=lambda model: None)
    store = lifecycle.catalog.store
    assert store.job("job-x").state != "failed"  # nothing happens before recover()
    lifecycle.recover()
    assert store.job("job-x").state == "failed"
    assert not (repo / TINY / "2").exists() and (repo / TINY / "1").is_dir()
    assert [v.version for v in store.versions(TINY, live=True)] == [1]
    ended = store.version(TINY, 2)  # kept as failed: number 2 is never issued again
    assert ended is not None and ended.state == "failed" and ended.reason == RESTART_REASON
    assert store.version_floor(TINY) == 3
    assert "versions: 1" in (repo / TINY / "config.pbtxt").read_text()
    assert not (tmp_path / "state" / "jobs" / "job-x").exists()
