"""What the control plane tells data-plane replicas besides their snapshot
(``gateway/haproxy/feed.py``), admin-scoped like it:

- ``GET /v1/dataplane/config``: the gateway's configuration as this process runs it
  (JSON), from which a replica builds its own forwarder's state (``gateway/replica.py``);
- ``POST /v1/dataplane/misses/<model>[?wait=<seconds>]``: a replica holds a request for
  a model no member holds. The control plane's waiting room loads it (one load however
  many replicas and requests ask) and answers once a member holds it, or with the
  waiting room's own answer (503 + ``Retry-After`` saying why, 404 for a name no pool
  knows); ``wait``: what the request may still wait (absent: the waiting room's
  ``max_wait_s``). It answers once the replicas have applied the snapshot that names
  the holders (``GatewayState.settle``), or at the last share of ``wait``
  (:func:`~gateway.policy.deadline.last_share_s`) whichever comes first: an
  answer after it would reach a client whose own deadline has passed. The answer names
  the holders' member keys (``{"model", "holders"}``): a replica whose snapshot lags
  sends the request there;
- ``POST /v1/dataplane/report``: what a replica served since its last report, every
  second: user requests per model (the residency's demand and last use:
  ``infergate_replica_requests_total``) and the answers of each version of the models
  under rollout (the rollout judges them beside its own: without them a canary's verdict
  would see none of the traffic the replicas carry), and the shadow step's pairs the
  replica's forwarder mirrored (the shadow share is the replicas': the control plane
  runs no forwarder).
"""

from __future__ import annotations

import asyncio
import contextlib

from fastapi import APIRouter, Depends, Query, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from gateway.auth import Scope, TokenTable
from gateway.control.lifecycle_http import requires
from gateway.core import Core
from gateway.policy.deadline import last_share_s

MAX_REPORTED = 100_000  # answers one report may carry (a replica sends a second's worth)


class ShadowReport(BaseModel):
    stable: int
    candidate: int
    # (stable ok, seconds, candidate ok, seconds, agreement) per mirrored request
    pairs: list[tuple[bool, float, bool, float, float | None]] = Field(default_factory=list)
    skipped: int = Field(0, ge=0)


class ReplicaReport(BaseModel):
    # model -> user requests the replica served since its last report
    served: dict[str, int] = Field(default_factory=dict)
    # model -> version -> (ok, seconds) per answer, for the models under rollout
    answers: dict[str, dict[int, list[tuple[bool, float]]]] = Field(default_factory=dict)
    # model -> the shadow step's pairs the replica mirrored (``ShadowReport``)
    shadows: dict[str, ShadowReport] = Field(default_factory=dict)


def create_dataplane_router(core: Core, auth: TokenTable) -> APIRouter:
    router = APIRouter(prefix="/v1/dataplane",
                       dependencies=[Depends(requires(auth, Scope.ADMIN))])

    @router.get("/config")
    async def config() -> JSONResponse:
        return JSONResponse({"config": core.state.config.model_dump(mode="json")})

    @router.post("/misses/{model}")
    async def miss(model: str, wait: float | None = Query(None, ge=0.0, le=3600.0)
                   ) -> JSONResponse:
        began = core.clock()
        await core.state.wait_resident(model, wait)
        # answered once the replicas route by a snapshot that names the holders (the
        # one that asked waits for its own next, which then has them), within the
        # request's last share: two gRPC misses released near it met their clients'
        # own deadlines while this waited (bench_residency, a quarter)
        left = None if wait is None else max(0.0, last_share_s(wait) - (core.clock() - began))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(core.state.settle(), left)
        return JSONResponse({"model": model, "holders": sorted(core.state.holders(model)
                                                              or ())})

    @router.post("/report", status_code=204)
    async def report(body: ReplicaReport) -> Response:
        state, now = core.state, core.clock()
        for model, count in body.served.items():
            if count > 0 and state.pools_for(model):  # (a model no pool serves: no label)
                core.metrics.replica_requests.labels(model).inc(count)
                state.note_used(model, now)
        room = MAX_REPORTED
        for model, versions in body.answers.items():
            for version, answers in versions.items():
                for ok, seconds in answers[:room]:
                    state.tally.record(model, version, ok, seconds, now)
                room -= min(room, len(answers))
        for model, pairs in body.shadows.items():
            shadow = state.shadow_of(model)
            # (a step that has moved on meanwhile: its pairs are not this step's)
            if shadow is not None and (shadow.stable, shadow.candidate) == (
                    pairs.stable, pairs.candidate):
                shadow.tally.merge(pairs.pairs[:room], pairs.skipped)
                room -= min(room, len(pairs.pairs))
        return Response(status_code=204)

    return router
