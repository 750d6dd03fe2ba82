"""Several control-plane replicas, one leader (the records in PostgreSQL).

With ``lifecycle.database_url`` (or ``$INFERGATE_DATABASE_URL``) set, each ``gateway
serve`` replica stands for election (:class:`~gateway.lifecycle.records.leader.Leadership`,
a PostgreSQL advisory lock) before it does anything that must happen once. Until it
leads it is a **standby**: its HTTP port answers liveness (200), readiness and
``/v1/leader`` (503) and every other call with 503 + ``Retry-After`` saying that another
replica leads. A Kubernetes readiness probe on ``/v1/leader`` keeps the Service on the
leader from the moment it leads, and the data-plane replicas, which follow the Service,
follow whichever replica leads. Once it wins the lock it starts
as a single control plane does: recovery first (an interrupted conversion is failed
with its reason, an interrupted rollout fails safe to stable), then probes, residency,
rollouts, conversions and the snapshot feed.

A leader that loses its lock (its database session ended, the term moved, or no
confirmation for the grace) stops acting at once: every record write carries its term
and is refused once stale (fencing, in the store's own transaction), and the process
exits (:data:`LOST_EXIT`), leaving HAProxy and the data-plane replicas serving; a
restart stands again, as a standby.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import psycopg
import uvicorn
from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import JSONResponse

from gateway.embedded import EmbeddedServer
from gateway.errors import Unavailable
from gateway.lifecycle.records.leader import Leadership, LeaderState
from gateway.lifecycle.records.postgres import connect, migrate

log = logging.getLogger(__name__)
LOST_EXIT = 3  # the process's status when it stops for a lost leadership
STANDBY = ("this control-plane replica is a standby: another replica leads ({reason}); "
           "retry: the Service sends calls to the leader")
RETRY_AFTER_S = 2


def standby_app(leadership: Leadership) -> FastAPI:
    app = FastAPI(title="infergate control plane (standby)", openapi_url=None,
                  docs_url=None, redoc_url=None)

    @app.get("/v2/health/live")
    async def live() -> Response:
        return Response(status_code=200)

    @app.get("/v1/leader")
    async def leader() -> JSONResponse:
        """503 here: not the leader (the readiness a Service routes the control plane's
        calls by, so that they reach the leader as soon as it leads)."""
        return JSONResponse({"holder": leadership.holder, "state": leadership.state.value,
                             "term": leadership.term}, status_code=503,
                            headers={"Retry-After": str(RETRY_AFTER_S)})

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
    async def elsewhere(request: Request, path: str) -> JSONResponse:
        return JSONResponse(
            {"error": STANDBY.format(reason=leadership.reason or "no lock yet")},
            status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)})

    return app


async def until_leading(leadership: Leadership, address: tuple[str, int] | None,
                        stop: asyncio.Event) -> bool:
    """Serve as a standby on ``address`` (host, port; None: nowhere) until this replica
    leads (True) or ``stop`` is set (False). The records' schema is brought up to date
    first (the election's table is in it; replicas starting together apply it once)."""
    server = None if address is None else EmbeddedServer(uvicorn.Config(
        standby_app(leadership), host=address[0], port=address[1], log_level="warning",
        access_log=False, lifespan="off", loop="asyncio"))
    serving = None if server is None else asyncio.create_task(server.serve(), name="standby")
    announced, migrated = False, False
    try:
        while not stop.is_set():
            if not migrated:
                migrated = await asyncio.to_thread(_migrated, leadership.url)
            if migrated and await asyncio.to_thread(leadership.poll) is LeaderState.LEADER:
                log.warning("control plane: leading %r (term %s) as %s", leadership.name,
                            leadership.term, leadership.holder)
                return True
            if not announced:
                log.warning("control plane: a standby (%s); another replica leads",
                            leadership.reason or "no lock yet")
                announced = True
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), leadership.poll_interval_s)
        return False
    finally:
        if server is not None and serving is not None:
            server.should_exit = True
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await serving


def _migrated(url: str) -> bool:
    try:
        with connect(url) as conn:
            migrate(conn)
        return True
    except (Unavailable, psycopg.Error) as exc:
        log.warning("control plane: the records database is not ready: %s", exc)
        return False


def leader_router(leadership: Leadership | None) -> APIRouter:
    """``GET /v1/leader`` on the control plane that runs: 200 (it leads, or it is the only
    one: no election without PostgreSQL). A standby answers it 503 (:func:`standby_app`),
    so it is the readiness probe that sends a Service's calls, the data-plane replicas'
    snapshot polls included, to the leader from its first second, before its preload
    (``/v2/health/ready`` waits for that, and the replicas must be able to reach the new
    leader while it runs: its recovery waits for them to route stable)."""
    router = APIRouter()

    @router.get("/v1/leader")
    async def leader() -> JSONResponse:
        if leadership is None:
            return JSONResponse({"state": "single"})
        return JSONResponse({"holder": leadership.holder, "state": leadership.state.value,
                             "term": leadership.term},
                            status_code=200 if leadership.state is LeaderState.LEADER
                            else 503)

    return router


async def hold(leadership: Leadership, lost: Callable[[str], None]) -> None:
    """While leading: confirm the lock every poll interval; ``lost`` once it is gone."""
    while True:
        await asyncio.sleep(leadership.poll_interval_s)
        if await asyncio.to_thread(leadership.poll) is not LeaderState.LEADER:
            lost(leadership.reason)
            return
