"""Trace and log settings over HTTP and gRPC through the gateway (fanned out to every
member concerned, partial failures reported) and the repository index's body, against
real Triton servers on both data planes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from converters.decoupled import DECOUPLED_MODEL_NAME, build_decoupled_model
from converters.tiny import TINY_MODEL_NAME, build_tiny_model
from infergate.triton.local import LocalTriton, TritonEndpoints, free_ports
from tests.conftest import triton_settings
from tests.procs import GatewayProcess, pools_yaml, run_gateway, started_triton

pytestmark = pytest.mark.integration


def _clients(url_http: str, url_grpc: str) -> tuple[Any, Any]:
    return httpclient.InferenceServerClient(url_http), grpcclient.InferenceServerClient(url_grpc)


def test_settings_read_like_triton_when_http_and_grpc_clients(
    gateway: GatewayProcess, triton: LocalTriton,
) -> None:
    assert triton.endpoints is not None
    via = _clients(gateway.http_url, gateway.grpc_url)
    direct = _clients(triton.endpoints.http_url, triton.endpoints.grpc_url)
    for client_via, client_direct in zip(via, direct, strict=True):
        grpc_kw: dict[str, Any] = {} if client_via is via[0] else {"as_json": True}
        assert client_via.get_trace_settings(**grpc_kw) == client_direct.get_trace_settings(
            **grpc_kw)
        assert client_via.get_trace_settings(DECOUPLED_MODEL_NAME, **grpc_kw) == \
            client_direct.get_trace_settings(DECOUPLED_MODEL_NAME, **grpc_kw)
        assert client_via.get_log_settings(**grpc_kw) == client_direct.get_log_settings(
            **grpc_kw)
    for client in (*via, *direct):
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_settings_update_reaches_member_when_posted_through_gateway(
    gateway: GatewayProcess, triton: LocalTriton, protocol: str,
) -> None:
    assert triton.endpoints is not None
    via = _clients(gateway.http_url, gateway.grpc_url)[protocol == "grpc"]
    direct = httpclient.InferenceServerClient(triton.endpoints.http_url)
    before = direct.get_log_settings()["log_verbose_level"]
    rate_before = direct.get_trace_settings()["trace_rate"]
    try:
        via.update_log_settings({"log_verbose_level": before + 1})
        assert direct.get_log_settings()["log_verbose_level"] == before + 1
        via.update_trace_settings(settings={"trace_rate": "7"})
        assert direct.get_trace_settings()["trace_rate"] == "7"
        # Triton's own refusal (a trace level without a trace file) comes back as it is
        with pytest.raises(InferenceServerException, match="trace file name is not given"):
            via.update_trace_settings(DECOUPLED_MODEL_NAME, {"trace_level": ["TIMESTAMPS"]})
    finally:
        direct.update_log_settings({"log_verbose_level": before})
        direct.update_trace_settings(settings={"trace_rate": rate_before})
        via.close()
        direct.close()


def test_settings_unknown_model_answers_like_triton_when_http(
    gateway: GatewayProcess, triton: LocalTriton,
) -> None:
    assert triton.endpoints is not None
    path = "/v2/models/no_such_model/trace/setting"
    body = json.dumps({"trace_rate": "10"})
    via = httpx.post(f"http://{gateway.http_url}{path}", content=body)
    direct = httpx.post(f"http://{triton.endpoints.http_url}{path}", content=body)
    assert (via.status_code, via.json()) == (direct.status_code, direct.json())


@pytest.fixture(scope="module")
def index_triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTriton]:
    """A Triton whose repository holds two models, only one of them loaded."""
    tmp = tmp_path_factory.mktemp("index-triton")
    repo = tmp / "repo"
    build_decoupled_model(repo)
    build_tiny_model(repo)
    with started_triton(triton_settings(repo, tmp, DECOUPLED_MODEL_NAME)) as server:
        yield server


@pytest.fixture
def gateway_with_dead_member(index_triton: LocalTriton, data_plane: str,
                             tmp_path: Path) -> Iterator[tuple[GatewayProcess, str]]:
    assert index_triton.endpoints is not None
    dead = TritonEndpoints("127.0.0.1", *free_ports(3))
    pools = pools_yaml(tmp_path / "pools.yaml", {"mixed": [index_triton.endpoints, dead]})
    with run_gateway(pools, tmp_path, data_plane=data_plane) as gw:
        yield gw, f"{dead.host}:{dead.grpc_port}"


def test_settings_report_partial_failure_when_a_member_is_down(
    gateway_with_dead_member: tuple[GatewayProcess, str], index_triton: LocalTriton,
) -> None:
    gw, dead_key = gateway_with_dead_member
    assert index_triton.endpoints is not None
    direct = httpclient.InferenceServerClient(index_triton.endpoints.http_url)
    before = direct.get_log_settings()["log_verbose_level"]
    resp = httpx.post(f"http://{gw.http_url}/v2/logging",
                      json={"log_verbose_level": before + 1})
    assert resp.status_code == 503
    assert resp.json()["error"].startswith("applied on 1 of 2 members")
    assert dead_key in resp.json()["error"]
    assert direct.get_log_settings()["log_verbose_level"] == before + 1  # the live one did
    client = grpcclient.InferenceServerClient(gw.grpc_url)
    with pytest.raises(InferenceServerException, match="applied on 1 of 2 members") as caught:
        client.get_trace_settings()
    assert caught.value.status() == "StatusCode.UNAVAILABLE"
    client.close()
    direct.close()


def test_repository_index_honours_ready_when_a_model_is_not_loaded(
    gateway_with_dead_member: tuple[GatewayProcess, str], index_triton: LocalTriton,
) -> None:
    gw, _ = gateway_with_dead_member
    url = f"http://{gw.http_url}/v2/repository/index"
    every = {m["name"] for m in httpx.post(url, content="{}").json()}
    ready = httpx.post(url, json={"ready": True}).json()
    assert every == {DECOUPLED_MODEL_NAME, TINY_MODEL_NAME}
    assert [m["name"] for m in ready] == [DECOUPLED_MODEL_NAME]
    with grpc.insecure_channel(gw.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        every_grpc = stub.RepositoryIndex(service_pb2.RepositoryIndexRequest())
        ready_grpc = stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(ready=True))
    assert {m.name for m in every_grpc.models} == every
    assert [m.name for m in ready_grpc.models] == [DECOUPLED_MODEL_NAME]


@pytest.mark.parametrize("body", ["{not json", "[]", '{"ready": "yes"}', '{"redy": true}'])
def test_repository_index_refuses_body_when_malformed(
    gateway: GatewayProcess, body: str,
) -> None:
    resp = httpx.post(f"http://{gateway.http_url}/v2/repository/index", content=body)
    assert resp.status_code == 400
    assert resp.headers["content-type"] == "application/json"
    assert "repository index" in resp.json()["error"]


def test_settings_reach_every_member_when_pool_has_two(
    triton: LocalTriton, index_triton: LocalTriton, data_plane: str, tmp_path: Path,
) -> None:
    assert triton.endpoints is not None and index_triton.endpoints is not None
    members = [triton.endpoints, index_triton.endpoints]
    directs = [httpclient.InferenceServerClient(e.http_url) for e in members]
    before = [d.get_trace_settings()["trace_rate"] for d in directs]
    pools = pools_yaml(tmp_path / "pools.yaml", {"both": members})
    try:
        with run_gateway(pools, tmp_path, data_plane=data_plane) as gw:
            via = grpcclient.InferenceServerClient(gw.grpc_url)
            via.update_trace_settings(settings={"trace_rate": "11"})
            via.close()
            assert [d.get_trace_settings()["trace_rate"] for d in directs] == ["11", "11"]
            resp = httpx.post(f"http://{gw.http_url}/v2/trace/setting",
                              json={"trace_rate": "12"})
            assert resp.status_code == 200 and resp.json()["trace_rate"] == "12"
            assert [d.get_trace_settings()["trace_rate"] for d in directs] == ["12", "12"]
    finally:
        for direct, rate in zip(directs, before, strict=True):
            direct.update_trace_settings(settings={"trace_rate": rate})
            direct.close()
