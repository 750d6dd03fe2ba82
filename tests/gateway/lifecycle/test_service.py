"""Uploads refused at the door, through a real gateway over a real Triton: a clear error
for each kind of bad input, a second upload of a model that is busy refused with 409,
and after all of it the repository byte for byte as it was and the serving version
never missing a request."""

from __future__ import annotations

import hashlib
import io
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from converters.tiny import TINY_MODEL_NAME
from tests.conftest import triton_settings
from tests.gateway.lifecycle.conftest import bearer, lifecycle_config, stop
from tests.procs import run_gateway, started_triton, wait_until

pytestmark = pytest.mark.integration
TINY = TINY_MODEL_NAME
SPEC = {"inputs": [{"name": "x", "datatype": "FP32", "shape": ["batch", 16]}]}


def _npz() -> bytes:
    out = io.BytesIO()
    np.savez(out, x=np.zeros((4, 16), np.float32))
    return out.getvalue()


def _files(spec: dict[str, Any] | str = SPEC, model: bytes = b"onnx-bytes",
           evaluation: bool = True, **parts: bytes) -> dict[str, Any]:
    files: dict[str, Any] = {
        "model": ("model.onnx", model),
        "spec": ("spec.json", spec if isinstance(spec, str) else json.dumps(spec)),
    }
    if evaluation:
        files["evaluation"] = ("eval.npz", _npz())
    files.update({k: (f"{k}.npz", v) for k, v in parts.items()})
    return files


INT8 = {**SPEC, "precisions": ["fp32", "int8"], "accuracy_budget": {"min_cosine": 0.99}}
INT8_NEEDS = "precision int8 needs a 'calibration' and an 'evaluation' part (.npz, .npy or an " \
    "archive each); {} missing (fp32 and fp16 uploads may omit both: they are verified on " \
    "synthetic inputs)"


def _tree(repo: Path) -> dict[str, str]:
    return {str(p.relative_to(repo)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(repo.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


BAD_UPLOADS = [
    ("no token", None, TINY, _files(), 401, "missing API token"),
    ("predict token", "predict", TINY, _files(), 403, "lacks the 'upload' scope"),
    ("too large", "upload", TINY, _files(model=b"x" * 300_000), 413, "exceeds its limit"),
    ("int8 without budget", "upload", TINY,
     _files({**SPEC, "precisions": ["int8"]}, calibration=_npz()), 400,
     "need an accuracy_budget"),
    ("int8 without calibration", "upload", TINY, _files(INT8), 400,
     INT8_NEEDS.format("'calibration' is")),
    ("int8 without evaluation", "upload", TINY,
     _files(INT8, evaluation=False, calibration=_npz()), 400,
     INT8_NEEDS.format("'evaluation' is")),
    ("int8 without either", "upload", TINY, _files(INT8, evaluation=False), 400,
     INT8_NEEDS.format("'calibration' and 'evaluation' are")),
    ("spec not JSON", "upload", TINY, _files("{inputs: ["), 400, "not valid JSON"),
    ("spec with a fixed batch axis", "upload", TINY,
     _files({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16]}]}), 400,
     "batch"),
    ("unknown pool", "upload", TINY, _files({**SPEC, "pools": ["gpu-h100"]}), 400,
     "unknown pools"),
    # a slash never reaches the handler: no route matches
    ("model name with a path in it", "upload", "..%2F..%2Fetc", _files(), 404, ""),
    ("model name '..'", "upload", "%2E%2E", _files(), 400, "invalid model name"),
    ("model name with odd characters", "upload", "tiny%3Bdrop", _files(), 400,
     "invalid model name"),
    ("unknown part", "upload", TINY, {**_files(), "weights": ("w.bin", b"x")}, 400,
     "unexpected part"),
]


@pytest.fixture
def gateway_over_tiny(two_version_repo: Path, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    with started_triton(triton_settings(two_version_repo, tmp_path, TINY)) as triton:
        assert triton.endpoints is not None
        config = lifecycle_config(tmp_path / "gateway.yaml", {"local": [triton.endpoints]},
                                  two_version_repo,
                                  lifecycle={"limits": {"max_model_bytes": 200_000}})
        with run_gateway(config, tmp_path) as gw:
            yield f"http://{gw.http_url}", two_version_repo


def test_bad_uploads_refused_with_clear_errors_when_input_wrong(
    gateway_over_tiny: tuple[str, Path], steady_load: Any
) -> None:
    url, repo = gateway_over_tiny
    before = _tree(repo)
    load = steady_load(url)
    outcomes = {}
    for case, scope, name, files, _, _ in BAD_UPLOADS:
        resp = httpx.post(f"{url}/v1/models/{name}/versions", files=files,
                          headers=bearer(scope) if scope else {}, timeout=30)
        outcomes[case] = (resp.status_code, resp.json().get("error", ""))
    stop(load)
    for case, _, _, _, status, message in BAD_UPLOADS:
        assert outcomes[case][0] == status, (case, outcomes[case])
        assert message in outcomes[case][1], (case, outcomes[case])
    assert _tree(repo) == before
    assert load.failures == [] and load.slopes() == [3.0]


def test_second_upload_refused_with_409_when_same_model_busy(
    gateway_over_tiny: tuple[str, Path]
) -> None:
    url, repo = gateway_over_tiny
    before = _tree(repo)
    release = threading.Event()
    first: dict[str, Any] = {}

    def slow_body() -> Iterator[bytes]:
        yield b'--b\r\nContent-Disposition: form-data; name="model"; filename="m.onnx"\r\n\r\n'
        yield b"x" * 1000
        release.wait(30)
        yield b"\r\n--b--\r\n"  # no spec part: this upload ends with a 400

    def upload_slowly() -> None:
        first["resp"] = httpx.post(
            f"{url}/v1/models/{TINY}/versions", content=slow_body(), timeout=60,
            headers={**bearer("upload"), "content-type": "multipart/form-data; boundary=b"})

    thread = threading.Thread(target=upload_slowly)
    thread.start()
    try:
        def receiving() -> bool:
            shown = httpx.get(f"{url}/v1/models/{TINY}", headers=bearer("upload")).json()
            return any(j["state"] == "receiving" for j in shown["recent_jobs"])

        assert wait_until(receiving, 10)
        second = httpx.post(f"{url}/v1/models/{TINY}/versions", files=_files(),
                            headers=bearer("upload"))
        assert second.status_code == 409
        assert "already has job job-" in second.json()["error"]
    finally:
        release.set()
        thread.join(30)
    assert first["resp"].status_code == 400 and "no 'spec'" in first["resp"].json()["error"]
    job_id = first["resp"].json().get("job") or ""
    shown = httpx.get(f"{url}/v1/models/{TINY}", headers=bearer("upload")).json()
    failed = shown["recent_jobs"][0]
    assert failed["state"] == "failed" and not job_id
    job = httpx.get(f"{url}/v1/jobs/{failed['id']}", headers=bearer("upload")).json()
    assert job["error"].startswith("upload rejected") and job["steps"][0]["state"] == "failed"
    # the model is free again: the next upload gets past the lock (and fails on its own)
    third = httpx.post(f"{url}/v1/models/{TINY}/versions", files=_files("nope"),
                       headers=bearer("upload"))
    assert third.status_code == 400
    assert _tree(repo) == before
