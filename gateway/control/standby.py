"""Several control-plane replicas, one leader (the records in PostgreSQL).

With ``lifecycle.database_url`` (or ``$INFERGATE_DATABASE_URL``) set, each ``gateway
serve`` replica stands for election (:class:`~gateway.lifecycle.records.leader.Leadership`,
a PostgreSQL advisory lock) before it does anything that must happen once. Until it
leads it is a **standby** (:class:`Standby`), and it serves:

- the lifecycle API's reads itself, from the records and the shared repository, with
  the leader's auth and JSON shapes (:func:`~gateway.control.lifecycle_http.create_reads_router`
  over a :class:`~gateway.lifecycle.records.catalog.RecordedCatalog`): ``GET /v1/models``,
  ``/v1/models/{name}``, ``/v1/jobs/{id}``, ``/v1/models/{name}/rollout`` and the
  version reports. What only the leader knows live is said so: a model's ``loading`` is
  null, a rollout comes without its running step's windows, and a model found in the
  repository that the records do not know yet is the leader's to answer (it records it);
- everything else (uploads and every other write, the console, the data-plane feed and
  reports, ``/v2/health/ready``, gRPC) passed to the leader, at the address it wrote
  with its term (:mod:`gateway.control.leader_proxy`); 503 + ``Retry-After`` while no
  leader is known or it cannot be reached;
- ``/v2/health/live`` 200; ``/v1/replica`` (the readiness probe) 200 once its
  database answers, so that a Kubernetes Service sends calls to every replica that can
  serve them; ``/v1/leader`` 503 (200 only on the leader, for whoever needs to know who
  leads); ``/metrics`` empty (the control plane's metrics are the leader's: a scrape of
  each replica must not count them twice).

Once it wins the lock it starts as a single control plane does: recovery first (an
interrupted conversion is failed with its reason, an interrupted rollout fails safe to
stable), then probes, residency, rollouts, conversions and the snapshot feed. Its HTTP
port never closes meanwhile: the server that served the standby serves the control
plane, its app swapped in one step (:class:`AppSlot`), so a client's keep-alive
connection is not cut; reads keep being served from the records until the swap, and
what needs the leader is answered 503 + ``Retry-After`` for the moment it starts.

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
import socket
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any

import psycopg
from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.auth import TokenTable
from gateway.config import GatewayConfig
from gateway.control.leader_proxy import RETRY_AFTER_S, LeaderProxy, TcpRelay
from gateway.control.lifecycle_http import create_reads_router
from gateway.errors import GatewayError, Unavailable, error_answer
from gateway.lifecycle.records.catalog import NotRecorded, RecordedCatalog
from gateway.lifecycle.records.leader import Advertised, Leadership, LeaderState
from gateway.lifecycle.records.postgres import PostgresStore
from gateway.netaddr import bare_host, join_host_port, split_host_port

log = logging.getLogger(__name__)
LOST_EXIT = 3  # the process's status when it stops for a lost leadership
WILDCARDS = ("", "0.0.0.0", "::")
PASSED = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


class AppSlot:
    """The ASGI app an HTTP server serves, swapped in one step: the standby's until this
    replica leads, then the control plane's (connections stay open across the swap)."""

    def __init__(self, app: ASGIApp | None = None) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert self.app is not None, "an AppSlot serves once it holds an app"
        await self.app(scope, receive, send)


def advertised(host: str, http_port: int, grpc_port: int, given: str | None) -> Advertised:
    """Where the other replicas reach this one: ``given`` (``HOST`` or ``HOST:PORT``, the
    HTTP port; gRPC on the same host at ``grpc_port``), else the address it serves on
    (a wildcard address replaced by this host's name)."""
    port = http_port
    if given:
        try:
            host, port = split_host_port(given)
        except ValueError:  # HOST alone (a bare IPv6 literal too)
            host = bare_host(given)
    elif host in WILDCARDS:
        host = socket.getfqdn()
    return Advertised(http=join_host_port(host, port), grpc=join_host_port(host, grpc_port))


