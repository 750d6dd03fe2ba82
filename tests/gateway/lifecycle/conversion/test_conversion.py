"""Uploads that go through the real converter pipeline in a worker process, served by a
real Triton through a real gateway: EfficientNet-Lite0 uploaded with the CLI and
classifying a cat; a new version going live under load and rolled back; a corrupt
model, a spec that does not match, INT8 that misses its budget and a worker killed
mid-conversion each leaving the repository as it was and the serving version serving."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from typer.testing import CliRunner

from converters.samples import SAMPLE_MODEL_NAME, cat_input
from converters.tiny import TINY_MODEL_NAME, build_tiny_model, tiny_onnx
from gateway.models_cli import app as models_app
from tests.conftest import triton_settings
from tests.gateway.lifecycle.conftest import (
    EFFNET_SPEC,
    TINY_SPEC,
    TOKENS,
    affine_onnx,
    bearer,
    finished,
    hostile_export,
    job,
    lifecycle_config,
    photo_crops,
    show,
    stop,
    tiny_samples,
    tree,
    upload,
)
from tests.procs import run_gateway, started_triton, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TINY = TINY_MODEL_NAME
EFFNET = "effnet"


@dataclass(frozen=True)
class Stack:
    url: str
    grpc_url: str
    repo: Path
    effnet_onnx: Path
    folder: Path


@pytest.fixture(scope="module")
def stack(sample_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Triton serving ``tiny`` version 1 (2x+1); a gateway managing its repository."""
    folder = tmp_path_factory.mktemp("conversion")
    repo = folder / "model_repo"
    build_tiny_model(repo)
    with started_triton(triton_settings(repo, folder, TINY)) as triton:
        assert triton.endpoints is not None
        config = lifecycle_config(folder / "gateway.yaml", {"local": [triton.endpoints]}, repo)
        with run_gateway(config, folder) as gw:
            yield Stack(f"http://{gw.http_url}", gw.grpc_url, repo,
                        sample_repo / SAMPLE_MODEL_NAME / "1" / "model.onnx", folder)


@pytest.fixture(scope="module")
def effnet_served(stack: Stack) -> str:
    """EfficientNet-Lite0 (real weights) uploaded with ``infergate models upload``."""
    (stack.folder / "effnet-spec.json").write_text(json.dumps(EFFNET_SPEC))
    (stack.folder / "eval.npz").write_bytes(photo_crops(8, seed=1))
    result = CliRunner().invoke(models_app, [
        "upload", EFFNET, "--model", str(stack.effnet_onnx),
        "--spec", str(stack.folder / "effnet-spec.json"),
        "--evaluation", str(stack.folder / "eval.npz"),
        "--url", stack.url, "--token", TOKENS["upload"],
    ])
    assert result.exit_code == 0, result.output
    return result.output


