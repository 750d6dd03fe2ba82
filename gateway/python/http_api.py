"""HTTP adapter: the KServe v2 REST surface (Triton-compatible) over the data plane.

Bodies are forwarded as bytes (JSON, or JSON + binary tensors with
``Inference-Header-Content-Length``): the gateway reads only the path, so answers and
Triton's own errors reach the client unchanged.

``POST .../infer`` is the hot path and is served by :class:`InferFastPath`, a plain ASGI
layer in front of the FastAPI app (FastAPI's request/response machinery costs more per
call than the forwarding itself); everything else is an ordinary FastAPI route.

Request headers the gateway reads: ``X-API-Key`` (or ``Authorization: Bearer``) for rate
limits, ``X-Request-Timeout-Ms`` for a deadline (HTTP has no standard one).
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from gateway.auth import Scope, TokenTable
from gateway.control.lifecycle_http import api_key, create_lifecycle_router, requires
from gateway.control.model_control import ModelControl
from gateway.control.settings_http import create_settings_router
from gateway.control.tenants_http import create_tenants_router
from gateway.errors import (
    GatewayError,
    InvalidInput,
    Unsupported,
    outcome_of_answer,
)
from gateway.lifecycle.service import ModelLifecycle
from gateway.policy import parse_errors
from gateway.policy.deadline import triton_timeout_us
from gateway.policy.model_name import HTTP_INFER_PATTERN
from gateway.policy.rollout import http_pinned_path
from gateway.policy.shape import check_shapes
from gateway.pools import PoolMember
from gateway.python.dataplane import DataPlane
from gateway.python.fast_path import (
    ASGIReceive,
    ASGIScope,
    ASGISend,
    FastPath,
    error_answer,
    options_from_headers,
    read_body,
)
from gateway.python.generate import GenerateFastPath
from gateway.upstream.http import UpstreamHTTP, UpstreamResponse

FORWARDED_REQUEST_HEADERS = ("content-type", "inference-header-content-length", "content-encoding")
INFER_PATH = re.compile(HTTP_INFER_PATTERN)



def relay(resp: UpstreamResponse) -> Response:
    """A FastAPI response carrying an upstream (or error) answer as it is (but for
    Triton's 500 about a body it could not parse, which is the client's 400)."""
    return Response(resp.body, status_code=parse_errors.http_status(resp.status, resp.body),
                    headers={k.decode(): v.decode() for k, v in resp.headers})


def client_mistakes_as_400(resp: UpstreamResponse) -> UpstreamResponse:
    resp.status = parse_errors.http_status(resp.status, resp.body)
    return resp


HEADER_LENGTH = "inference-header-content-length"


def with_timeout_parameter(body: bytes, headers: dict[str, str],
                           deadline_s: float) -> bytes:
    """The client's deadline as Triton's ``timeout`` request parameter (µs,
    :func:`~gateway.policy.deadline.triton_timeout_us`) in the JSON header of an infer
    body (``headers``' header length follows it): Triton's queue drops the request when
    its wait exceeds it (the model's queue policy allowing, ``converters/triton_config.py``).
    A ``timeout`` of the client's own is kept when shorter. A compressed body, or a
    header that is not a JSON object, goes as it is: Triton answers it as it would have
    (its parse errors name offsets in the client's bytes, so nothing is inserted into
    bytes that do not parse)."""
    if "content-encoding" in headers:
        return body
    length = headers.get(HEADER_LENGTH)
    if length is not None and not length.isdigit():
        return body
    size = int(length) if length is not None else len(body)
    try:
        parsed = json.loads(body[:size])
    except ValueError:
        return body
    params = parsed.setdefault("parameters", {}) if isinstance(parsed, dict) else None
    if not isinstance(params, dict):
        return body
    timeout, own = triton_timeout_us(deadline_s), params.get("timeout")
    if not (isinstance(own, int) and 0 < own < timeout):
        params["timeout"] = timeout
    head = json.dumps(parsed, separators=(",", ":")).encode()
    if length is not None:
        headers[HEADER_LENGTH] = str(len(head))
    return head + body[size:]


def _outcome(resp: UpstreamResponse) -> str:
    return outcome_of_answer(resp.status)


class InferFastPath(FastPath):
    """Serves ``POST /v2/models/{m}[/versions/{v}]/infer``."""

    path = INFER_PATH

    async def __call__(self, scope: ASGIScope, receive: ASGIReceive, send: ASGISend) -> None:
        match = self.matched(scope)
        if match is None:
            await self.app(scope, receive, send)
            return
        try:
            status, body, headers = await self._infer(match.group(1), match.group(2) is None,
                                                      scope, receive)
        except GatewayError as error:
            status, body, headers = error_answer(error)
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _infer(self, model: str, unversioned: bool, scope: ASGIScope,
                     receive: ASGIReceive) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
        raw_headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        body = await read_body(receive, self.max_body_bytes)
        check_shapes(body)
        forwarded = {k: v for k, v in raw_headers.items() if k in FORWARDED_REQUEST_HEADERS}
        forwarded["accept-encoding"] = "identity"
        options = options_from_headers(raw_headers)
        if options.deadline_s is not None:
            body = with_timeout_parameter(body, forwarded, options.deadline_s)
        if self.auth.predict_gated:
            self.auth.require(options.api_key, Scope.PREDICT)
        path = scope["path"]
        version = self.dataplane.pin(model) if unversioned else None
        if version is not None:  # a rollout: stable or candidate, by its split
            path = http_pinned_path(path, version)
        if scope.get("query_string"):
            path = f"{path}?{scope['query_string'].decode('latin-1')}"

        async def call(member: PoolMember) -> UpstreamResponse:
            return client_mistakes_as_400(await self.upstream.request(
                member, "POST", path, body, forwarded, options.deadline_s))

        resp = await self.dataplane.forward(model, call, protocol="http", options=options,
                                            outcome=_outcome, version=version)
        return resp.status, resp.body, list(resp.headers)


def repository_index_body(raw: bytes) -> bytes:
    """The index request for the members: ``{}``, or ``{"ready": <bool>}`` as given;
    anything else is refused (400) before it reaches a member."""
    if not raw.strip():
        return b"{}"
    try:
        body = json.loads(raw)
    except ValueError:
        raise InvalidInput("repository index: the body is not JSON") from None
    if not isinstance(body, dict):
        raise InvalidInput("repository index: the body must be a JSON object")
    if "ready" in body and not isinstance(body["ready"], bool):
        raise InvalidInput("repository index: 'ready' must be true or false")
    unknown = sorted(set(body) - {"ready"})
    if unknown:
        raise InvalidInput(f"repository index: unknown field(s) {', '.join(unknown)}")
    return json.dumps(body).encode()


class BatchingRequest(BaseModel):
    latency_slo_ms: float = Field(gt=0, description="Latency SLO the batching must respect.")


def create_http_app(dataplane: DataPlane, control: ModelControl, upstream: UpstreamHTTP,
                    auth: TokenTable | None = None, lifecycle: ModelLifecycle | None = None,
                    max_body_bytes: int = 256 * 1024 * 1024,
                    routers: Sequence[APIRouter] = ()) -> Any:
    app = FastAPI(title="infergate", description="KServe v2 / Triton-compatible gateway")
    auth = auth or TokenTable()
    admin = Depends(requires(auth, Scope.ADMIN))
    app.include_router(create_lifecycle_router(lifecycle, auth))
    app.include_router(create_settings_router(control, upstream, auth))
    app.include_router(create_tenants_router(dataplane.state, auth))
    for router in routers:  # more control-plane surfaces (the data-plane snapshot feed)
        app.include_router(router)

    @app.exception_handler(GatewayError)
    async def _on_gateway_error(_: Request, error: GatewayError) -> Response:
        return relay(UpstreamResponse(*error_answer(error)))

    async def model_call(model: str, request: Request) -> Response:
        auth.require(api_key(request), Scope.PREDICT)
        body = await request.body()
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")

        async def call(member: PoolMember) -> UpstreamResponse:
            return await upstream.request(member, request.method, path, body,
                                          {"accept-encoding": "identity"})

        return relay(await dataplane.forward(model, call, protocol="http", metered=False))

    # JSON bodies as KServe's SDK reads them (Triton sends none; its clients read the status)
    @app.get("/v2/health/live")
    async def live() -> Response:
        return JSONResponse({"live": True})

    @app.get("/v2/health/ready")
    async def ready() -> Response:
        is_ready = dataplane.state.ready()
        return JSONResponse({"ready": is_ready}, status_code=200 if is_ready else 503)

    @app.get("/v2")
    async def server_metadata() -> Response:
        return relay(await upstream.request(dataplane.state.any_member(), "GET", "/v2"))

    @app.get("/metrics")
    async def metrics() -> Response:
        await dataplane.refresh_gauges()
        return Response(dataplane.metrics.render(),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    for suffix in ("", "/versions/{version}"):
        base = "/v2/models/{model}" + suffix
        for tail in ("", "/ready", "/config", "/stats"):
            app.add_api_route(base + tail, _model_route(model_call), methods=["GET"],
                              name=f"model{tail.replace('/', '_')}{suffix and '_version'}")

    @app.post("/v2/repository/index", dependencies=[admin])
    async def repository_index(request: Request) -> Response:
        body = repository_index_body(await request.body())
        answers = await control.index(
            lambda m: upstream.request(m, "POST", "/v2/repository/index", body,
                                       {"content-type": "application/json"})
        )
        merged: dict[tuple[str, str], Any] = {}
        for answer in answers:
            if answer.status != 200:
                return relay(answer)
            for entry in json.loads(answer.body):
                merged.setdefault((entry.get("name"), entry.get("version", "")), entry)
        return JSONResponse(list(merged.values()))

    for action in ("load", "unload"):
        app.add_api_route(f"/v2/repository/models/{{model}}/{action}",
                          _repository_route(control, upstream, action), methods=["POST"],
                          name=f"repository_{action}", dependencies=[admin])

    @app.api_route("/v2/systemsharedmemory{rest:path}", methods=["GET", "POST"])
    @app.api_route("/v2/cudasharedmemory{rest:path}", methods=["GET", "POST"])
    async def shared_memory(rest: str) -> Response:
        # no region is ever registered: status lists none, unregistering any is done
        # (clients clean up defensively), registering is refused
        if rest.endswith("/status"):
            return JSONResponse([])
        if rest.endswith("/unregister"):
            return Response(status_code=200)
        raise Unsupported("shared memory is not supported through the gateway (the gateway "
                          "and Triton do not share memory with the client); send tensors "
                          "in the request")

    @app.post("/v1/models/{model}/batching", dependencies=[admin])
    async def tune_batching(model: str, body: BatchingRequest) -> JSONResponse:
        """Derive dynamic-batching settings from the SLO and measured batch latency, and
        reload the model with them on every member that serves it."""
        decision = await control.apply_batching(model, body.latency_slo_ms)
        return JSONResponse({"model": model, **decision.__dict__,
                             "dynamic_batching": decision.as_config()})

    generate = GenerateFastPath(app, dataplane, upstream, auth, max_body_bytes)
    return InferFastPath(generate, dataplane, upstream, auth, max_body_bytes)


def _model_route(model_call: Callable[[str, Request], Awaitable[Response]]
                 ) -> Callable[..., Awaitable[Response]]:
    async def route(model: str, request: Request) -> Response:
        return await model_call(model, request)

    return route


def _repository_route(control: ModelControl, upstream: UpstreamHTTP, action: str
                      ) -> Callable[..., Awaitable[Response]]:
    async def route(model: str, request: Request) -> Response:
        body = await request.body()
        path = f"/v2/repository/models/{model}/{action}"
        answers = await control.broadcast(
            model, lambda m: upstream.request(m, "POST", path, body,
                                              {"content-type": "application/json"})
        )
        failed = next((a for a in answers if a.status >= 400), None)
        return relay(failed or answers[0])

    return route