class Standby:
    """What a replica serves while another leads (see the module's docstring). ``app``
    goes into the replica's HTTP server; ``grpc``: where its gRPC relay listens (None:
    nowhere). :meth:`until_leading`, then :meth:`hand_over` once the control plane's own
    gRPC server is about to bind, :meth:`close` at the end."""

    def __init__(self, leadership: Leadership, auth: TokenTable, config: GatewayConfig,
                 grpc: tuple[str, int] | None = None) -> None:
        assert config.lifecycle is not None, "an election needs the lifecycle's records"
        self.leadership = leadership
        self.config = config
        self.grpc = grpc
        self._records: RecordedCatalog | None = None
        self.proxy = LeaderProxy(lambda: self._leader_at("http"), via=leadership.holder)
        self.relay = TcpRelay(lambda: self._leader_at("grpc"))
        self.app = standby_app(leadership, auth, self.records, self.proxy)
        self._announced = False

    def records(self) -> RecordedCatalog:
        if self._records is None:
            raise Unavailable("this control-plane replica cannot reach the records database "
                              "yet; retry", RETRY_AFTER_S)
        return self._records

    def _leader_at(self, kind: str) -> str:
        """The leader's HTTP or gRPC address, or Unavailable saying why there is none."""
        if self.leadership.state is LeaderState.LEADER:
            raise Unavailable("this control-plane replica has just won the leadership and "
                              "is starting; retry", RETRY_AFTER_S)
        seen = self.leadership.leader
        if seen is None:
            raise Unavailable("this control-plane replica is a standby and no leader is "
                              f"known ({self.leadership.reason or 'no lock yet'}); retry",
                              RETRY_AFTER_S)
        address = seen.http if kind == "http" else seen.grpc
        if address is None:
            raise Unavailable(f"the leader ({seen.holder}, term {seen.term}) advertises no "
                              "address (an older gateway): retry", RETRY_AFTER_S)
        return address

    async def step(self) -> bool:
        """One round: open the records (migrating them) if not yet, and stand for the
        lock; True once this replica leads."""
        if self._records is None:
            self._records = await asyncio.to_thread(self._open_records)
            if self._records is None:
                return False
        if await asyncio.to_thread(self.leadership.poll) is LeaderState.LEADER:
            log.warning("control plane: leading %r (term %s) as %s", self.leadership.name,
                        self.leadership.term, self.leadership.holder)
            return True
        if not self._announced:
            log.warning("control plane: a standby (%s); another replica leads",
                        self.leadership.reason or "no lock yet")
            self._announced = True
        return False

    async def until_leading(self, stop: asyncio.Event) -> bool:
        """Serve as a standby until this replica leads (True) or ``stop`` is set
        (False)."""
        if self.grpc is not None:
            await self.relay.start(*self.grpc)
        while not stop.is_set():
            if await self.step():
                return True
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), self.leadership.poll_interval_s)
        return False

    def _open_records(self) -> RecordedCatalog | None:
        """The records, read-only, the schema brought up to date first (the election's
        table is in it; replicas starting together apply it once)."""
        assert self.config.lifecycle is not None
        try:
            store = PostgresStore(self.leadership.url)
        except (Unavailable, psycopg.Error) as exc:
            log.warning("control plane: the records database is not ready: %s", exc)
            return None
        return RecordedCatalog(self.config.lifecycle.repository, self.config, store)

    async def hand_over(self) -> None:
        """The gRPC port is the control plane's from now on (relayed connections end)."""
        await self.relay.close()

    async def close(self) -> None:
        await self.relay.close()
        await self.proxy.aclose()
        if self._records is not None:
            self._records.store.close()


def standby_app(leadership: Leadership, auth: TokenTable,
                records: Callable[[], RecordedCatalog], proxy: LeaderProxy) -> FastAPI:
    """A standby's HTTP API: the lifecycle's reads over ``records()``, its own liveness,
    readiness and leadership, and everything else passed on by ``proxy``."""
    app = FastAPI(title="infergate control plane (standby)", openapi_url=None,
                  docs_url=None, redoc_url=None)

    @app.exception_handler(GatewayError)
    async def _on_gateway_error(_: Request, error: GatewayError) -> Response:
        return _error(error)

    @app.exception_handler(NotRecorded)
    async def _leader_records_it(request: Request, _: NotRecorded) -> Response:
        try:  # the leader records it on first sight
            return await proxy.forward(request)
        except GatewayError as error:  # (a handler's own errors are not handled again)
            return _error(error)

    @app.get("/v2/health/live")
    async def live() -> Response:
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        """Empty: the control plane's metrics are the leader's alone (a scrape of every
        replica must not count them twice)."""
        return Response(b"", media_type="text/plain; version=0.0.4")

    app.include_router(leader_router(leadership))
    app.include_router(create_reads_router(records, auth, _recorded_rollout(records)))

    @app.api_route("/{path:path}", methods=list(PASSED))
    async def elsewhere(request: Request, path: str) -> Response:
        return await proxy.forward(request)

    return app


def _error(error: GatewayError) -> Response:
    status, body, headers = error_answer(error)
    return Response(body, status, {k.decode(): v.decode() for k, v in headers})


def _recorded_rollout(records: Callable[[], RecordedCatalog]
                      ) -> Callable[[str], Awaitable[dict[str, Any]]]:
    async def status(name: str) -> dict[str, Any]:
        return await records().recorded_rollout(name)

    return status


def leader_router(leadership: Leadership | None) -> APIRouter:
    """``GET /v1/leader``: 200 on the replica that leads (or the only one: no election
    without PostgreSQL), 503 + ``Retry-After`` on a standby, for whoever needs to know
    who leads. ``GET /v1/replica``: the readiness probe, 200 wherever the control-plane
    API is served: the leader (from its win on, before its preload: ``/v2/health/ready``
    waits for that, which waits for the data-plane replicas to reach it), the only one,
    and a standby whose records database answered within the leadership's grace."""
    router = APIRouter()

    @router.get("/v1/leader")
    async def leader() -> JSONResponse:
        if leadership is None:
            return JSONResponse({"state": "single"})
        leads = leadership.state is LeaderState.LEADER
        return JSONResponse({"holder": leadership.holder, "state": leadership.state.value,
                             "term": leadership.term}, status_code=200 if leads else 503,
                            headers=None if leads else {"Retry-After": str(RETRY_AFTER_S)})

    @router.get("/v1/replica")
    async def replica() -> JSONResponse:
        if leadership is None:
            return JSONResponse({"state": "single", "serving": True})
        state = leadership.state
        serving = state is LeaderState.LEADER or (
            state is LeaderState.FOLLOWER and leadership.answered_within(leadership.grace_s))
        seen = leadership.leader
        return JSONResponse({"holder": leadership.holder, "state": state.value,
                             "serving": serving, "leader": asdict(seen) if seen else None},
                            status_code=200 if serving else 503)

    return router


async def hold(leadership: Leadership, lost: Callable[[str], None]) -> None:
    """While leading: confirm the lock every poll interval; ``lost`` once it is gone."""
    while True:
        await asyncio.sleep(leadership.poll_interval_s)
        if await asyncio.to_thread(leadership.poll) is not LeaderState.LEADER:
            lost(leadership.reason)
            return
