"""The Kubernetes split on one machine, with real processes: one control plane, two
data-plane replicas (HAProxy + agent each), two Triton members sharing one repository.
An upload through replica A becomes routable through replica B without a restart;
killing the control plane leaves both replicas serving (inference, an open stream and
new ones, health, metadata), its own calls answered at once saying it is away;
restarting it resumes."""

from __future__ import annotations

import queue
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from converters.tiny import TINY_WIDTH, tiny_onnx
from gateway.haproxy.answers import CONTROL_DOWN
from infergate.processes import AgentProcess, run_agent
from infergate.triton.local import LocalTriton, free_ports
from tests.conftest import triton_settings
from tests.gateway.conftest import tiny_infers_over_grpc
from tests.gateway.lifecycle.conftest import (
    TINY_SPEC,
    TOKENS,
    bearer,
    finished,
    infer_body,
    job,
    lifecycle_config,
    tiny_samples,
    upload,
)
from tests.procs import end_in_background, run_gateway, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _feed_version(http_url: str) -> str:
    return str(httpx.get(f"http://{http_url}/v1/dataplane/snapshot",
                         headers=bearer("admin")).json()["version"])


def _member_info(status_port: int) -> dict[tuple[str, str, str], float]:
    text = httpx.get(f"http://127.0.0.1:{status_port}/metrics").text
    return {(s.labels["member"], s.labels["version"], s.labels["grpc_connections"]): s.value
            for family in text_string_to_metric_families(text)
            if family.name == "infergate_member_info" for s in family.samples}


class _Stream:
    """One open ``ModelStreamInfer`` stream of tritonclient through a gateway: each
    :meth:`infers` sends ``x = 1`` to ``model`` on it and waits for its ``y``."""

    def __init__(self, grpc_url: str, model: str) -> None:
        self.model = model
        self.answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.client = grpcclient.InferenceServerClient(grpc_url)
        self.client.start_stream(callback=lambda result, error: self.answers.put(
            (result, error)))

    def infers(self) -> bool:
        x = np.ones((1, TINY_WIDTH), np.float32)
        inp = grpcclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        self.client.async_stream_infer(self.model, [inp])
        result, error = self.answers.get(timeout=10)
        return error is None and bool(result.as_numpy("y")[0][0] == 3.0)

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


def _serves_alone(agent: AgentProcess, model: str) -> None:
    """What a replica serves by itself: health and readiness, server and model
    metadata (HTTP and gRPC), a new stream."""
    url = f"http://{agent.http_url}"
    assert httpx.get(f"{url}/v2/health/ready").status_code == 200
    assert httpx.get(f"{url}/v2").json()["name"] == "triton"
    assert httpx.get(f"{url}/v2/models/{model}").json()["name"] == model
    assert httpx.get(f"{url}/v2/models/{model}/ready").status_code == 200
    client = grpcclient.InferenceServerClient(agent.grpc_url)
    try:
        assert client.is_server_ready() and client.is_model_ready(model)
        assert client.get_model_metadata(model).name == model
    finally:
        client.close()
    stream = _Stream(agent.grpc_url, model)
    try:
        assert stream.infers()
    finally:
        stream.close()


def _infers(http_url: str, model: str) -> bool:
    answer = httpx.post(f"http://{http_url}/v2/models/{model}/infer", json=infer_body())
    return answer.status_code == 200 and answer.json()["outputs"][0]["data"][0] == 3.0


