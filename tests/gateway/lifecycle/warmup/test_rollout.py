"""Progressive delivery against a real Triton through a real gateway, with clients
sending traffic throughout (HTTP and gRPC): a good version promoted through the gate,
the shadow step and every step; a wrong one rejected at the gate and one that agrees on
the owner's samples but not on live inputs rejected in the shadow step, on both data
planes, neither having answered a user; an erroring one rolled back at the first step,
a slow one on p99 (shadow step off); the split itself on both data planes with pause
and the 409s, ended by an abort or by a gateway restarted in the middle of the
rollout."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from typer.testing import CliRunner

from converters.tiny import TINY_WIDTH, build_tiny_model
from gateway.models_cli import app as models_app
from infergate.processes import GatewayProcess
from loadtests.rollout_models import diverging_onnx, erroring_onnx, flipped_onnx, slow_onnx
from tests.conftest import triton_settings
from tests.gateway.lifecycle.conftest import (
    TINY_SPEC,
    TOKENS,
    affine_onnx,
    bearer,
    finished,
    job,
    lifecycle_config,
    npz,
    show,
    tiny_samples,
    upload,
)
from tests.procs import run_gateway, started_triton, wait_until

pytestmark = pytest.mark.integration
BAD_EVERY = 5  # one request in five has x[0] = 0.9, beyond the owner's samples


def _x(n: int, bad_every: int = BAD_EVERY) -> np.ndarray:
    x = np.full((1, TINY_WIDTH), 0.5, np.float32)
    if n % bad_every == 0:
        x[0, 0] = 0.9  # the erroring version fails on it, the diverging one answers -2x + 1
    return x


def _slope(y: np.ndarray) -> float:
    return round((float(y.reshape(-1)[1]) - 1.0) / 0.5, 3)  # y = slope * 0.5 + 1


@dataclass
class Load:
    """Requests back to back from a thread, unversioned: (time, ok, slope) per answer;
    one in ``bad_every`` has x[0] = 0.9."""

    url: str
    model: str
    proto: str
    bad_every: int = BAD_EVERY
    answers: list[tuple[float, bool, float | None]] = field(default_factory=list)
    versions: list[str] = field(default_factory=list)  # the version of each answer
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Load:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        n = 0
        if self.proto == "grpc":
            client = grpcclient.InferenceServerClient(self.url)
            try:
                while not self._stop.is_set():
                    n += 1
                    item = grpcclient.InferInput("x", [1, TINY_WIDTH], "FP32")
                    item.set_data_from_numpy(_x(n, self.bad_every))
                    try:
                        out = client.infer(self.model, [item], client_timeout=30)
                        self.answers.append((time.monotonic(), True, _slope(out.as_numpy("y"))))
                        self.versions.append(out.get_response().model_version)
                    except Exception:  # noqa: BLE001 - every failure is recorded
                        self.answers.append((time.monotonic(), False, None))
            finally:
                client.close()
            return
        with httpx.Client(timeout=30, trust_env=False) as client:
            while not self._stop.is_set():
                n += 1
                x = _x(n, self.bad_every)
                body = {"inputs": [{"name": "x", "shape": [1, TINY_WIDTH], "datatype": "FP32",
                                    "data": x.ravel().tolist()}]}
                try:
                    resp = client.post(f"{self.url}/v2/models/{self.model}/infer", json=body)
                except httpx.HTTPError:
                    self.answers.append((time.monotonic(), False, None))
                    continue
                ok = resp.status_code == 200
                slope = _slope(np.array(resp.json()["outputs"][0]["data"])) if ok else None
                self.answers.append((time.monotonic(), ok, slope))
                if ok:
                    self.versions.append(str(resp.json().get("model_version")))

    def stop(self, more: int = 20) -> None:
        seen = len(self.answers)
        assert wait_until(lambda: len(self.answers) >= seen + more, 60, 0.01)
        self._stop.set()
        assert self._thread is not None
        self._thread.join(60)

    def between(self, start: float, end: float) -> list[tuple[float, bool, float | None]]:
        return [a for a in self.answers if start <= a[0] <= end]

    @property
    def failures(self) -> int:
        return sum(1 for _, ok, _ in self.answers if not ok)


MODELS = ("roll_good", "roll_err", "roll_slow", "roll_split_haproxy", "roll_split_python",
          "roll_gate_haproxy", "roll_gate_python", "roll_live_haproxy", "roll_live_python")
CALM = npz({"x": np.random.default_rng(3).uniform(0, 0.8, (32, TINY_WIDTH))
            .astype(np.float32)})  # the owner's samples never reach x[0] > 0.8


@pytest.fixture(scope="module")
def shared_triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Any]]:
    """One Triton for the module; each test rolls out a model of its own, whose version 1
    (the tiny model, 2x + 1) the gateway adopts from the repository at start-up."""
    root = tmp_path_factory.mktemp("rollout")
    repo = root / "model_repo"
    for model in MODELS:
        build_tiny_model(repo, model)
    with started_triton(triton_settings(repo, root)) as triton:
        assert triton.endpoints is not None
        yield repo, triton.endpoints


def _roll(url: str, model: str, onnx_path: Path, rollout: dict[str, Any],
          evaluation: bytes | None = None) -> dict[str, Any]:
    spec = {**TINY_SPEC, "rollout": rollout}
    return upload(url, model, onnx_path, spec, evaluation or tiny_samples(32, 2))


def _rollout(url: str, model: str) -> dict[str, Any]:
    resp = httpx.get(f"{url}/v1/models/{model}/rollout", headers=bearer("upload"))
    assert resp.status_code == 200, resp.text
    return resp.json()  # type: ignore[no-any-return]


def _percent(url: str, model: str) -> int:
    """The candidate's share now; -1 before the rollout has begun."""
    resp = httpx.get(f"{url}/v1/models/{model}/rollout", headers=bearer("upload"))
    return int(resp.json()["percent"]) if resp.status_code == 200 else -1


