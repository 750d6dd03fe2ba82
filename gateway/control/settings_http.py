"""HTTP trace and log settings (``/v2/trace/setting``, ``/v2/models/{m}/trace/setting``,
``/v2/logging``, GET and POST), fanned out to the members concerned
(:mod:`gateway.control.fanout`). Admin scope: they change what every Triton server writes."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Depends, Request, Response

from gateway.auth import Scope, TokenTable
from gateway.control.fanout import fan_out, settings_members, settle
from gateway.control.lifecycle_http import requires
from gateway.control.model_control import ModelControl
from gateway.policy import parse_errors
from gateway.pools import PoolMember
from gateway.upstream.http import UpstreamHTTP, UpstreamResponse


def _refused(answer: UpstreamResponse) -> str | None:
    if answer.status < 400:
        return None
    try:
        return str(json.loads(answer.body).get("error", "")) or f"HTTP {answer.status}"
    except (ValueError, AttributeError):
        return answer.body[:300].decode("utf-8", "replace") or f"HTTP {answer.status}"


def _relay(resp: UpstreamResponse) -> Response:
    return Response(resp.body, status_code=parse_errors.http_status(resp.status, resp.body),
                    headers={k.decode(): v.decode() for k, v in resp.headers})


def create_settings_router(control: ModelControl, upstream: UpstreamHTTP,
                           auth: TokenTable) -> APIRouter:
    router = APIRouter(dependencies=[Depends(requires(auth, Scope.ADMIN))])

    def route(model_scoped: bool) -> Callable[..., Awaitable[Response]]:
        async def handler(request: Request) -> Response:
            model = request.path_params.get("model") if model_scoped else None
            body = await request.body() if request.method == "POST" else b""
            path = request.url.path

            async def call(member: PoolMember) -> UpstreamResponse:
                return await upstream.request(member, request.method, path, body,
                                              {"content-type": "application/json",
                                               "accept-encoding": "identity"})

            answers = await fan_out(settings_members(control, model), call)
            return _relay(settle(answers, _refused))

        return handler

    for path, scoped in (("/v2/trace/setting", False),
                         ("/v2/models/{model}/trace/setting", True),
                         ("/v2/logging", False)):
        name = path.strip("/").replace("/", "_").replace("{model}", "model")
        router.add_api_route(path, route(scoped), methods=["GET", "POST"], name=name)
    return router
