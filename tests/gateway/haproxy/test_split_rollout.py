"""A rollout on the Kubernetes split, on one machine, with real processes: one control
plane, one data-plane replica (HAProxy + agent), one Triton. The control plane is killed
(SIGKILL) at the 50 % step and restarted with the same command: the restarted process
knows the replica from before, moves it to stable and waits for its acknowledgement
before Triton unloads the candidate, and does not answer 503 for the model while its
preload runs. The control plane's verdict judges the requests the replica carries (its
reports). During the outage the candidate's lease runs out: within the replica's
--canary-lease of the loss, it sends every request to stable. Unversioned requests
through the replica never fail, and the job says the rollout was interrupted (issue 35: 2 and 6
requests had failed with "version 2 is not at ready state")."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from converters.tiny import build_tiny_model
from gateway.agent import LEASE_CHECK_S
from gateway.haproxy.feed import AGENTS_FILE
from gateway.haproxy.snapshot import LEASE_STEP_S
from infergate.processes import run_agent
from infergate.triton.local import LocalTriton, free_ports
from tests.conftest import triton_settings
from tests.gateway.lifecycle.conftest import (
    TINY_SPEC,
    TOKENS,
    affine_onnx,
    bearer,
    infer_body,
    job,
    lifecycle_config,
    slope_of,
    tiny_samples,
    upload,
)
from tests.procs import end_in_background, run_gateway, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]
MODEL = "canary"
LEASE = LEASE_STEP_S + 2  # the replica's --canary-lease: the shortest it takes, nearly


class Traffic:
    """Unversioned requests through the replica, one after another, until stopped."""

    def __init__(self, http_url: str) -> None:
        self.url = f"http://{http_url}/v2/models/{MODEL}/infer"
        self.answers: list[int] = []
        self.failures: list[str] = []
        self.slopes: list[tuple[float, float]] = []  # (when sent, the answering version's)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                sent = time.monotonic()
                try:
                    answer = client.post(self.url, json=infer_body())
                except httpx.HTTPError as exc:
                    self.failures.append(repr(exc))
                    continue
                self.answers.append(answer.status_code)
                if answer.status_code != 200:
                    self.failures.append(f"{answer.status_code} {answer.text[:200]}")
                else:
                    self.slopes.append((sent, slope_of(answer.json())))

    def candidate_answered(self, after: float) -> int:
        """Requests sent after ``after`` that version 2 (slope 2.1) answered."""
        return sum(1 for sent, slope in self.slopes if sent > after and slope > 2.05)


def _split(agent_dir: Path) -> list[int] | None:
    """The model's split in the snapshot the replica applied last (it saves each)."""
    try:
        routes = json.loads((agent_dir / "snapshot.json").read_text())["routes"]
    except (OSError, ValueError):
        return None
    return next((r["split"] for r in routes if r["model"] == MODEL), None)


def _window(control_url: str) -> dict[str, Any]:
    """The running step's windows per version, as the control plane's rollout has them."""
    status = httpx.get(f"{control_url}/v1/models/{MODEL}/rollout", headers=bearer("upload"))
    return dict(status.json().get("window") or {"stable": {"requests": 0},
                                                 "candidate": {"requests": 0}})


def _versions_loaded(triton_http: str) -> list[str]:
    answer = httpx.get(f"http://{triton_http}/v2/models/{MODEL}")
    return list(answer.json().get("versions", [])) if answer.status_code == 200 else []


def test_restart_mid_rollout_fails_no_request_through_the_replica(tmp_path: Path) -> None:
    repo = tmp_path / "model_repo"
    build_tiny_model(repo, MODEL)  # version 1, adopted as serving at start
    triton = LocalTriton(triton_settings(repo, tmp_path / "t"))
    try:
        endpoints = triton.start()
        config = lifecycle_config(tmp_path / "gateway.yaml", {"cpu": [endpoints]}, repo,
                                  models={MODEL: {"preload": True}})
        http_port, grpc_port = free_ports(2)
        ports = (http_port, grpc_port)
        with run_gateway(config, tmp_path, data_plane="none", ports=ports) as control, \
                run_agent(control, tmp_path / "agent", TOKENS["admin"], None,
                          "--canary-lease", str(LEASE)) as agent:
            url = f"http://{control.http_url}"
            accepted = upload(url, MODEL, affine_onnx(tmp_path / "v2.onnx", 2.1),
                              {**TINY_SPEC, "rollout": {
                                  "steps": [50, 100], "step_seconds": 3600,
                                  "min_requests": 10, "shadow": "none"}},
                              tiny_samples(32, 2))
            replica = tmp_path / "agent"
            assert wait_until(lambda: _split(replica) == [1, 2, 50], 180, 0.2), \
                job(url, accepted["id"])
            assert (tmp_path / "state" / AGENTS_FILE).exists()  # the replica is on file
            with Traffic(agent.http_url) as traffic:
                assert wait_until(lambda: len(traffic.answers) >= 20, 30)
                assert wait_until(lambda: traffic.candidate_answered(0.0) > 0, 30)
                # the verdict judges the traffic the replica carries (its reports)
                assert wait_until(lambda: all(_window(url)[v]["requests"] > 0
                                              for v in ("stable", "candidate")), 10), \
                    _window(url)
                control.proc.send_signal(signal.SIGKILL)
                lost = time.monotonic()
                control.proc.wait(10)
                # the outage: no verdict, so the candidate's lease runs out (LEASE after
                # the last one at most) and the replica sends everything to stable
                safe = lost + LEASE + LEASE_CHECK_S
                assert wait_until(lambda: sum(1 for sent, _ in traffic.slopes
                                              if sent > safe) >= 40, 60)
                assert traffic.candidate_answered(after=safe) == 0
                with run_gateway(config, tmp_path, data_plane="none", ports=ports) as again:
                    # the candidate goes, once the replica routes stable only
                    assert wait_until(lambda: _versions_loaded(endpoints.http_url) == ["1"],
                                      120, 0.2)
                    assert _split(replica) in (None, [1, 2, 0])
                    seen = len(traffic.answers)
                    assert wait_until(lambda: len(traffic.answers) >= seen + 40, 30)
                    ended = job(f"http://{again.http_url}", accepted["id"])
                    rollout = httpx.get(f"http://{again.http_url}/v1/models/{MODEL}/rollout",
                                        headers=bearer("upload")).json()
            assert traffic.failures == [], traffic.failures[:5]
            assert len(traffic.answers) >= 100
            assert (ended["state"], ended["error"]) == (
                "failed", "interrupted: the control plane restarted")
            assert rollout["state"] == "interrupted"
            assert rollout["detail"].startswith("interrupted: the control plane restarted")
    finally:
        end_in_background(triton)
