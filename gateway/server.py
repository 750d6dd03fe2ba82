"""Run the gateway: HTTP (uvicorn) and gRPC (grpc.aio) on one event loop, and, with the
native data plane, HAProxy in front of them.

``data_plane="haproxy"``: HAProxy listens on the gateway's HTTP and gRPC ports and
carries every inference request (HTTP ``.../infer``, gRPC ``ModelInfer``) straight to the
pools; everything else (health, metadata, repository, streams, uploads, metrics) it
forwards to this process's servers on private loopback ports. ``data_plane="python"``:
this process listens on the gateway's ports itself and forwards every request.

Shutdown (SIGTERM/SIGINT or ``stop`` set) is bounded by ``drain_timeout_s`` plus a few
seconds: readiness turns false at once, new work is still served while in-flight
requests finish for up to ``drain_timeout_s``. Then what is still open ends in a way a
client retries, each step given ``CLOSE_S``: the HTTP server closes (a
``generate_stream`` ends with an error event saying the gateway is shutting down),
HAProxy stops (its clients' connections close: a gRPC stream through it ends
``UNAVAILABLE``), and the gRPC server ends its streams with ``UNAVAILABLE`` and that
message, then closes.

HAProxy's lifetime (``haproxy_detached``): ``gateway serve`` leaves it serving on its
last configuration when this process crashes, and a restart on the same run folder
adopts it (:class:`~gateway.haproxy.process.HAProxyProcess`); the run folder's default
is derived from the ports, so the restart finds it. A graceful stop ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from gateway.auth import Scope, TokenEntry, TokenTable
from gateway.config import GatewayConfig
from gateway.console.pages import Console, create_console_router
from gateway.console.placement import SchedulerPlans
from gateway.console.session import Sessions
from gateway.console.traffic import TenantWindow, TrafficHistory
from gateway.control.dataplane_http import create_dataplane_router
from gateway.control.grpc_app import create_control_grpc_server
from gateway.control.http_app import create_control_app
from gateway.control.model_control import ModelControl
from gateway.control.probes import probe_forever
from gateway.control.standby import (
    LOST_EXIT,
    AppSlot,
    Standby,
    advertised,
    hold,
    leader_router,
)
from gateway.core import Core
from gateway.embedded import CLOSE_S, EmbeddedServer
from gateway.haproxy.controller import HAProxyController, default_layout
from gateway.haproxy.feed import SnapshotFeed, feed_router
from gateway.haproxy.process import HAProxyProcess, find_haproxy, private_run_dir
from gateway.haproxy.snapshot import sockets_fit
from gateway.lifecycle.assembly import build_warmup, report_failure
from gateway.lifecycle.records.backend import database_url
from gateway.lifecycle.records.leader import Leadership
from gateway.lifecycle.records.tenancy import LiveTenancy
from gateway.local_replica import (
    REPLICA_TOKEN_NAME,
    LocalLayout,
    LocalReplica,
    ReplicaOptions,
    local_layout,
)
from gateway.netaddr import free_ports
from gateway.pools import PoolMember
from gateway.python.forwarder import Forwarder
from gateway.python.grpc_api import create_grpc_server
from gateway.python.http_api import create_http_app
from gateway.python.http_framing import GatewayHttpToolsProtocol
from gateway.upstream.grpc import UpstreamGRPC
from gateway.upstream.http import UpstreamHTTP
from gateway.upstream.triton import MemberAdmin
from gateway.upstream.triton_version import GrpcReuse

log = logging.getLogger(__name__)
REPLICA_METRICS_TIMEOUT_S = 1.0  # a scrape does not wait longer for the local replica's


@dataclass(frozen=True)
class GatewaySettings:
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    probe_interval_s: float = 1.0
    drain_timeout_s: float = 10.0
    upstream_timeout_s: float = 60.0
    log_level: str = "warning"
    # "haproxy": HAProxy carries the hot path; "none": the control plane alone (a
    # cluster's control-plane pod, whose data-plane replicas are ``gateway agent``s)
    data_plane: str = "python"
    max_request_bytes: int = 256 * 1024 * 1024  # larger requests: 413 / RESOURCE_EXHAUSTED
    haproxy_binary: str | None = None
    # HAProxy's files and sockets (default_run_dir when None); with ``haproxy_external``
    # HAProxy runs elsewhere (its own container) on this folder
    haproxy_run_dir: Path | None = None
    haproxy_external: bool = False
    # HAProxy outlives a crash of this process, and a restart adopts it (``gateway
    # serve``); False: it ends with this process (``infergate up``, in-process tests)
    haproxy_detached: bool = False
    # with HAProxy: the Python forwarder in a process of its own that outlives this one
    # (``gateway serve``: gateway/local_replica.py); False: in this process (``infergate
    # up``'s all-in-one, in-process tests)
    local_replica: bool = False
    grpc_upstream_reuse: GrpcReuse = GrpcReuse.AUTO  # Layout.grpc_upstream_reuse
    haproxy_tune: tuple[tuple[str, str], ...] = ()  # Layout.tune
    # the placement scheduler whose newest plan the console's placement page pictures
    scheduler_url: str | None = None
    # HOST[:PORT] the other control-plane replicas reach this one at when it leads (None:
    # the host and ports it serves on): gateway/control/standby.py
    advertise_address: str | None = None


def choose_data_plane(requested: str) -> str:
    """``auto`` -> ``haproxy`` when HAProxy is installed, else ``python`` (said loudly)."""
    if requested not in ("auto", "haproxy", "python", "none"):
        raise ValueError(f"unknown data plane {requested!r} (auto, haproxy, python or none)")
    if requested != "auto":
        return requested
    if find_haproxy() is not None:
        return "haproxy"
    log.warning("HAProxy is not installed: the Python data plane carries inference "
                "(slower; install Debian's 'haproxy' for the native one)")
    print("[infergate] HAProxy not found: falling back to the Python data plane "
          "(apt-get install haproxy for the native one)", flush=True)
    return "python"


async def serve(
    settings: GatewaySettings,
    config: GatewayConfig,
    stop: asyncio.Event | None = None,
    started: asyncio.Event | None = None,
    auth: TokenTable | None = None,
) -> None:
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)

    core = Core.for_config(config)
    native = settings.data_plane == "haproxy"
    # the data plane's replicas carry every call a client makes to infer: the control
    # plane alone runs here, with no forwarder
    control_only = settings.data_plane == "none" or (native and settings.local_replica)
    # the Python forwarder: the data plane itself, or with HAProxy in front its fallback
    forwarder = None if control_only else Forwarder(core)
    upstream_http = UpstreamHTTP(timeout_s=settings.upstream_timeout_s)
    upstream_grpc = UpstreamGRPC()
    admin_client = httpx.AsyncClient(timeout=settings.upstream_timeout_s, trust_env=False)

    auth = auth or TokenTable()
    if not auth.enabled:
        log.warning("no API tokens configured: every endpoint is open (see --tokens)")
    run_dir = haproxy_run_dir(settings) if native else None
    local = local_layout(run_dir, taken=(settings.http_port, settings.grpc_port)) \
        if run_dir is not None and settings.local_replica else None
    if local is not None and auth.enabled:  # the replica's own, to call the control plane
        auth.admit(TokenEntry(name=REPLICA_TOKEN_NAME, scopes=(Scope.ADMIN,),
                              token=local.token))

    async def synthetic_infer(member: PoolMember, path: str, body: bytes,
                              headers: dict[str, str]) -> tuple[int, bytes]:
        answer = await upstream_http.request(member, "POST", path, body, headers)
        return answer.status, answer.body

    load_timeout_s = config.lifecycle.load_timeout_s if config.lifecycle else 600.0
    admin = MemberAdmin(  # the one admin client
        admin_client, load_timeout_s, synthetic_infer,
        live_targets=lambda: {m.spec.grpc_address for m in core.state.members()})
    control = ModelControl(core, admin)
    # with HAProxy in front, this process serves on private loopback ports (kept across
    # restarts where HAProxy and the replica outlive it)
    own_host, own_http, own_grpc = settings.host, settings.http_port, settings.grpc_port
    if local is not None:
        own_host, own_http, own_grpc = "127.0.0.1", local.control_http, local.control_grpc
    elif native:
        own_http, own_grpc = free_ports(2, taken=(settings.http_port, settings.grpc_port))
        own_host = "127.0.0.1"
    slot = AppSlot()  # what the HTTP server serves: a standby's API until this one leads
    http_server = EmbeddedServer(
        uvicorn.Config(
            slot,
            host=own_host,
            port=own_http,
            log_level=settings.log_level,
            access_log=False,
            lifespan="off",
            loop="asyncio",
            http=GatewayHttpToolsProtocol,  # framing as HAProxy and Triton decide it
            # per-request work nobody reads: X-Forwarded parsing, Server and Date headers
            proxy_headers=False,
            server_header=False,
            date_header=False,
        )
    )
    serving: asyncio.Task[Any] | None = None  # the HTTP server, once started
    leadership = _leadership(config, settings)  # several replicas over PostgreSQL: one leads
    standby = None
    if leadership is not None:
        # a standby serves on this process's ports; nowhere where they are private ones
        # chosen anew at each start (HAProxy in front, no replica process): none reach it
        reachable = local is not None or not native
        standby = Standby(leadership, auth, config, (own_host, own_grpc) if reachable else None)
        if reachable:
            slot.app = standby.app
            serving = asyncio.create_task(http_server.serve(), name="http")
            await _started(http_server, serving, own_http)
        if not await standby.until_leading(stop):
            http_server.should_exit = True
            if serving is not None:
                await _closed(serving)
            await standby.close()
            leadership.close()
            await admin.close()
            await admin_client.aclose()
            return
    warmup = build_warmup(config, core, admin, fence=leadership)
    # the tenancy last changed through the API, over the file's, before anything serves
    tenancy = LiveTenancy(core.state, warmup.lifecycle.catalog.store
                          if warmup.lifecycle is not None else None)
    tenancy.restore()
    feed = SnapshotFeed(core, auth)  # for data-plane replicas elsewhere (agents)
    core.state.follow(feed.settle)
    core.state.count_in_flight(feed.in_flight_at)  # theirs: an eviction waits for them
    history, tenant_window = TrafficHistory(core.metrics.registry), TenantWindow(
        core.metrics.registry)
    console = Console(core, auth, history, Sessions(), warmup.lifecycle,
                      SchedulerPlans(settings.scheduler_url, admin_client)
                      if settings.scheduler_url else None, warmup.residency, tenant_window)
    control_app = create_control_app(core, control, upstream_http, auth, warmup.lifecycle,
                                     routers=(feed_router(feed, auth),
                                              leader_router(leadership),
                                              create_dataplane_router(core, auth),
                                              create_console_router(console)),
                                     residency=warmup.residency,
                                     replica_metrics=_replica_metrics(admin_client, local)
                                     if local is not None else None, tenancy=tenancy)
    app = control_app if forwarder is None else create_http_app(
        forwarder, control_app, upstream_http, auth, max_body_bytes=settings.max_request_bytes)
    closing = asyncio.Event()  # the drain is over: the streams still open end
    if standby is not None:
        await standby.hand_over()  # its gRPC relay lets the port go
    if forwarder is None:
        grpc_server, _ = create_control_grpc_server(
            core, control, upstream_grpc, f"{own_host}:{own_grpc}", auth,
            max_message_bytes=settings.max_request_bytes)
    else:
        grpc_server, _ = create_grpc_server(
            forwarder, control, upstream_grpc, f"{own_host}:{own_grpc}", auth,
            max_message_bytes=settings.max_request_bytes, closing=closing,
        )
    await grpc_server.start()
    # preloading holds readiness down until the models are warm
    warmup.start(settings.probe_interval_s)
    # the control plane's API from here on, in one step (a standby's connections carry
    # on), not before the preload began: a replica's snapshot poll parked earlier would
    # be answered the preload's first moment (every model not ready, members unasked)
    slot.app = app
    tasks: list[asyncio.Task[Any]] = [
        serving or asyncio.create_task(http_server.serve(), name="http"),
        *([asyncio.create_task(hold(leadership, _stop_acting), name="leadership")]
          if leadership is not None else []),
        asyncio.create_task(probe_forever(core, settings.probe_interval_s), name="probes"),
        asyncio.create_task(history.run_forever(), name="traffic-history"),
        asyncio.create_task(tenant_window.run_forever(), name="tenant-window"),
    ]
    for task in tasks[1:]:  # a background task that dies says so at once
        task.add_done_callback(report_failure)
    await _started(http_server, tasks[0], own_http)
    replica = None
    if local is not None and run_dir is not None:
        replica = LocalReplica(run_dir, local, ReplicaOptions(
            settings.drain_timeout_s, settings.max_request_bytes, settings.log_level,
            auth.enabled))
        await asyncio.to_thread(replica.start)
    haproxy, programming = None, None
    if native:
        haproxy = _haproxy(settings, core, auth, f"{own_host}:{own_http}",
                           f"{own_host}:{own_grpc}", local)
        try:
            await asyncio.to_thread(haproxy.start, asyncio.get_running_loop())
        except BaseException:
            # HAProxy did not start (a port taken): the replica this start began, in a
            # session of its own, must not outlive it (one adopted was there before)
            if replica is not None and not replica.adopted:
                replica.begin_stop()
                await asyncio.to_thread(replica.wait_stopped)
            raise
        programming = asyncio.create_task(haproxy.run_forever(settings.probe_interval_s),
                                          name="haproxy")
        programming.add_done_callback(report_failure)
        tasks.append(programming)
    keeper = None
    if replica is not None:
        keeper = asyncio.create_task(_keep(replica, feed, settings.probe_interval_s),
                                     name="replica")
        keeper.add_done_callback(report_failure)
    log.warning(
        "infergate gateway (%s data plane): HTTP %s:%d gRPC %s:%d",
        settings.data_plane, settings.host, settings.http_port, settings.host,
        settings.grpc_port,
    )
    if started is not None:
        started.set()
    try:
        await stop.wait()
    finally:
        if keeper is not None:  # (no start after this: tend runs on this loop)
            keeper.cancel()
        if replica is not None:
            replica.begin_stop()  # it drains its own in-flight meanwhile
        await _drain(core, settings.drain_timeout_s, haproxy)
        # HTTP first: its event streams end with an error event that HAProxy relays; the
        # replicas' snapshot polls still open are answered (uvicorn would cancel them)
        feed.close()
        http_server.should_exit = True
        await _closed(tasks[0])
        if replica is not None:  # its event streams end first, with an error event
            await asyncio.to_thread(replica.wait_http_closed)
        if haproxy is not None:
            # its programming ends first (the admin socket goes with the process)
            if programming is not None:
                programming.cancel()
                await _closed(programming)
            # then HAProxy, before the gRPC streams end: it closes its clients'
            # connections (GOAWAY), which a gRPC client reads as UNAVAILABLE; HAProxy
            # 2.6 turns a server's end of a stream the client keeps open into
            # RST_STREAM(CANCEL) (haproxy/haproxy#1219), which clients do not retry
            await asyncio.to_thread(haproxy.stop, CLOSE_S)
        if replica is not None:
            await asyncio.to_thread(replica.wait_stopped)
            if replica.agent_id is not None:  # stopped for good: the next start
                feed.forget(replica.agent_id)  # does not wait for it
        if haproxy is not None and (
                settings.haproxy_run_dir is None or
                haproxy.layout.run_dir != settings.haproxy_run_dir.resolve()):  # default
            shutil.rmtree(haproxy.layout.run_dir, ignore_errors=True)
        closing.set()
        await grpc_server.stop(grace=CLOSE_S)
        await warmup.close()
        for task in tasks[1:]:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.gather(*tasks, return_exceptions=True)
        await upstream_http.aclose()
        await upstream_grpc.close()
        await admin.close()  # its gRPC channels to the members
        await admin_client.aclose()
        if standby is not None:
            await standby.close()


def _leadership(config: GatewayConfig, settings: GatewaySettings) -> Leadership | None:
    """This replica's part in the election, where the records are in PostgreSQL (None:
    SQLite, one control plane), advertising where it is reached if it wins."""
    if config.lifecycle is None:
        return None
    url = database_url(config.lifecycle, os.environ)
    return None if url is None else Leadership(url, advertised=advertised(
        settings.host, settings.http_port, settings.grpc_port, settings.advertise_address))


async def _started(server: EmbeddedServer, serving: asyncio.Task[Any], port: int) -> None:
    """Once the HTTP server listens; its bind error if it cannot."""
    while not server.started:
        if serving.done():
            await serving  # surfaces bind errors
            raise RuntimeError(f"HTTP server on port {port} did not start")
        await asyncio.sleep(0.02)


def _stop_acting(reason: str) -> None:
    """Leadership lost: this process stops at once (another replica may lead already;
    its record writes are refused meanwhile by their term). HAProxy and the data-plane
    replicas go on serving; a restart stands again as a standby."""
    log.error("control plane: leadership lost (%s): exiting", reason)
    logging.shutdown()
    os._exit(LOST_EXIT)


async def _keep(replica: LocalReplica, feed: SnapshotFeed, interval_s: float) -> None:
    """The replica started again whenever it exits (:meth:`LocalReplica.tend`, on this
    loop), for as long as this process serves; the snapshot feed forgets the one that
    exited (nothing waits for its in-flight requests or its acknowledgements)."""
    while True:
        await asyncio.sleep(interval_s)
        gone = replica.tend(time.monotonic())
        if gone is not None:
            feed.forget(gone)


def _replica_metrics(client: httpx.AsyncClient, local: LocalLayout
                     ) -> Callable[[], Awaitable[str | None]]:
    """The local replica's exposition (None while it cannot be reached)."""
    url = f"http://127.0.0.1:{local.replica_status}/metrics"

    async def fetch() -> str | None:
        try:
            answer = await client.get(url, timeout=REPLICA_METRICS_TIMEOUT_S)
        except httpx.HTTPError:
            return None
        return answer.text if answer.status_code == 200 else None

    return fetch


