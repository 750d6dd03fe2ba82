"""What the control plane tells data-plane replicas besides their snapshot
(``gateway/haproxy/feed.py``), admin-scoped like it:

- ``GET /v1/dataplane/config``: the gateway's configuration as this process runs it
  (JSON), from which a replica builds its own forwarder's state (``gateway/replica.py``);
- ``POST /v1/dataplane/misses/<model>[?wait=<seconds>]``: a replica holds a request for
  a model no member holds. The control plane's waiting room loads it (one load however
  many replicas and requests ask) and answers once a member holds it, or with the
  waiting room's own answer (503 + ``Retry-After`` saying why, 404 for a name no pool
  knows); ``wait``: what the request may still wait (absent: the waiting room's
  ``max_wait_s``).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query
from fastapi.responses import JSONResponse

from gateway.auth import Scope, TokenTable
from gateway.control.lifecycle_http import requires
from gateway.core import Core


def create_dataplane_router(core: Core, auth: TokenTable) -> APIRouter:
    router = APIRouter(prefix="/v1/dataplane",
                       dependencies=[Depends(requires(auth, Scope.ADMIN))])

    @router.get("/config")
    async def config() -> JSONResponse:
        return JSONResponse({"config": core.state.config.model_dump(mode="json")})

    @router.post("/misses/{model}")
    async def miss(model: str, wait: float | None = Query(None, ge=0.0, le=3600.0)
                   ) -> JSONResponse:
        await core.state.wait_resident(model, wait)
        return JSONResponse({"model": model, "holders": sorted(core.state.holders(model)
                                                              or ())})

    return router