def _serve(tmp_path: Path, shared: tuple[Path, Any], model: str,
           data_plane: str) -> AbstractContextManager[GatewayProcess]:
    return run_gateway(_gateway(tmp_path, shared, model), tmp_path, data_plane=data_plane)


def _gateway(tmp_path: Path, shared: tuple[Path, Any], model: str) -> Path:
    repo, endpoints = shared
    return lifecycle_config(tmp_path / "gateway.yaml", {"local": [endpoints]}, repo,
                            models={model: {"preload": True}})


def test_good_version_promoted_through_every_step_when_rolled_out(
    shared_triton: tuple[Path, Any], tmp_path: Path
) -> None:
    """HAProxy plane, clients on HTTP and gRPC: no request fails; the gate and the
    shadow step (the default: 20 % mirrored for step_seconds) pass it, then the split
    moves step by step; the whole rollout takes about (steps + 1) x step_seconds."""
    model = "roll_good"
    with _serve(tmp_path, shared_triton, model, "haproxy") as gw:
        url = f"http://{gw.http_url}"
        # a step needs 100 candidate answers to judge a p99: large shares keep it short
        rollout = {"steps": [50, 75, 100], "step_seconds": 2, "min_requests": 10,
                   "p99_tolerance_ms": 100}  # the slow version's test judges p99
        answer = _roll(url, model, affine_onnx(tmp_path / "v2.onnx", 2.1), rollout)
        # the clients start before the candidate is loaded beside stable
        assert wait_until(lambda: job(url, answer["id"])["state"] == "rolling_out", 120, 0.05)
        loads = [Load(url, model, "http").start(), Load(gw.grpc_url, model, "grpc").start()]
        done = finished(url, answer["id"])
        for load in loads:
            load.stop()
        assert done["state"] == "succeeded", done
        record = done["rollout"]
        assert record["state"] == "promoted" and record["percent"] == 100
        promotions = [d for d in record["decisions"] if d["decision"] == "promote"]
        assert [d["step"] for d in promotions] == ["gate", "shadow", 1, 2, 3]
        assert [d["percent"] for d in promotions] == [0, 0, 50, 75, 100]
        gate, shadow = promotions[:2]
        assert gate["agreement"] > 0.99 and gate["candidate"]["errors"] == 0
        assert gate["candidate"]["requests"] >= 32
        assert shadow["agreement"] is not None and shadow["agreement"] > 0.99, shadow
        assert shadow["candidate"]["requests"] >= 10 and shadow["candidate"]["errors"] == 0
        took = record["decisions"][-1]["at"] - record["started_at"]
        assert 8 <= took <= 8 + 60, took  # shadow + 3 steps x 2 s, plus loading, any hold
        assert all(d["agreement"] is not None and d["agreement"] > 0.99 for d in promotions)
        assert show(url, model)["serving_version"] == 2
        for load in loads:
            assert load.failures == 0, load.proto
            slopes = [s for _, _, s in load.answers]
            assert {2.0, 2.1} <= set(slopes), load.proto  # both served during the rollout
            assert set(slopes[-10:]) == {2.1}, load.proto  # the candidate alone after it


