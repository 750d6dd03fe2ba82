"""Helpers for lifecycle tests: a repository with two versions of the tiny model, a
gateway config with a ``lifecycle:`` section and tokens, a steady load that records
every answer, a gateway started without waiting for readiness, and uploads/jobs
through a running gateway."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import os
import shutil
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper

from converters.images import EFFICIENTNET_LITE, SAMPLE_PHOTOS, augmented_views, load_image
from converters.images import sample_photo as photo
from converters.tiny import TINY_MODEL_NAME, TINY_WIDTH, build_tiny_model
from gateway.lifecycle.client import LifecycleClient
from infergate.processes import (
    ROOT,
    GatewayNotStarted,
    GatewayProcess,
    haproxy_beside,
    started_on_free_ports,
    wait_until,
)
from infergate.triton.local import TritonEndpoints

TOKENS = {"predict": "predict-token-0123456789", "upload": "upload-token-0123456789",
          "admin": "admin-token-0123456789ab"}
X = np.ones((1, TINY_WIDTH), np.float32)


def affine_onnx(path: Path, slope: float) -> Path:
    """``y = slope * x + 1`` over FP32 [batch, 16] (the tiny model with another slope)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", TINY_WIDTH])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", TINY_WIDTH])
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "k"], ["kx"]),
         helper.make_node("Add", ["kx", "one"], ["y"])],
        "affine", [x], [y],
        initializer=[helper.make_tensor("k", TensorProto.FLOAT, [1], [slope]),
                     helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def add_version(repo: Path, model: str, version: int, slope: float | None) -> None:
    """Copy version 1's folder as ``version``; its ONNX computes ``slope*x+1`` (None:
    garbage bytes, a corrupt model)."""
    target = repo / model / str(version)
    shutil.copytree(repo / model / "1", target)
    if slope is None:
        (target / "model.onnx").write_bytes(b"this is not an onnx file")
    else:
        affine_onnx(target / "model.onnx", slope)


@pytest.fixture
def two_version_repo(tmp_path: Path) -> Path:
    """``tiny`` with version 1 (2x+1) and version 2 (3x+1)."""
    repo = tmp_path / "model_repo"
    build_tiny_model(repo)
    add_version(repo, TINY_MODEL_NAME, 2, 3.0)
    return repo


def tokens_file(path: Path) -> Path:
    path.write_text(yaml.safe_dump({"tokens": [
        {"name": scope, "scopes": [scope], "token": token} for scope, token in TOKENS.items()
    ]}))
    return path


def lifecycle_config(path: Path, pools: dict[str, list[TritonEndpoints]], repo: Path,
                     *, predict: str = "open", models: dict[str, Any] | None = None,
                     lifecycle: dict[str, Any] | None = None, tokens: bool = True) -> Path:
    data: dict[str, Any] = {
        "pools": [{"name": name, "members": [
            {"host": e.host, "http_port": e.http_port, "grpc_port": e.grpc_port,
             "metrics_port": e.metrics_port} for e in members]}
            for name, members in pools.items()],
        "lifecycle": {"repository": str(repo), "state_dir": str(path.parent / "state"),
                      **(lifecycle or {})},
        "auth": {"predict": predict},
        "models": models or {},
    }
    if tokens:
        data["auth"]["tokens_file"] = str(tokens_file(path.parent / "tokens.yaml"))
    path.write_text(yaml.safe_dump(data))
    return path


def bearer(scope: str) -> dict[str, str]:
    return {"authorization": f"Bearer {TOKENS[scope]}"}


def infer_body(x: np.ndarray = X) -> dict[str, Any]:
    return {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                        "data": x.ravel().tolist()}]}


def slope_of(answer: dict[str, Any]) -> float:
    """The tiny family computes slope*x+1: with x = 1 the output is slope + 1."""
    return float(answer["outputs"][0]["data"][0]) - 1.0