async def _closed(server: asyncio.Task[Any]) -> None:
    """A task (the HTTP server's, HAProxy's programming), once it ended (the server's
    shutdown is bounded by ``CLOSE_S``; one cancelled ends at once)."""
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await server


def default_run_dir(host: str, http_port: int, grpc_port: int) -> Path:
    """HAProxy's folder when none is given: named after what it binds, so that a
    restart of the same command finds the HAProxy a crash left serving; private to this
    user (a folder someone else made or can write is refused)."""
    return private_run_dir(f"infergate-haproxy-{os.getuid()}-{host}-{http_port}-{grpc_port}")


def haproxy_run_dir(settings: GatewaySettings) -> Path:
    """``--haproxy-run-dir``, absolute (HAProxy reads a relative "stats socket" path as
    host:port), or :func:`default_run_dir` where none is given or its socket paths would
    be too long (unix socket paths are limited to ~108 bytes)."""
    given = settings.haproxy_run_dir.resolve() if settings.haproxy_run_dir else None
    if given is not None and not sockets_fit(given):
        if settings.haproxy_external:
            raise ValueError(f"--haproxy-run-dir {given}: too long for a unix socket path")
        given = None
    return given or default_run_dir(settings.host, settings.http_port, settings.grpc_port)


def _haproxy(settings: GatewaySettings, core: Core, auth: TokenTable,
             control_http: str, control_grpc: str,
             local: LocalLayout | None) -> HAProxyController:
    layout = replace(
        default_layout(settings.host, settings.http_port, settings.grpc_port,
                       control_http, control_grpc, haproxy_run_dir(settings)),
        max_body_bytes=settings.max_request_bytes,
        server_timeout_s=max(1, round(settings.upstream_timeout_s)),
        grpc_upstream_reuse=settings.grpc_upstream_reuse,
        tune=settings.haproxy_tune,
    )
    if local is not None:  # what HAProxy cannot route goes to the replica's forwarder
        layout = replace(layout, local_http=f"127.0.0.1:{local.replica_http}",
                         local_grpc=f"127.0.0.1:{local.replica_grpc}")
    process = HAProxyProcess(layout, settings.haproxy_binary,
                             external=settings.haproxy_external,
                             detached=settings.haproxy_detached)
    return HAProxyController(core, auth, layout, process)


async def _drain(core: Core, timeout_s: float,
                 haproxy: HAProxyController | None = None) -> None:
    """Readiness false at once; wait (bounded) until no request is in flight, in this
    process or in HAProxy."""
    core.state.start_draining()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        held = sum(m.in_flight for m in core.state.members())
        if haproxy is not None:
            held += await haproxy.in_flight()
        if not held:
            return
        if loop.time() >= deadline:
            log.warning("drain timeout: %d requests still in flight", held)
            return
        await asyncio.sleep(0.05)