def test_erroring_version_rolled_back_at_first_step_when_it_fails_requests(
    shared_triton: tuple[Path, Any], tmp_path: Path
) -> None:
    """Python plane: a version failing on live inputs beyond the owner's samples, here
    every request, is rolled back at step 1 with an error rate of 1; the client's
    failures are about (step share) x the requests of that step. (One bad input in
    five left the rate judged at ~40 candidate answers at or under 0.1 in 4-8 % of
    runs.)"""
    model = "roll_err"
    with _serve(tmp_path, shared_triton, model, "python") as gw:
        url = f"http://{gw.http_url}"
        load = Load(url, model, "http", bad_every=1).start()
        rollout = {"steps": [20, 100], "step_seconds": 60, "min_requests": 40,
                   "agreement_samples": 0, "shadow": "none"}  # the steps' own verdict
        # converts cleanly: it fails only in production
        answer = _roll(url, model, erroring_onnx(tmp_path / "v2.onnx"), rollout, CALM)
        done = finished(url, answer["id"])
        load.stop(more=30)
        assert done["state"] == "failed", done
        assert "rolled back at step 1 (20%)" in done["error"] and "error rate" in done["error"]
        record = done["rollout"]
        assert record["state"] == "rolled_back"
        verdict = record["decisions"][-1]
        assert verdict["decision"] == "rollback" and verdict["candidate"]["error_rate"] == 1.0
        shown = show(url, model)
        assert shown["serving_version"] == 1 and _servable(shown) == [1]
        failures = [a for a in load.answers if not a[1]]
        assert failures, "the candidate answered some requests"
        first, last = failures[0][0], failures[-1][0]
        in_step = len(load.between(first, last))
        expected = 0.2 * in_step  # every request the step gives the candidate fails
        assert len(failures) <= expected + 3 * math.sqrt(expected) + 2, (len(failures),
                                                                        in_step)
        assert all(ok and s == 2.0 for _, ok, s in load.answers[-30:])  # stable alone


def test_slow_version_rolled_back_on_p99_when_latency_triples(
    shared_triton: tuple[Path, Any], tmp_path: Path
) -> None:
    model = "roll_slow"
    with _serve(tmp_path, shared_triton, model, "haproxy") as gw:
        url = f"http://{gw.http_url}"
        load = Load(url, model, "http").start()
        rollout = {"steps": [50, 100], "step_seconds": 60, "min_requests": 30,
                   "max_p99_ratio": 1.3, "p99_tolerance_ms": 3, "agreement_samples": 0,
                   "shadow": "none"}  # the steps' own verdict
        answer = _roll(url, model, slow_onnx(tmp_path / "v2.onnx"), rollout)
        done = finished(url, answer["id"])
        load.stop()
        assert done["state"] == "failed" and "p99" in done["error"], done
        verdict = done["rollout"]["decisions"][-1]
        assert verdict["decision"] == "rollback" and verdict["p99_ratio"] > 1.3
        assert load.failures == 0  # slow, not failing
        assert show(url, model)["serving_version"] == 1


def _servable(shown: dict[str, Any]) -> list[int]:
    """The versions that can serve (a rolled-back one may keep its record)."""
    return [v["version"] for v in shown["versions"] if v.get("state") in ("available",
                                                                         "serving")]


def _loads(url: str, grpc_url: str, model: str) -> list[Load]:
    return [Load(url, model, "http").start(), Load(grpc_url, model, "grpc").start()]