@dataclass
class SteadyLoad:
    """Requests back to back from a thread; every answer is kept (status, slope)."""

    url: str
    model: str = TINY_MODEL_NAME
    headers: dict[str, str] = field(default_factory=dict)
    answers: list[tuple[int, float | None]] = field(default_factory=list)
    # what each failed request was told, with its time (monotonic): a failure explains itself
    told: list[tuple[float, int, str]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _done: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        try:
            self._loop()
        finally:
            self._done.set()

    def _loop(self) -> None:
        with httpx.Client(timeout=30, trust_env=False) as client:
            while not self._stop.is_set():
                try:
                    resp = client.post(f"{self.url}/v2/models/{self.model}/infer",
                                       json=infer_body(), headers=self.headers)
                except httpx.HTTPError as exc:
                    self.answers.append((-1, None))  # connection failed: a failure too
                    self.told.append((time.monotonic(), -1, repr(exc)))
                    time.sleep(0.05)
                    continue
                slope = slope_of(resp.json()) if resp.status_code == 200 else None
                if resp.status_code != 200:
                    self.told.append((time.monotonic(), resp.status_code, resp.text[:300]))
                self.answers.append((resp.status_code, slope))
                time.sleep(0.005)

    @property
    def failures(self) -> list[str]:
        """What each failed request was told (status, message, seconds since the first
        failure), in order."""
        first = self.told[0][0] if self.told else 0.0
        return [f"{status} at +{when - first:.3f}s: {said}" for when, status, said in self.told]

    def slopes(self) -> list[float]:
        """Distinct slopes in the order they were first seen."""
        seen: list[float] = []
        for _, slope in self.answers:
            if slope is not None and (not seen or seen[-1] != slope):
                seen.append(slope)
        return seen


@pytest.fixture
def steady_load() -> Iterator[Any]:
    loads: list[tuple[SteadyLoad, threading.Thread]] = []

    def start(url: str, **kwargs: Any) -> SteadyLoad:
        load = SteadyLoad(url, **kwargs)
        thread = threading.Thread(target=load.run, daemon=True)
        thread.start()
        loads.append((load, thread))
        return load

    try:
        yield start
    finally:
        for load, thread in loads:
            load._stop.set()
            thread.join(timeout=30)


def stop(load: SteadyLoad, answers: int = 5, timeout_s: float = 30.0) -> None:
    """Stop the load once ``answers`` more answers came back (so what was just changed
    was seen by real requests), and wait for its last request to finish."""
    seen = len(load.answers)
    assert wait_until(lambda: len(load.answers) >= seen + answers, timeout_s, 0.01), \
        f"the load got {len(load.answers) - seen} of {answers} answers in {timeout_s} s"
    load._stop.set()
    assert load._done.wait(timeout_s), "the load's last request never finished"


async def eventually(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Wait (on the event loop) until ``predicate()`` holds; fail at the deadline."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(0.005)


@contextlib.contextmanager
def spawn_gateway(config: Path, log_dir: Path, *args: str) -> Iterator[GatewayProcess]:
    """A gateway subprocess, returned as soon as it is *live* (not ready): for tests of
    the readiness gate. Stopped with SIGTERM on exit. Started again on other ports when
    another process took one of its free ports before it bound it."""
    with started_on_free_ports(lambda ports: _spawned(config, log_dir, ports, args)) as gw:
        yield gw


def _spawned(config: Path, log_dir: Path, ports: tuple[int, int],
             args: tuple[str, ...]) -> GatewayProcess:
    http_port, grpc_port = ports
    log = log_dir / f"gateway-{http_port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--pools", str(config),
             "--http-port", str(http_port), "--grpc-port", str(grpc_port),
             "--probe-interval", "0.5",
             # HAProxy's files beside the log (as run_gateway): a leftover is traceable
             "--haproxy-run-dir", str(haproxy_beside(log_dir, http_port)), *args],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    gateway = GatewayProcess(proc, http_port, grpc_port, log)
    try:
        def live() -> bool:
            if proc.poll() is not None:
                raise GatewayNotStarted(f"gateway exited: {log.read_text()[-2000:]}", log)
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"http://{gateway.http_url}/v2/health/live").status_code == 200
            return False

        if not wait_until(live, 30, 0.02):
            raise GatewayNotStarted(f"gateway not live: {log.read_text()[-2000:]}", log)
    except BaseException:
        gateway.terminate()
        raise
    return gateway


