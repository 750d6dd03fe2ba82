"""Run the gateway: HTTP (uvicorn) and gRPC (grpc.aio) on one event loop.

Shutdown (SIGTERM/SIGINT or ``stop`` set): readiness turns false at once, new work is
still served while in-flight requests finish for up to ``drain_timeout_s``, then both
servers close.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import uvicorn

from gateway.control import ModelControl
from gateway.dataplane import DataPlane
from gateway.grpc_api import UpstreamGRPC, create_grpc_server
from gateway.http_api import UpstreamHTTP, create_http_app
from gateway.lifecycle.auth import TokenTable
from gateway.lifecycle.control_plane import build_control_plane
from gateway.metrics import create_metrics
from gateway.pools import GatewayConfig, PoolMember, build_pools
from gateway.probes import probe_forever

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GatewaySettings:
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    probe_interval_s: float = 1.0
    drain_timeout_s: float = 10.0
    upstream_timeout_s: float = 60.0
    log_level: str = "warning"


def build_dataplane(config: GatewayConfig) -> DataPlane:
    return DataPlane(config=config, pools=build_pools(config.pools), metrics=create_metrics())


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

    dataplane = build_dataplane(config)
    upstream_http = UpstreamHTTP(timeout_s=settings.upstream_timeout_s)
    upstream_grpc = UpstreamGRPC()
    admin_client = httpx.AsyncClient(timeout=settings.upstream_timeout_s, trust_env=False)
    control = ModelControl(dataplane, admin_client)
    auth = auth or TokenTable()
    if not auth.enabled:
        log.warning("no API tokens configured: every endpoint is open (see --tokens)")

    async def synthetic_infer(member: PoolMember, path: str, body: bytes,
                              headers: dict[str, str]) -> tuple[int, bytes]:
        answer = await upstream_http.request(member, "POST", path, body, headers)
        return answer.status, answer.body

    control_plane = build_control_plane(config, dataplane, admin_client, synthetic_infer)
    app = create_http_app(dataplane, control, upstream_http, auth, control_plane.lifecycle)
    http_server = EmbeddedServer(
        uvicorn.Config(
            app,
            host=settings.host,
            port=settings.http_port,
            log_level=settings.log_level,
            access_log=False,
            lifespan="off",
            loop="asyncio",
            http="httptools",
            # per-request work nobody reads: X-Forwarded parsing, Server and Date headers
            proxy_headers=False,
            server_header=False,
            date_header=False,
        )
    )
    grpc_server, _ = create_grpc_server(
        dataplane, control, upstream_grpc, f"{settings.host}:{settings.grpc_port}", auth
    )
    await grpc_server.start()
    control_plane.start()  # preloading holds readiness down until the models are warm
    tasks: list[asyncio.Task[Any]] = [
        asyncio.create_task(http_server.serve(), name="http"),
        asyncio.create_task(probe_forever(dataplane, settings.probe_interval_s), name="probes"),
    ]
    while not http_server.started:
        if tasks[0].done():
            await tasks[0]  # surfaces bind errors
            raise RuntimeError(f"HTTP server on port {settings.http_port} did not start")
        await asyncio.sleep(0.02)
    log.warning(
        "infergate gateway: HTTP %s:%d gRPC %s:%d",
        settings.host, settings.http_port, settings.host, settings.grpc_port,
    )
    if started is not None:
        started.set()
    try:
        await stop.wait()
    finally:
        await _drain(dataplane, settings.drain_timeout_s)
        await control_plane.close()
        http_server.should_exit = True
        await grpc_server.stop(grace=1.0)
        for task in tasks[1:]:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.gather(*tasks, return_exceptions=True)
        await upstream_http.aclose()
        await upstream_grpc.close()
        await admin_client.aclose()


class EmbeddedServer(uvicorn.Server):
    """uvicorn without its own signal handling: this loop owns SIGTERM/SIGINT, so that
    draining (readiness false, in-flight finishing) happens before the listener closes."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def _drain(dataplane: DataPlane, timeout_s: float) -> None:
    dataplane.draining = True
    deadline = asyncio.get_running_loop().time() + timeout_s
    while any(m.in_flight for m in dataplane.members()):
        if asyncio.get_running_loop().time() >= deadline:
            log.warning("drain timeout: %d requests still in flight",
                        sum(m.in_flight for m in dataplane.members()))
            return
        await asyncio.sleep(0.05)