def _stable_answered_all(loads: list[Load]) -> None:
    """Every user answer came from stable (version 1, slope 2), none failed."""
    for load in loads:
        assert load.failures == 0, load.proto
        assert set(load.versions) == {"1"}, (load.proto, set(load.versions))
        assert {s for _, _, s in load.answers} == {2.0}, load.proto


@pytest.mark.parametrize("data_plane", ["haproxy", "python"])
def test_wrong_version_rejected_at_gate_without_answering_a_user(
    shared_triton: tuple[Path, Any], tmp_path: Path, data_plane: str
) -> None:
    """y = -2x + 1 disagrees on the owner's samples: the gate rolls it back before the
    shadow step or any step, while clients on HTTP and gRPC get stable's answers."""
    model = f"roll_gate_{data_plane}"
    with _serve(tmp_path, shared_triton, model, data_plane) as gw:
        url = f"http://{gw.http_url}"
        loads = _loads(url, gw.grpc_url, model)
        rollout = {"steps": [50, 100], "step_seconds": 1, "min_requests": 5}
        answer = _roll(url, model, flipped_onnx(tmp_path / "v2.onnx"), rollout)
        done = finished(url, answer["id"])
        for load in loads:
            load.stop()
        assert done["state"] == "failed" and "rejected at the gate" in done["error"], done
        assert "agreement" in done["error"]
        decisions = done["rollout"]["decisions"]
        assert [(d["step"], d["decision"]) for d in decisions] == [("gate", "rollback")]
        gate = decisions[0]
        assert gate["agreement"] < 0.99 and gate["percent"] == 0 and gate["samples"] == 32
        _stable_answered_all(loads)
        assert "gate" in " ".join(_cli(url, "rollout", "status", model).split())


@pytest.mark.parametrize("data_plane", ["haproxy", "python"])
def test_version_agreeing_on_samples_not_live_rejected_in_shadow_step(
    shared_triton: tuple[Path, Any], tmp_path: Path, data_plane: str
) -> None:
    """A version equal to stable on the owner's samples (x in [0, 0.8)) but not on live
    inputs beyond them (x[0] = 0.9, one request in five): the gate passes it, the shadow
    step compares mirrored answers with stable's and rolls it back; every user answer
    came from stable."""
    model = f"roll_live_{data_plane}"
    with _serve(tmp_path, shared_triton, model, data_plane) as gw:
        url = f"http://{gw.http_url}"
        loads = _loads(url, gw.grpc_url, model)
        rollout = {"steps": [50, 100], "step_seconds": 2, "min_requests": 10,
                   "shadow": {"percent": 50, "seconds": 2, "min_requests": 10}}
        answer = _roll(url, model, diverging_onnx(tmp_path / "v2.onnx"), rollout, CALM)
        done = finished(url, answer["id"])
        for load in loads:
            load.stop()
        assert done["state"] == "failed" and "shadow step" in done["error"], done
        decisions = done["rollout"]["decisions"]
        assert [(d["step"], d["decision"]) for d in decisions] == [("gate", "promote"),
                                                                   ("shadow", "rollback")]
        gate, shadow = decisions
        assert gate["agreement"] > 0.99  # the owner's samples cannot tell
        assert shadow["agreement"] < 0.99 and shadow["candidate"]["requests"] >= 10
        assert shadow["mirror_percent"] == 50
        _stable_answered_all(loads)
        assert show(url, model)["serving_version"] == 1


def _versions_seen(url: str, grpc_url: str, model: str, n: int,
                   version: str = "") -> tuple[list[float], list[float]]:
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    body = {"inputs": [{"name": "x", "shape": [1, TINY_WIDTH], "datatype": "FP32",
                        "data": [0.5] * TINY_WIDTH}]}
    with httpx.Client(timeout=30) as keep_alive:  # one connection, as clients do
        http = [_slope(np.array(keep_alive.post(f"{url}{path}", json=body)
                                .json()["outputs"][0]["data"])) for _ in range(n)]
    client = grpcclient.InferenceServerClient(grpc_url)
    item = grpcclient.InferInput("x", [1, TINY_WIDTH], "FP32")
    item.set_data_from_numpy(np.full((1, TINY_WIDTH), 0.5, np.float32))
    grpc = [_slope(client.infer(model, [item], model_version=version).as_numpy("y"))
            for _ in range(n)]
    client.close()
    return http, grpc