# -- uploads through a running gateway -------------------------------------------------
TINY_SPEC = {"inputs": [{"name": "x", "datatype": "FP32", "shape": ["batch", 16]}],
             "max_batch_size": 8, "profile_iterations": 3, "intra_op_threads": 1}
EFFNET_SPEC = {"inputs": [{"name": "input", "datatype": "FP32",
                           "shape": ["batch", 3, 224, 224]}],
               "max_batch_size": 4, "profile_iterations": 3}


def npz(arrays: dict[str, np.ndarray]) -> bytes:
    out = io.BytesIO()
    np.savez(out, **arrays)  # type: ignore[arg-type]
    return out.getvalue()


def photo_crops(count: int, seed: int) -> bytes:
    views = [EFFICIENTNET_LITE(v) for i, name in enumerate(SAMPLE_PHOTOS)
             for v in augmented_views(load_image(photo(name)), count // len(SAMPLE_PHOTOS) + 1,
                                      seed + i)]
    return npz({"input": np.stack(views[:count]).astype(np.float32)})


def tiny_samples(count: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    return npz({"x": rng.normal(size=(count, 16)).astype(np.float32)})


def hostile_export(path: Path, code: str) -> Path:
    """A genuine torch.export archive (a Linear over [batch, 16]) whose sample inputs
    unpickle into ``exec(code)``: torch.export.load falls back to weights_only=False
    for them."""
    import torch

    class Payload:
        def __reduce__(self) -> tuple[Any, ...]:
            return (exec, (code, {}))

    plain = path.with_suffix(".plain.pt2")
    torch.export.save(torch.export.export(torch.nn.Linear(TINY_WIDTH, TINY_WIDTH),
                                          (torch.zeros(1, TINY_WIDTH),)), plain)
    payload = io.BytesIO()
    torch.save(Payload(), payload)
    with zipfile.ZipFile(plain) as src, zipfile.ZipFile(path, "w") as out:
        for info in src.infolist():
            hidden = info.filename.endswith("sample_inputs/model.pt")
            out.writestr(info, payload.getvalue() if hidden else src.read(info))
    plain.unlink()
    return path


def tree(repo: Path) -> dict[str, str]:
    return {str(p.relative_to(repo)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(repo.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def client(url: str, scope: str = "upload") -> LifecycleClient:
    """The lifecycle API of the gateway at ``url``, as the ``scope`` token."""
    return LifecycleClient(url, TOKENS[scope], timeout=120)


def upload(url: str, name: str, model: Path | bytes, spec: dict[str, Any],
           evaluation: bytes | None, calibration: bytes | None = None) -> dict[str, Any]:
    """``evaluation`` None: no evaluation part (FP32/FP16 are verified on synthetic inputs)."""
    with client(url) as lifecycle:
        return lifecycle.upload(name, model,  # a path as the CLI sends it
                                spec, evaluation=evaluation, calibration=calibration)


def job(url: str, job_id: str) -> dict[str, Any]:
    with client(url) as lifecycle:
        return lifecycle.job(job_id)


def finished(url: str, job_id: str, timeout_s: float = 180) -> dict[str, Any]:
    with client(url) as lifecycle:
        return lifecycle.wait(job_id, timeout_s=timeout_s, poll_s=0.2)


def show(url: str, name: str) -> dict[str, Any]:
    with client(url) as lifecycle:
        return lifecycle.model(name)
