"""Faults under load, real Triton processes on loopback, both data planes:

- a member hung (SIGSTOP): no request waits past its deadline (clients send deadlines),
  the member is ejected, traffic carries on over the other, and it is back after SIGCONT;
- the gateway SIGTERMed under load: every request it had taken finishes successfully;
- the gateway SIGKILLed during an upload: nothing lands in the repository, and the
  restarted gateway reports the job failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc.aio as grpcaio
from prometheus_client.parser import text_string_to_metric_families

from converters.tiny import TINY_MODEL_NAME, TINY_WIDTH, build_tiny_model
from gateway.lifecycle.service import RESTART_REASON
from infergate.triton.local import LocalTriton
from tests.conftest import triton_settings
from tests.gateway.lifecycle.conftest import (
    TINY_SPEC,
    bearer,
    job,
    lifecycle_config,
    tiny_samples,
    tree,
)
from tests.procs import (
    GatewayProcess,
    end_in_background,
    pools_yaml,
    run_gateway,
    started_triton,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]
DEADLINE_S = 1.0
SLACK_S = 1.5  # scheduling on a loaded 2-core machine, on top of the deadline
REFUSAL_WINDOW_S = 1.0  # sent this close to SIGTERM, a request may not have been read yet
# (a loaded 2-core machine can leave a process unscheduled for hundreds of ms)
X = np.ones((1, TINY_WIDTH), np.float32)
BODY = {"inputs": [{"name": "x", "shape": [1, TINY_WIDTH], "datatype": "FP32",
                    "data": X.ravel().tolist()}]}


def member_health(http_url: str) -> dict[str, float]:
    text = httpx.get(f"http://{http_url}/metrics").text
    return {s.labels["member"]: s.value
            for f in text_string_to_metric_families(text) if f.name == "infergate_member_healthy"
            for s in f.samples}


@dataclass
class Outcome:
    started: float
    elapsed_s: float
    answer: str  # "200", "504", "OK", "DEADLINE_EXCEEDED", "conn: ..."


@dataclass
class Load:
    """Workers sending requests with a deadline back to back until stopped."""

    http_url: str
    grpc_url: str
    outcomes: list[Outcome] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def http_worker(self) -> None:
        async with httpx.AsyncClient(timeout=DEADLINE_S + 2 * SLACK_S, trust_env=False) as client:
            while not self.stop.is_set():
                started = time.monotonic()
                try:
                    resp = await client.post(
                        f"http://{self.http_url}/v2/models/{TINY_MODEL_NAME}/infer", json=BODY,
                        headers={"x-request-timeout-ms": str(int(DEADLINE_S * 1000))})
                    answer = str(resp.status_code)
                except httpx.HTTPError as exc:
                    answer = f"conn: {exc!r}"
                self.outcomes.append(Outcome(started, time.monotonic() - started, answer))
                await asyncio.sleep(0.002)

    async def grpc_worker(self) -> None:
        client = grpcaio.InferenceServerClient(self.grpc_url)
        inp = grpcaio.InferInput("x", list(X.shape), "FP32")
        inp.set_data_from_numpy(X)
        try:
            while not self.stop.is_set():
                started = time.monotonic()
                try:
                    await client.infer(TINY_MODEL_NAME, [inp], client_timeout=DEADLINE_S)
                    answer = "OK"
                except Exception as exc:  # noqa: BLE001 - every answer is recorded
                    status = getattr(exc, "status", lambda: None)()
                    answer = str(status).removeprefix("StatusCode.") if status else repr(exc)
                self.outcomes.append(Outcome(started, time.monotonic() - started, answer))
                await asyncio.sleep(0.002)
        finally:
            await client.close()

    async def run(self, workers: int = 3) -> None:
        await asyncio.gather(*(w() for _ in range(workers)
                               for w in (self.http_worker, self.grpc_worker)))


@contextlib.contextmanager
def background_load(gw: GatewayProcess, workers: int = 3) -> Iterator[Load]:
    loop = asyncio.new_event_loop()
    load = Load(gw.http_url, gw.grpc_url)
    load.stop = asyncio.Event()
    thread = threading.Thread(target=lambda: loop.run_until_complete(load.run(workers)))
    thread.start()
    try:
        yield load
    finally:
        loop.call_soon_threadsafe(load.stop.set)
        thread.join(60)
        loop.close()


def _count_since(load: Load, start: float) -> int:
    return sum(1 for o in load.outcomes if o.started >= start)


def _count_before(load: Load, end: float) -> int:
    return sum(1 for o in load.outcomes if o.started < end)


def test_hung_member_costs_no_request_its_deadline_and_is_ejected_then_back(
    tiny_repo: Path, tmp_path: Path, data_plane: str,
) -> None:
    a = LocalTriton(triton_settings(tiny_repo, tmp_path / "a", TINY_MODEL_NAME))
    b = LocalTriton(triton_settings(tiny_repo, tmp_path / "b", TINY_MODEL_NAME))
    try:
        ea, eb = a.start(), b.start()
        hung = f"{ea.host}:{ea.grpc_port}"
        pools = pools_yaml(tmp_path / "pools.yaml", {"pair": [ea, eb]})
        with run_gateway(pools, tmp_path, data_plane=data_plane) as gw, \
                background_load(gw) as load:
            assert wait_until(lambda: _count_since(load, 0) > 50, 30, 0.05)
            os.kill(a.pid or 0, signal.SIGSTOP)
            stopped_at = time.monotonic()
            try:
                assert wait_until(lambda: member_health(gw.http_url).get(hung) == 0.0, 20, 0.2), \
                    "the hung member was never ejected"
                ejected_at = time.monotonic()
                # once ejected, traffic carries on over the other member
                assert wait_until(lambda: _count_since(load, ejected_at + 1.0) > 50, 30, 0.05)
            finally:
                os.kill(a.pid or 0, signal.SIGCONT)
            assert wait_until(lambda: member_health(gw.http_url).get(hung) == 1.0, 30, 0.2), \
                "the member never came back after SIGCONT"
            back_at = time.monotonic()
            assert wait_until(lambda: _count_since(load, back_at) > 50, 30, 0.05)
        outcomes = list(load.outcomes)
        late = [o for o in outcomes if o.elapsed_s > DEADLINE_S + SLACK_S]
        assert not late, f"{len(late)} requests waited past their deadline: {late[:5]}"
        failed = [o for o in outcomes if o.answer not in ("200", "OK")]
        assert all(o.answer in ("504", "DEADLINE_EXCEEDED") for o in failed), failed[:5]
        # in flight on the member when it stopped, or sent to it until it was ejected
        outside = [(round(o.started - stopped_at, 2), o.answer) for o in failed
                   if not stopped_at - 0.5 <= o.started <= ejected_at + 1.0]
        assert not outside, f"failed outside the hang (s after SIGSTOP; ejected after " \
                            f"{ejected_at - stopped_at:.2f} s): {outside[:5]}"
        after = [o for o in outcomes if o.started > ejected_at + 1.0]
        assert after and all(o.answer in ("200", "OK") for o in after)
        stats = httpx.get(f"http://{ea.http_url}/v2/models/{TINY_MODEL_NAME}/stats").json()
        assert stats["model_stats"][0]["inference_count"] > 0
    finally:
        for server in (a, b):
            with contextlib.suppress(ProcessLookupError, TypeError):
                os.kill(server.pid or 0, signal.SIGCONT)
        end_in_background(a, b)


def test_sigterm_under_load_fails_no_request_the_gateway_had_taken(
    tiny_repo: Path, tmp_path: Path, data_plane: str,
) -> None:
    with started_triton(triton_settings(tiny_repo, tmp_path, TINY_MODEL_NAME)) as triton:
        assert triton.endpoints is not None
        pools = pools_yaml(tmp_path / "pools.yaml", {"local": [triton.endpoints]})
        with run_gateway(pools, tmp_path, data_plane=data_plane) as gw, \
                background_load(gw, workers=4) as load:
            assert wait_until(lambda: _count_before(load, time.monotonic() - 2 * REFUSAL_WINDOW_S)
                              > 100, 30, 0.05)
            gw.proc.send_signal(signal.SIGTERM)
            term_at = time.monotonic()
            assert gw.proc.wait(60) == 0
        outcomes = list(load.outcomes)
    # taken: sent well before SIGTERM (each takes milliseconds), so the gateway had it;
    # one sent in the last moments may be refused instead (not yet read when the
    # listeners closed: a connection error, UNAVAILABLE, or CANCELLED when HAProxy resets
    # a gRPC stream opened on a connection it is closing), but never answered wrongly
    taken = [o for o in outcomes if o.started < term_at - REFUSAL_WINDOW_S]
    assert len(taken) > 100
    failed = [o for o in taken if o.answer not in ("200", "OK")]
    assert not failed, f"{len(failed)} requests taken before SIGTERM failed: {failed[:5]}"
    refused = ("conn:", "UNAVAILABLE", "CANCELLED", "503")
    wrong = [o for o in outcomes if o.answer not in ("200", "OK")
             and not o.answer.startswith(refused)]
    assert not wrong, wrong[:5]


def _slow_upload(url: str, release: threading.Event, result: list[object]) -> None:
    """An upload whose body stops half-way until ``release`` is set."""
    request = httpx.Request("POST", f"{url}/v1/models/{TINY_MODEL_NAME}/versions", files={
        "model": ("model.onnx", b"\0" * (256 << 10)),
        "spec": ("spec.json", json.dumps(TINY_SPEC)),
        "evaluation": ("evaluation.npz", tiny_samples(8, 1))}, headers=bearer("upload"))
    body = request.read()

    def chunks() -> Iterator[bytes]:
        yield body[: len(body) // 2]
        release.wait(60)
        yield body[len(body) // 2:]

    try:
        result.append(httpx.post(request.url, content=chunks(), headers=dict(request.headers),
                                 timeout=60).status_code)
    except httpx.HTTPError as exc:
        result.append(exc)


def test_gateway_killed_during_upload_leaves_repository_whole_and_job_failed(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "model_repo"
    build_tiny_model(repo)
    with started_triton(triton_settings(repo, tmp_path, TINY_MODEL_NAME)) as triton:
        assert triton.endpoints is not None
        config = lifecycle_config(tmp_path / "gateway.yaml", {"local": [triton.endpoints]},
                                  repo)
        jobs_dir = tmp_path / "state" / "jobs"
        before = tree(repo)
        release, result = threading.Event(), list[object]()
        with run_gateway(config, tmp_path) as gw:
            url = f"http://{gw.http_url}"
            sender = threading.Thread(target=_slow_upload, args=(url, release, result))
            sender.start()
            try:
                assert wait_until(lambda: jobs_dir.exists() and any(jobs_dir.iterdir()), 30,
                                  0.05), "the upload never started"
                job_id = next(jobs_dir.iterdir()).name
                assert job(url, job_id)["state"] == "receiving"
                gw.proc.kill()  # SIGKILL while the body is half-way
                gw.proc.wait(10)
            finally:
                release.set()
                sender.join(60)
        assert tree(repo) == before, "the killed upload left files in the repository"
        # the same command again: it adopts the HAProxy the crash left serving
        with run_gateway(config, tmp_path, ports=(gw.http_port, gw.grpc_port)) as gw:
            url = f"http://{gw.http_url}"
            reported = job(url, job_id)
            assert reported["state"] == "failed"
            assert RESTART_REASON in str(reported.get("error"))
            assert tree(repo) == before