def _cli(url: str, *args: str) -> str:
    result = CliRunner().invoke(models_app, [*args, "--url", url, "--token", TOKENS["admin"]])
    assert result.exit_code == 0, result.output
    return result.output


def _stable_alone(url: str, grpc_url: str, model: str, shared: tuple[Path, Any]) -> None:
    """Version 1 serves every request, alone in Triton; version 2 is gone."""
    repo, endpoints = shared
    shown = show(url, model)
    assert shown["serving_version"] == 1 and _servable(shown) == [1]
    assert not (repo / model / "2").exists()
    loaded = httpx.get(f"http://{endpoints.host}:{endpoints.http_port}/v2/models/{model}")
    assert loaded.json()["versions"] == ["1"]
    http, grpc = _versions_seen(url, grpc_url, model, 20)
    assert set(http) == set(grpc) == {2.0}


@pytest.mark.parametrize(("data_plane", "ending"), [("haproxy", "restart"),
                                                    ("python", "abort")])
def test_split_serves_both_versions_until_rollout_ends_on_stable(
    shared_triton: tuple[Path, Any], tmp_path: Path, data_plane: str, ending: str
) -> None:
    """At a 50 % step, unversioned requests get either version on both protocols,
    versioned ones their own; pause holds it, a second upload and a rollback are 409.
    Then the rollout ends with stable alone: by abort, or by a gateway restarted in the
    middle of it (recorded interrupted, the candidate removed)."""
    model = f"roll_split_{data_plane}"
    config = _gateway(tmp_path, shared_triton, model)
    with run_gateway(config, tmp_path, data_plane=data_plane) as gw:
        url = f"http://{gw.http_url}"
        rollout = {"steps": [50, 100], "step_seconds": 3600, "min_requests": 10,
                   "shadow": "none"}
        answer = _roll(url, model, affine_onnx(tmp_path / "v2.onnx", 2.1), rollout)
        assert wait_until(lambda: job(url, answer["id"])["state"] == "rolling_out"
                          and _percent(url, model) == 50, 120, 0.1)
        # at once: a step is on record only once both planes route by it
        http, grpc = _versions_seen(url, gw.grpc_url, model, 60)
        assert "paused" in _cli(url, "rollout", "pause", model)
        for seen in (http, grpc):
            assert set(seen) == {2.0, 2.1}
            assert 0.2 <= seen.count(2.1) / len(seen) <= 0.8, seen
        for version, slope in (("1", 2.0), ("2", 2.1)):  # a named version is served as named
            http, grpc = _versions_seen(url, gw.grpc_url, model, 5, version)
            assert set(http) == set(grpc) == {slope}
        again = httpx.post(f"{url}/v1/models/{model}/versions", headers=bearer("upload"),
                           files={"model": ("m.onnx", b"x"), "spec": ("s.json", "{}")})
        assert again.status_code == 409
        refused = httpx.post(f"{url}/v1/models/{model}/rollback", headers=bearer("admin"))
        assert refused.status_code == 409 and "abort the rollout" in refused.json()["error"]
        forbidden = httpx.post(f"{url}/v1/models/{model}/rollout/abort",
                               headers=bearer("upload"))
        assert forbidden.status_code == 403
        status = " ".join(_cli(url, "rollout", "status", model).split())  # unwrapped
        assert "paused version 2 beside 1: step 1 of 2 [50, 100], 50% to the candidate" \
            in status
        if ending == "abort":
            _cli(url, "rollout", "abort", model)
            done = finished(url, answer["id"])
            assert done["state"] == "failed" and "aborted by admin" in done["error"]
            assert done["rollout"]["state"] == "aborted"
            _stable_alone(url, gw.grpc_url, model, shared_triton)
            return
    with run_gateway(config, tmp_path, data_plane=data_plane) as gw:  # restarted
        url = f"http://{gw.http_url}"
        record = _rollout(url, model)
        assert record["state"] == "interrupted" and "stable version 1 serves" in \
            record["detail"]
        assert job(url, answer["id"])["state"] == "failed"
        _stable_alone(url, gw.grpc_url, model, shared_triton)