def test_uploaded_efficientnet_classifies_cat_through_gateway_when_converted(
    stack: Stack, effnet_served: str
) -> None:
    assert f"{EFFNET} version 1 is serving" in effnet_served
    x = cat_input()
    http = httpclient.InferenceServerClient(stack.url.removeprefix("http://"))
    grpc = grpcclient.InferenceServerClient(stack.grpc_url)
    try:
        for client, module in ((http, httpclient), (grpc, grpcclient)):
            inp = module.InferInput("input", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            logits = client.infer(EFFNET, [inp]).as_numpy("logits")
            assert 281 <= int(np.argmax(logits[0])) <= 285  # a cat
    finally:
        http.close()
        grpc.close()
    shown = show(stack.url, EFFNET)
    assert shown["serving_version"] == 1 and shown["state"] == "serving"
    version = shown["versions"][0]
    assert version["precision"] == "fp32" and version["metadata"]["accuracy"]["cosine"] > 0.999
    report = httpx.get(stack.url + version["report"], headers=bearer("upload"))
    assert report.status_code == 200 and EFFNET in report.text
    steps = {s["name"]: s["state"] for s in job(stack.url, version["job"])["steps"]}
    assert [steps[s] for s in ("upload", "check", "verify", "publish", "load", "warm",
                               "route")] == ["done"] * 7


def test_fp32_fp16_upload_without_evaluation_part_serves_verified_on_synthetic_inputs(
    stack: Stack
) -> None:
    """Uploads follow the command line's rule: FP32/FP16 need no samples (issue 22)."""
    model = "affine_synthetic"
    spec = {**TINY_SPEC, "precisions": ["fp32", "fp16"], "accuracy_budget": {"min_cosine": 0.99}}
    started = upload(stack.url, model, affine_onnx(stack.folder / "slope4.onnx", 4.0), spec,
                     evaluation=None)
    done = finished(stack.url, started["id"])
    assert done["state"] == "succeeded", done["error"]
    steps = {s["name"]: s for s in done["steps"]}
    assert steps["synthetic"]["state"] == "done" and "64 samples, seed 0" in \
        steps["synthetic"]["detail"]
    answer = httpx.post(f"{stack.url}/v2/models/{model}/infer", json={"inputs": [
        {"name": "x", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}]}, timeout=30)
    assert answer.status_code == 200 and answer.json()["outputs"][0]["data"][0] == 5.0
    version = show(stack.url, model)["versions"][0]
    assert version["metadata"]["evaluation"] == "synthetic"
    assert version["metadata"]["accuracy"]["samples"] == 64
    report = httpx.get(stack.url + version["report"], headers=bearer("upload"))
    assert report.status_code == 200
    assert "verified on 64 synthetic inputs (seed 0), not on real data" in report.text


def test_new_version_goes_live_without_failed_requests_then_rolls_back(
    stack: Stack, steady_load: Any
) -> None:
    load = steady_load(stack.url)
    new = upload(stack.url, TINY, affine_onnx(stack.folder / "slope3.onnx", 3.0), TINY_SPEC,
                 tiny_samples(8, 1))
    done = finished(stack.url, new["id"])
    assert done["state"] == "succeeded", done["error"]
    assert wait_until(lambda: load.slopes()[-1:] == [3.0], 10)
    shown = show(stack.url, TINY)
    assert (shown["serving_version"], shown["previous_version"]) == (done["version"], 1)
    resp = httpx.post(f"{stack.url}/v1/models/{TINY}/rollback", headers=bearer("admin"),
                      timeout=60)
    assert resp.status_code == 200 and resp.json()["serving_version"] == 1
    assert wait_until(lambda: load.slopes()[-1:] == [2.0], 10)
    stop(load)
    assert load.failures == []
    assert load.slopes() == [2.0, 3.0, 2.0]


BAD_CONVERSIONS = {
    "corrupt model": (b"\x08\x07 definitely not a protobuf", TINY_SPEC, False, "InvalidSource"),
    "spec that does not match the model": (
        None, {**TINY_SPEC, "inputs": [{"name": "input", "datatype": "FP32",
                                        "shape": ["batch", 16]}]}, False, "InputSpecMismatch"),
    # (repair off: on a two-node model keeping one node float always meets the budget)
    "INT8 that misses its budget": (
        None, {**TINY_SPEC, "precisions": ["int8"], "repair": False,
               "accuracy_budget": {"min_cosine": 0.99999999, "max_top1_drop": 0.0}},
        True, "budget"),
}


@pytest.mark.parametrize("case", list(BAD_CONVERSIONS))
def test_bad_conversion_fails_job_and_leaves_repository_as_it_was(
    stack: Stack, steady_load: Any, case: str
) -> None:
    model, spec, calibrate, reason = BAD_CONVERSIONS[case]
    serving = show(stack.url, TINY)["serving_version"]
    before = tree(stack.repo)
    load = steady_load(stack.url)
    source = model if model is not None else tiny_onnx(stack.folder / "tiny.onnx")
    failed = finished(stack.url, upload(stack.url, TINY, source, spec, tiny_samples(8, 1),
                                        tiny_samples(16, 2) if calibrate else None)["id"])
    stop(load)
    assert failed["state"] == "failed" and reason in failed["error"], failed["error"]
    assert [s for s in failed["steps"] if s["state"] == "failed"], failed["steps"]
    assert tree(stack.repo) == before
    assert show(stack.url, TINY)["serving_version"] == serving
    assert load.failures == [] and len(set(load.slopes())) == 1


def test_upload_refused_when_pytorch_file_carries_pickled_code(stack: Stack) -> None:
    """A .pt2 whose sample inputs would run code in torch.export.load: refused at the
    door, before any worker opens it (issue 11)."""
    before = tree(stack.repo)
    marker = stack.folder / "escaped.txt"
    model = hostile_export(stack.folder / "hostile.pt2",
                           f"open({str(marker)!r}, 'w').write('escaped')")
    resp = httpx.post(f"{stack.url}/v1/models/{TINY}/versions", headers=bearer("upload"),
                      files={"model": ("model.pt2", model.read_bytes()),
                             "spec": ("spec.json", json.dumps(TINY_SPEC)),
                             "evaluation": ("evaluation.npz", tiny_samples(8, 1))},
                      timeout=120)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert "model.pt2 would run pickled code" in error and "exec" in error, error
    assert "sample_inputs" in error and "allow_pickled_code" in error
    assert not marker.exists()
    assert tree(stack.repo) == before


def test_killed_worker_leaves_no_partial_version_when_converting(
    stack: Stack, effnet_served: str
) -> None:
    before = tree(stack.repo)
    started = upload(stack.url, EFFNET, stack.effnet_onnx,
                     {**EFFNET_SPEC, "precisions": ["fp32", "int8"],
                      "accuracy_budget": {"max_top1_drop": 0.1}},
                     photo_crops(8, seed=1), photo_crops(16, seed=50))

    def quantizing() -> bool:
        current = job(stack.url, started["id"])
        return current["worker_pid"] is not None and any(
            s["name"] == "build-int8" for s in current["steps"])

    assert wait_until(quantizing, 120, 0.1), job(stack.url, started["id"])
    os.kill(job(stack.url, started["id"])["worker_pid"], signal.SIGKILL)
    failed = finished(stack.url, started["id"])
    assert failed["state"] == "failed" and "killed by SIGKILL" in failed["error"]
    assert tree(stack.repo) == before
    staging = stack.repo.parent / f".{stack.repo.name}.staging"
    assert not [p for p in staging.glob(f"{EFFNET}.*")] if staging.exists() else True
    assert not (stack.folder / "state" / "jobs" / started["id"]).exists()
    x = cat_input()
    answer = httpx.post(f"{stack.url}/v2/models/{EFFNET}/infer", json={"inputs": [
        {"name": "input", "shape": list(x.shape), "datatype": "FP32",
         "data": x.ravel().tolist()}]}, timeout=30)
    assert answer.status_code == 200 and answer.json()["model_version"] == "1"
