"""The Python data plane's HTTP surface: inference (KServe v2, Triton-compatible) and
generation, in front of the control plane's app (``gateway/control/http_app.py``),
which serves every other route.

Bodies are forwarded as bytes (JSON, or JSON + binary tensors with
``Inference-Header-Content-Length``): the gateway reads only the path, so answers and
Triton's own errors reach the client unchanged.

``POST .../infer`` is the hot path and is served by :class:`InferFastPath`, a plain ASGI
layer in front of the FastAPI app (FastAPI's request/response machinery costs more per
call than the forwarding itself).

Request headers the gateway reads: ``X-API-Key`` (or ``Authorization: Bearer``) for rate
limits, ``X-Request-Timeout-Ms`` for a deadline (HTTP has no standard one).
"""

from __future__ import annotations

import json
import re
from typing import Any

from gateway.auth import Scope, TokenTable
from gateway.errors import (
    GatewayError,
    error_answer,
    outcome_of_answer,
)
from gateway.policy import parse_errors, triton_priority
from gateway.policy.deadline import triton_timeout_us
from gateway.policy.model_name import HTTP_INFER_PATTERN
from gateway.policy.rollout import SHADOW_HEADER, http_pinned_path
from gateway.policy.shape import check_shapes
from gateway.pools import PoolMember
from gateway.python.fast_path import (
    ASGIReceive,
    ASGIScope,
    ASGISend,
    FastPath,
    options_from_headers,
    read_body,
)
from gateway.python.forwarder import (
    LOAD_WAIT_HEADER,
    LOAD_WAIT_MS,
    MIRROR_TIMEOUT_S,
    Forwarder,
)
from gateway.python.generate import GenerateFastPath
from gateway.python.shadow import compare_http
from gateway.upstream.http import UpstreamHTTP, UpstreamResponse

FORWARDED_REQUEST_HEADERS = ("content-type", "inference-header-content-length", "content-encoding")
INFER_PATH = re.compile(HTTP_INFER_PATTERN)



def client_mistakes_as_400(resp: UpstreamResponse) -> UpstreamResponse:
    resp.status = parse_errors.http_status(resp.status, resp.body)
    return resp


HEADER_LENGTH = "inference-header-content-length"


def with_parameters(body: bytes, headers: dict[str, str], deadline_s: float | None,
                    level: int | None) -> bytes:
    """The parameters the gateway gives Triton, set in the JSON header of an infer body
    (``headers``' header length follows it):

    - ``deadline_s``: the client's deadline as Triton's ``timeout`` (µs,
      :func:`~gateway.policy.deadline.triton_timeout_us`): Triton's queue drops the
      request when its wait exceeds it (the model's queue policy allowing,
      ``converters/triton_config.py``); a ``timeout`` of the client's own is kept when
      shorter;
    - ``level``: the class's ``priority`` (``gateway/policy/triton_priority.py``), in
      place of the client's.

    A compressed body, or a header that is not a JSON object, goes as it is: Triton
    answers it as it would have (its parse errors name offsets in the client's bytes,
    so nothing is inserted into bytes that do not parse)."""
    if (deadline_s is None and level is None) or "content-encoding" in headers:
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
    if deadline_s is not None:
        timeout, own = triton_timeout_us(deadline_s), params.get("timeout")
        if not (isinstance(own, int) and 0 < own < timeout):
            params["timeout"] = timeout
    if level is not None:
        params[triton_priority.PARAMETER] = level
    head = json.dumps(parsed, separators=(",", ":")).encode()
    if length is not None:
        headers[HEADER_LENGTH] = str(len(head))
    return head + body[size:]


def match_version(path: str) -> str | None:
    match = INFER_PATH.match(path)
    return match.group(2) if match else None


def _named_version(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


def _unversioned(path: str) -> str:
    """``/v2/models/<m>/versions/<v>/infer`` -> ``/v2/models/<m>/infer``."""
    head, _, verb = path.rpartition("/")
    if "/versions/" in head:
        head = head[: head.rindex("/versions/")]
    return f"{head}/{verb}"


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
        body = with_parameters(body, forwarded, options.deadline_s,
                               self.forwarder.triton_level(model, options))
        if self.auth.predict_gated:
            self.auth.require(options.api_key, Scope.PREDICT)
        path = unpinned = scope["path"]
        version = self.forwarder.pin(model) if unversioned else None
        if version is not None:  # a rollout: stable or candidate, by its split
            path = http_pinned_path(path, version)
        else:
            unpinned = _unversioned(path)
        query = f"?{scope['query_string'].decode('latin-1')}" if scope.get("query_string") \
            else ""

        async def call(member: PoolMember, path: str = path + query) -> UpstreamResponse:
            return client_mistakes_as_400(await self.upstream.request(
                member, "POST", path, body, forwarded, options.deadline_s))

        # the shadow step: a request to stable (pinned here, or by HAProxy when it marked
        # it) may also go to the candidate
        shadow = None
        if self.forwarder.state.shadows:
            marked = SHADOW_HEADER in raw_headers  # HAProxy pinned it: the path's version
            shadow = self.forwarder.shadow(model, _named_version(match_version(path))
                                           if version is None and marked else version, marked)
        LOAD_WAIT_MS.set(None)
        started = self.forwarder.clock()
        resp = await self.forwarder.forward(model, call, protocol="http", options=options,
                                            outcome=_outcome, version=version)
        if shadow is not None:
            mirror_path = http_pinned_path(unpinned, shadow.candidate) + query

            async def mirror(member: PoolMember) -> UpstreamResponse:
                return client_mistakes_as_400(await self.upstream.request(
                    member, "POST", mirror_path, body, forwarded, MIRROR_TIMEOUT_S))

            self.forwarder.mirror(shadow, model, "http", mirror,
                                  (resp.status == 200, self.forwarder.clock() - started),
                                  compare_http(resp, shadow.metric))
        headers = list(resp.headers)
        waited = LOAD_WAIT_MS.get()
        if waited is not None:  # a miss: it waited for its model to load
            headers.append((LOAD_WAIT_HEADER.encode(), str(waited).encode()))
        return resp.status, resp.body, headers


def create_http_app(forwarder: Forwarder, control_app: Any, upstream: UpstreamHTTP,
                    auth: TokenTable | None = None,
                    max_body_bytes: int = 256 * 1024 * 1024) -> Any:
    """The Python data plane's HTTP surface: inference and generation on their fast
    paths, everything else falls through to the control plane's app."""
    auth = auth or TokenTable()
    generate = GenerateFastPath(control_app, forwarder, upstream, auth, max_body_bytes)
    return InferFastPath(generate, forwarder, upstream, auth, max_body_bytes)
