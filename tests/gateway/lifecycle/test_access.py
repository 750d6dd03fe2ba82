"""The auth matrix: every endpoint x every identity, over HTTP and gRPC, in-process.

Identities: no token, an unknown token, and tokens with the predict, upload and admin
scopes. Inference is token-gated here (``auth.predict: token``); one test checks the
open-predict configuration. Upstreams are mocked at the member boundary: only who gets
past the gateway's door is under test.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any
from unittest.mock import create_autospec

import grpc
import httpx
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from gateway.auth import TokenEntry, TokenTable
from gateway.config import GatewayConfig
from gateway.config.pools import MemberSpec, PoolSpec
from gateway.control.model_control import ModelControl
from gateway.lifecycle.intake.runner import JobRunner
from gateway.lifecycle.records.catalog import ModelCatalog
from gateway.lifecycle.records.jobs import JobRecord, ModelRecord
from gateway.lifecycle.service import ModelLifecycle
from gateway.python.forwarder import Forwarder
from gateway.python.grpc_api import create_grpc_server
from gateway.upstream.grpc import UpstreamGRPC
from gateway.upstream.http import UpstreamHTTP, UpstreamResponse
from gateway.upstream.triton import MemberAdmin
from tests.gateway.conftest import gateway_app

TOKENS = {"predict": "predict-token-0123456789", "upload": "upload-token-0123456789",
          "admin": "admin-token-0123456789ab"}
IDENTITIES = ("none", "unknown", "predict", "upload", "admin")
# who may call what: scope -> identities let through
ALLOWED = {"open": set(IDENTITIES), "predict": {"predict", "admin"},
           "upload": {"upload", "admin"}, "admin": {"admin"}}

HTTP_ENDPOINTS = [
    ("GET", "/v2/health/live", "open"),
    ("GET", "/v2/health/ready", "open"),
    ("GET", "/metrics", "open"),
    ("POST", "/v2/models/m/infer", "predict"),
    ("POST", "/v2/models/m/versions/1/infer", "predict"),
    ("POST", "/v2/models/m/generate", "predict"),
    ("POST", "/v2/models/m/versions/1/generate_stream", "predict"),
    ("GET", "/v2/trace/setting", "admin"),
    ("POST", "/v2/models/m/trace/setting", "admin"),
    ("POST", "/v2/logging", "admin"),
    ("GET", "/v2/models/m", "predict"),
    ("GET", "/v2/models/m/ready", "predict"),
    ("GET", "/v2/models/m/config", "predict"),
    ("GET", "/v2/models/m/stats", "predict"),
    ("POST", "/v2/repository/index", "admin"),
    ("POST", "/v2/repository/models/m/load", "admin"),
    ("POST", "/v2/repository/models/m/unload", "admin"),
    ("POST", "/v1/models/m/batching", "admin"),
    ("POST", "/v1/models/m/versions", "upload"),
    ("GET", "/v1/jobs/job-1", "upload"),
    ("GET", "/v1/models", "upload"),
    ("GET", "/v1/models/m", "upload"),
    ("GET", "/v1/models/m/versions/1/report", "upload"),
    ("POST", "/v1/models/m/rollback", "admin"),
    ("DELETE", "/v1/models/m/versions/1", "admin"),
]
GRPC_ENDPOINTS = [
    ("ServerLive", service_pb2.ServerLiveRequest(), "open"),
    ("ServerReady", service_pb2.ServerReadyRequest(), "open"),
    ("ModelInfer", service_pb2.ModelInferRequest(model_name="m"), "predict"),
    ("ModelStreamInfer", service_pb2.ModelInferRequest(model_name="m"), "predict"),
    ("ModelReady", service_pb2.ModelReadyRequest(name="m"), "predict"),
    ("ModelMetadata", service_pb2.ModelMetadataRequest(name="m"), "predict"),
    ("ModelConfig", service_pb2.ModelConfigRequest(name="m"), "predict"),
    ("ModelStatistics", service_pb2.ModelStatisticsRequest(name="m"), "predict"),
    ("RepositoryIndex", service_pb2.RepositoryIndexRequest(), "admin"),
    ("TraceSetting", service_pb2.TraceSettingRequest(), "admin"),
    ("LogSettings", service_pb2.LogSettingsRequest(), "admin"),
    ("RepositoryModelLoad", service_pb2.RepositoryModelLoadRequest(model_name="m"), "admin"),
    ("RepositoryModelUnload", service_pb2.RepositoryModelUnloadRequest(model_name="m"),
     "admin"),
]


def _table(predict_open: bool = False) -> TokenTable:
    return TokenTable([TokenEntry(name=s, scopes=(s,), token=t) for s, t in TOKENS.items()],
                      predict_open=predict_open)


def _token(identity: str) -> str | None:
    return {"none": None, "unknown": "no-such-token-0123456789"}.get(identity,
                                                                     TOKENS.get(identity))


def _dataplane() -> Forwarder:
    config = GatewayConfig(pools=(PoolSpec(name="p", members=(MemberSpec(),)),))
    return Forwarder.for_config(config)


def _upstream_http() -> Any:
    async def answer(member: Any, method: str, path: str, *args: Any, **kw: Any) -> Any:
        body = b"[]" if path.endswith("/index") else b"{}"
        return UpstreamResponse(200, body, [(b"content-type", b"application/json")])

    upstream = create_autospec(UpstreamHTTP, instance=True)
    upstream.request.side_effect = answer
    return upstream


def _lifecycle(tmp_path: Path) -> Any:
    """The lifecycle as the HTTP adapter sees it, its parts specced from the real ones."""
    lifecycle = create_autospec(ModelLifecycle, instance=True)
    lifecycle.jobs = create_autospec(JobRunner, instance=True)
    lifecycle.catalog = catalog = create_autospec(ModelCatalog, instance=True)
    job = JobRecord("job-1", "m", "queued", time.time(), time.time())
    lifecycle.jobs.submit.return_value = job
    lifecycle.jobs.job.return_value = job
    lifecycle.rollback.return_value = "m"
    lifecycle.delete_version.return_value = "m"
    catalog.model_names.return_value = []
    catalog.known.return_value = ModelRecord("m", "serving", time.time())
    catalog.record.return_value = ModelRecord("m", "serving", time.time())
    catalog.keep_warm_policies.return_value = {}
    catalog.loading.return_value = False
    catalog.versions.return_value = []
    catalog.recent_jobs.return_value = []
    report = tmp_path / "report.json"
    report.write_text("{}")
    catalog.report_path.return_value = report
    return lifecycle


def _http_matrix(app: Any) -> dict[tuple[str, str], dict[str, int]]:
    async def run() -> dict[tuple[str, str], dict[str, int]]:
        matrix: dict[tuple[str, str], dict[str, int]] = {}
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            for method, path, _ in HTTP_ENDPOINTS:
                row = matrix[(method, path)] = {}
                for identity in IDENTITIES:
                    token = _token(identity)
                    # half the calls use each header style
                    headers = ({} if token is None else
                               {"x-api-key": token} if len(path) % 2 else
                               {"authorization": f"Bearer {token}"})
                    body = {"latency_slo_ms": 10} if path.endswith("batching") else None
                    resp = await client.request(method, path, headers=headers, json=body)
                    row[identity] = resp.status_code
        return matrix

    return asyncio.run(run())


def _verdicts(matrix: dict[Any, dict[str, Any]], denied: tuple[Any, Any]
              ) -> dict[Any, dict[str, str]]:
    """Status codes as 401 / 403 / ok."""
    return {key: {who: "401" if code == denied[0] else "403" if code == denied[1] else "ok"
                  for who, code in row.items()}
            for key, row in matrix.items()}


def _expected(scopes: dict[Any, str]) -> dict[Any, dict[str, str]]:
    return {key: {who: "ok" if who in ALLOWED[scope] else
                  "401" if who in ("none", "unknown") else "403" for who in IDENTITIES}
            for key, scope in scopes.items()}


def test_http_endpoints_admit_exactly_their_scopes_when_tokens_configured(
    tmp_path: Path,
) -> None:
    dataplane = _dataplane()
    control = ModelControl(
        dataplane.core, MemberAdmin(create_autospec(httpx.AsyncClient, instance=True)))
    app = gateway_app(dataplane, control, _upstream_http(), _table(), _lifecycle(tmp_path))
    matrix = _http_matrix(app)
    assert _verdicts(matrix, (401, 403)) == _expected({(m, p): s for m, p, s in HTTP_ENDPOINTS})
    # the allowed calls really went through (no error from the gateway itself)
    assert matrix[("POST", "/v1/models/m/versions")]["upload"] == 202
    assert matrix[("POST", "/v2/models/m/infer")]["predict"] == 200


def test_http_401_carries_bearer_challenge_when_token_missing(tmp_path: Path) -> None:
    dataplane = _dataplane()
    control = ModelControl(
        dataplane.core, MemberAdmin(create_autospec(httpx.AsyncClient, instance=True)))
    app = gateway_app(dataplane, control, _upstream_http(), _table(), _lifecycle(tmp_path))

    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            return await client.get("/v1/models")

    resp = asyncio.run(run())
    assert resp.status_code == 401
    assert resp.headers["www-authenticate"].startswith("Bearer")
    assert "missing API token" in resp.json()["error"]


def test_http_predict_needs_no_token_when_predict_open(tmp_path: Path) -> None:
    dataplane = _dataplane()
    control = ModelControl(
        dataplane.core, MemberAdmin(create_autospec(httpx.AsyncClient, instance=True)))
    app = gateway_app(dataplane, control, _upstream_http(), _table(predict_open=True),
                          _lifecycle(tmp_path))
    matrix = _http_matrix(app)
    assert matrix[("POST", "/v2/models/m/infer")] == dict.fromkeys(IDENTITIES, 200)
    assert matrix[("GET", "/v1/models")]["none"] == 401


class _Stub:
    """Answers every Triton RPC the servicer forwards (the member boundary)."""

    def __getattr__(self, rpc: str) -> Any:
        response = getattr(service_pb2, f"{rpc}Response")

        async def call(request: Any, timeout: float | None = None) -> Any:
            return response()

        return call


def _grpc_matrix(predict_open: bool = False) -> dict[str, dict[str, grpc.StatusCode]]:
    async def run() -> dict[str, dict[str, grpc.StatusCode]]:
        dataplane = _dataplane()
        upstream = create_autospec(UpstreamGRPC, instance=True)

        async def raw(request: bytes, timeout: float | None = None) -> bytes:
            return service_pb2.ModelInferResponse(model_name="m").SerializeToString()

        upstream.raw_infer.return_value = raw
        upstream.stub.return_value = _Stub()
        control = ModelControl(
        dataplane.core, MemberAdmin(create_autospec(httpx.AsyncClient, instance=True)))
        server, port = create_grpc_server(dataplane, control, upstream, "127.0.0.1:0",
                                          _table(predict_open))
        await server.start()
        matrix: dict[str, dict[str, grpc.StatusCode]] = {}
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
                for rpc, request, _ in GRPC_ENDPOINTS:
                    row = matrix[rpc] = {}
                    for identity in IDENTITIES:
                        token = _token(identity)
                        metadata = () if token is None else (
                            (("x-api-key", token),) if len(rpc) % 2 else
                            (("authorization", f"Bearer {token}"),))
                        row[identity] = await _call(stub, rpc, request, metadata)
        finally:
            await server.stop(None)
        return matrix

    return asyncio.run(run())


async def _call(stub: Any, rpc: str, request: Any, metadata: Any) -> grpc.StatusCode:
    try:
        if rpc == "ModelStreamInfer":
            call = stub.ModelStreamInfer(iter([request]), metadata=metadata)
            async for _ in call:
                pass
        else:
            await getattr(stub, rpc)(request, metadata=metadata)
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def test_grpc_methods_admit_exactly_their_scopes_when_tokens_configured() -> None:
    matrix = _grpc_matrix()
    codes = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
    assert _verdicts(matrix, codes) == _expected({rpc: s for rpc, _, s in GRPC_ENDPOINTS})
    assert matrix["ModelInfer"]["predict"] == grpc.StatusCode.OK
    assert matrix["RepositoryModelLoad"]["admin"] == grpc.StatusCode.OK


def test_grpc_predict_needs_no_token_when_predict_open() -> None:
    matrix = _grpc_matrix(predict_open=True)
    assert matrix["ModelInfer"] == dict.fromkeys(IDENTITIES, grpc.StatusCode.OK)
    assert matrix["RepositoryIndex"]["none"] == grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.parametrize("identity", IDENTITIES)
def test_every_identity_reaches_health_when_probed(identity: str, tmp_path: Path) -> None:
    dataplane = _dataplane()
    control = ModelControl(
        dataplane.core, MemberAdmin(create_autospec(httpx.AsyncClient, instance=True)))
    app = gateway_app(dataplane, control, _upstream_http(), _table(), _lifecycle(tmp_path))
    assert _http_matrix(app)[("GET", "/v2/health/live")][identity] == 200