def test_replicas_follow_control_plane_and_outlive_it_when_split(tmp_path: Path) -> None:
    repo = tmp_path / "model_repo"
    repo.mkdir()
    a = LocalTriton(triton_settings(repo, tmp_path / "ta"))
    b = LocalTriton(triton_settings(repo, tmp_path / "tb"))
    try:
        ea, eb = a.start(), b.start()
        config = lifecycle_config(tmp_path / "gateway.yaml", {"cpu": [ea, eb]}, repo)
        http_port, grpc_port = free_ports(2)
        ports = (http_port, grpc_port)
        # B's state folder is too long for HAProxy's sockets: its files go to a temporary
        # folder, removed when it stops
        long_state = tmp_path / ("agent-b-" + "b" * 60)
        with run_gateway(config, tmp_path, data_plane="none", ports=ports) as control, \
                run_agent(control, tmp_path / "agent-a", TOKENS["admin"]) as agent_a, \
                run_agent(control, long_state, TOKENS["admin"]) as agent_b:
            moved = Path(str(agent_b.status()["haproxy_run_dir"]))
            assert not moved.is_relative_to(long_state) and (moved / "haproxy.cfg").exists()
            # an upload through replica A (HAProxy forwards /v1 to the control plane)
            model = tiny_onnx(tmp_path / "model.onnx")
            accepted = upload(f"http://{agent_a.http_url}", "owned", model, TINY_SPEC,
                              tiny_samples(8, 1))
            done = finished(f"http://{agent_b.http_url}", accepted["id"])
            assert done["state"] == "succeeded", done
            # routable through replica B, which follows the same snapshot
            assert _infers(agent_b.http_url, "owned")
            assert tiny_infers_over_grpc(agent_b.grpc_url, "owned")
            # both on the control plane's snapshot, read at each try: a probe round may move
            # it meanwhile (it measures the service time of the requests above), and the
            # replicas then follow a version a first read would never see again
            assert wait_until(lambda: agent_a.status()["version"] == agent_b.status()["version"]
                              == _feed_version(control.http_url), 10)
            # each replica decides the gRPC connections from the versions the control
            # plane read: this machine's Triton lacks the fix for server#8034
            triton_version = httpx.get(f"http://{ea.http_url}/v2").json()["version"]
            for agent in (agent_a, agent_b):
                assert _member_info(agent.status_port) == {
                    (member.grpc_url, triton_version, "per_request"): 1.0
                    for member in (ea, eb)}

            opened = _Stream(agent_a.grpc_url, "owned")  # a stream open across the loss
            assert opened.infers()
            control.proc.send_signal(signal.SIGKILL)
            control.proc.wait(10)
            assert opened.infers()  # it never went through the control plane
            opened.close()
            # the snapshot may have moved since (a probe round measures the service time
            # of the requests above): each replica keeps the last one it had
            last = {agent.status_port: agent.status()["version"] for agent in (agent_a, agent_b)}
            for agent in (agent_a, agent_b):  # both keep routing on their last snapshot
                assert _infers(agent.http_url, "owned"), agent.log.read_text()[-1500:]
                assert tiny_infers_over_grpc(agent.grpc_url, "owned")
                assert agent.status()["version"] == last[agent.status_port] != ""
                ready = httpx.get(f"http://127.0.0.1:{agent.status_port}/ready")
                assert ready.status_code == 200  # the replica stays in its Service
                _serves_alone(agent, "owned")
            started = time.monotonic()
            down = httpx.get(f"http://{agent_a.http_url}/v1/jobs/{accepted['id']}",
                             headers=bearer("upload"))
            # the control plane's own call: at once, saying so (not blaming Triton)
            assert time.monotonic() - started < 1.5
            assert down.status_code == 503 and down.json()["error"] == CONTROL_DOWN
            client = grpcclient.InferenceServerClient(agent_b.grpc_url)
            try:
                with pytest.raises(InferenceServerException) as refused:
                    client.get_model_repository_index()
            finally:
                client.close()
            assert refused.value.status() == "StatusCode.UNAVAILABLE"
            assert refused.value.message() == CONTROL_DOWN

            with run_gateway(config, tmp_path, data_plane="none", ports=ports):
                url_a = f"http://{agent_a.http_url}"
                assert wait_until(lambda: httpx.get(f"{url_a}/v2/health/ready")
                                  .status_code == 200, 30)
                assert job(url_a, accepted["id"])["state"] == "succeeded"  # told truthfully
                assert _infers(agent_b.http_url, "owned")
        assert not moved.exists()  # B stopped: its temporary folder with it
    finally:
        end_in_background(a, b)
