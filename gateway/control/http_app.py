"""The control plane's HTTP app: every route that is not inference.

Health and server metadata, model metadata, readiness, config and statistics (asked of
one member serving the model, :meth:`ModelControl.ask`), the repository API fanned out
to the members, dynamic batching, the lifecycle (uploads, versions, rollouts), settings,
tenants, ``/metrics``, and the routers the assembler adds (the snapshot feed, the
console). A data plane serves inference and mounts this app for the rest: the Python
forwarder wraps it (``gateway/python/http_api.py``); HAProxy forwards what is not
inference to it. A data-plane replica mounts only the calls it serves without the
control plane (:func:`add_serving_routes`, ``gateway/replica.py``).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from gateway.auth import Scope, TokenTable
from gateway.control.lifecycle_http import api_key, create_lifecycle_router, requires
from gateway.control.model_control import ModelControl
from gateway.control.residency_http import create_residency_router
from gateway.control.settings_http import create_settings_router
from gateway.control.tenants_http import create_tenants_router
from gateway.core import Core
from gateway.errors import GatewayError, InvalidInput, Unsupported, error_answer
from gateway.lifecycle.records.tenancy import LiveTenancy
from gateway.lifecycle.service import ModelLifecycle
from gateway.metrics_merge import merge_exposition
from gateway.policy import parse_errors
from gateway.pools import PoolMember
from gateway.residency.manager import Residency
from gateway.upstream.http import UpstreamHTTP, UpstreamResponse


def relay(resp: UpstreamResponse) -> Response:
    """A FastAPI response carrying an upstream (or error) answer as it is (but for
    Triton's 500 about a body it could not parse, which is the client's 400)."""
    return Response(resp.body, status_code=parse_errors.http_status(resp.status, resp.body),
                    headers={k.decode(): v.decode() for k, v in resp.headers})


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


def create_control_app(core: Core, control: ModelControl, upstream: UpstreamHTTP,
                       auth: TokenTable | None = None, lifecycle: ModelLifecycle | None = None,
                       routers: Sequence[APIRouter] = (),
                       residency: Residency | None = None,
                       replica_metrics: Callable[[], Awaitable[str | None]] | None = None,
                       tenancy: LiveTenancy | None = None) -> FastAPI:
    """Every HTTP route but inference's (the data planes serve those).
    ``replica_metrics``: the exposition of a replica on this node, merged into this
    process's ``/metrics`` (``gateway/metrics_merge.py``; None: unreachable).
    ``tenancy``: where live tenancy changes are recorded (None: in memory only)."""
    app = FastAPI(title="infergate", description="KServe v2 / Triton-compatible gateway")
    auth = auth or TokenTable()
    admin = Depends(requires(auth, Scope.ADMIN))
    app.include_router(create_lifecycle_router(lifecycle, auth))
    app.include_router(create_settings_router(control, upstream, auth))
    app.include_router(create_tenants_router(tenancy or LiveTenancy(core.state), auth))
    app.include_router(create_residency_router(residency, auth))
    for router in routers:  # more control-plane surfaces (the data-plane snapshot feed)
        app.include_router(router)

    add_serving_routes(app, core, control, upstream, auth)

    @app.get("/metrics")
    async def metrics() -> Response:
        await core.refresh_gauges()
        body = core.metrics.render()
        other = await replica_metrics() if replica_metrics is not None else None
        if other:
            body = merge_exposition(body.decode(), other)
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

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

    @app.post("/v1/models/{model}/batching", dependencies=[admin])
    async def tune_batching(model: str, body: BatchingRequest) -> JSONResponse:
        """Derive dynamic-batching settings from the SLO and measured batch latency, and
        reload the model with them on every member that serves it."""
        decision = await control.apply_batching(model, body.latency_slo_ms)
        return JSONResponse({"model": model, **decision.__dict__,
                             "dynamic_batching": decision.as_config()})

    return app


def add_serving_routes(app: FastAPI, core: Core, control: ModelControl,
                       upstream: UpstreamHTTP, auth: TokenTable) -> None:
    """The calls a data plane serves whether or not the control plane is up
    (``gateway/policy/planes.py``): health and readiness (``core``'s view), server and
    model metadata, readiness, config and statistics (asked of the members), shared
    memory (refused); the gateway's errors answered from the one table. The control
    plane's app has them, and so has a data-plane replica's own
    (``gateway/replica.py``)."""
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

        return relay(await control.ask(model, call))

    # JSON bodies as KServe's SDK reads them (Triton sends none; its clients read the status)
    @app.get("/v2/health/live")
    async def live() -> Response:
        return JSONResponse({"live": True})

    @app.get("/v2/health/ready")
    async def ready() -> Response:
        is_ready = core.state.ready()
        return JSONResponse({"ready": is_ready}, status_code=200 if is_ready else 503)

    @app.get("/v2")
    async def server_metadata() -> Response:
        return relay(await upstream.request(core.state.any_member(), "GET", "/v2"))

    for suffix in ("", "/versions/{version}"):
        base = "/v2/models/{model}" + suffix
        for tail in ("", "/ready", "/config", "/stats"):
            app.add_api_route(base + tail, _model_route(model_call), methods=["GET"],
                              name=f"model{tail.replace('/', '_')}{suffix and '_version'}")

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
