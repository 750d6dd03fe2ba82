"""HTTP adapter: the KServe v2 REST surface (Triton-compatible) over the data plane.

Request and response bodies are forwarded as bytes (JSON or JSON + binary tensors with
``Inference-Header-Content-Length``): the gateway reads only the path, so answers and
Triton's own errors reach the client unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping

import httpx
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from gateway.dataplane import DataPlane
from gateway.errors import GatewayError, Unavailable, http_status
from gateway.pools import PoolMember

FORWARDED_REQUEST_HEADERS = ("content-type", "inference-header-content-length", "content-encoding")
FORWARDED_RESPONSE_HEADERS = ("content-type", "inference-header-content-length")
# Responses are relayed uncompressed: compressing per hop costs more CPU than it saves on
# loopback/cluster networks, and httpx would otherwise ask Triton for gzip by default.
UPSTREAM_ACCEPT_ENCODING = {"accept-encoding": "identity"}


class UpstreamHTTP:
    """Persistent keep-alive connections to every member's HTTP port."""

    def __init__(self, timeout_s: float = 60.0, max_connections: int = 256) -> None:
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s, connect=2.0),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=64),
            trust_env=False,
        )

    async def request(
        self,
        member: PoolMember,
        method: str,
        path: str,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        url = f"http://{member.spec.host}:{member.spec.http_port}{path}"
        try:
            return await self.client.request(method, url, content=body, headers=headers)
        except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError) as exc:
            raise Unavailable(f"member {member.key} unreachable: {exc!r}") from exc

    async def aclose(self) -> None:
        await self.client.aclose()


def _outcome(resp: httpx.Response) -> str:
    if resp.status_code < 400:
        return "success"
    return "client_error" if resp.status_code < 500 else "upstream_error"


def _relay(resp: httpx.Response) -> Response:
    headers = {k: v for k, v in resp.headers.items() if k.lower() in FORWARDED_RESPONSE_HEADERS}
    return Response(content=resp.content, status_code=resp.status_code, headers=headers)


def _error_response(error: GatewayError) -> JSONResponse:
    headers = {}
    if error.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, round(error.retry_after_s)))
    return JSONResponse({"error": error.message}, status_code=http_status(error), headers=headers)


def create_http_app(dataplane: DataPlane, upstream: UpstreamHTTP) -> FastAPI:
    app = FastAPI(title="infergate", description="KServe v2 / Triton-compatible gateway")

    @app.exception_handler(GatewayError)
    async def _on_gateway_error(_: Request, error: GatewayError) -> JSONResponse:
        return _error_response(error)

    async def model_call(model: str, request: Request, protocol: str = "http") -> Response:
        body = await request.body()
        headers = {
            k: v for k, v in request.headers.items() if k.lower() in FORWARDED_REQUEST_HEADERS
        }
        headers.update(UPSTREAM_ACCEPT_ENCODING)
        path = request.url.path
        if request.url.query:
            path = f"{path}?{request.url.query}"

        async def call(member: PoolMember) -> httpx.Response:
            return await upstream.request(member, request.method, path, body, headers)

        resp = await dataplane.forward(model, call, protocol=protocol, outcome=_outcome)
        return _relay(resp)

    async def server_call(request: Request) -> Response:
        member = dataplane.any_member()
        return _relay(
            await upstream.request(
                member, request.method, request.url.path, headers=UPSTREAM_ACCEPT_ENCODING
            )
        )

    @app.get("/v2/health/live")
    async def live() -> Response:
        return Response(status_code=200)

    @app.get("/v2/health/ready")
    async def ready() -> Response:
        return Response(status_code=200 if dataplane.ready() else 503)

    @app.get("/v2")
    async def server_metadata(request: Request) -> Response:
        return await server_call(request)

    @app.get("/metrics")
    async def metrics() -> Response:
        dataplane.update_saturation()
        return Response(
            dataplane.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    for suffix in ("", "/versions/{version}"):
        base = "/v2/models/{model}" + suffix
        app.add_api_route(base, _model_route(model_call, "meta"), methods=["GET"])
        app.add_api_route(base + "/ready", _model_route(model_call, "ready"), methods=["GET"])
        app.add_api_route(base + "/config", _model_route(model_call, "config"), methods=["GET"])
        app.add_api_route(base + "/stats", _model_route(model_call, "stats"), methods=["GET"])
        app.add_api_route(base + "/infer", _model_route(model_call, "infer"), methods=["POST"])
    return app


def _model_route(model_call, name: str):  # type: ignore[no-untyped-def]
    async def route(model: str, request: Request) -> Response:
        return await model_call(model, request)

    route.__name__ = f"model_{name}"
    return route
