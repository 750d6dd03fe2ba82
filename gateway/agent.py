"""The data-plane agent: one replica of the gateway's data plane in Kubernetes.

Each data-plane pod runs HAProxy and this thin agent beside it. The agent holds no state
of its own: it follows the versioned snapshot the control plane publishes (long-polling
``GET /v1/dataplane/snapshot``), moves its HAProxy to each new one, and keeps the last
one on disk, so that it starts and keeps routing on it while the control plane is down.
What HAProxy cannot route (streams, ``generate``, misses, a rollout's shadow share
once the control plane is away, gRPC detours) and every call that is not the control
plane's (health, metadata: ``gateway/policy/planes.py``) go to the replica's own Python
forwarder in this process (:class:`gateway.replica.ReplicaForwarder`), built from the
gateway's configuration (fetched from the control plane once, kept beside the
snapshot) and moved by every snapshot. Only the control plane's own calls (the
lifecycle API, uploads, the console, the repository API) go to its Service: while it is
down they fail within a second saying so, and everything else goes on.

Every second the agent reports what its replica served (``POST /v1/dataplane/report``):
user requests per model, which the residency's demand counts, and the answers per
version of the models under rollout, which the rollout's verdicts judge. A rollout's
split carries a lease: with no fresh verdict for ``LEASE_S`` (the control plane gone),
the replica sends the model's traffic to stable by itself (``fail_safe``).

Its own port (``--status-port``) serves ``/metrics`` (this replica's request counts and
latency from HAProxy's per-request lines) and ``/status`` (the snapshot it routes by).

With tenants, a replica lends the room of idle tenants by what it sees itself: the
tenants active at this replica (requests in flight or arrived lately, read off its
``st_route`` table every ``observe_s``) set the shares it applies
(``TenancyState.with_shares``, ``gateway/policy/tenancy.py``'s rule), as the control
plane does for its own HAProxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import os
import shutil
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse

from gateway.config import GatewayConfig
from gateway.embedded import EmbeddedServer
from gateway.files import write_atomically
from gateway.haproxy.drain import BUSY_POLL_S, LeftHoldings, Pair, encode_busy
from gateway.haproxy.process import HAProxyProcess, private_run_dir
from gateway.haproxy.proxy import SnapshotProxy
from gateway.haproxy.snapshot import (
    LEASE_S,
    Layout,
    Snapshot,
    Versions,
    fail_safe,
    residency_suffix,
    server_name,
    snapshot_from_dict,
    snapshot_to_dict,
    sockets_fit,
)
from gateway.haproxy.telemetry import LogReceiver, RequestLog
from gateway.metrics import GatewayMetrics
from gateway.netaddr import free_port, join_host_port
from gateway.policy.tenancy import TenantActivity
from gateway.replica import ReplicaForwarder, ReplicaSettings, watch_rollouts
from gateway.telemetry import HAProxyCounts, Telemetry, VersionTally, read_haproxy
from gateway.upstream.triton_version import GrpcReuse, VersionWatch

log = logging.getLogger(__name__)
LEASE_CHECK_S = 1.0  # how often the rollouts' leases are looked at
REPORT_S = 1.0  # how often what the replica served is reported to the control plane


@dataclass(frozen=True)
class AgentSettings:
    control_http: str  # the control plane's HTTP address, host:port
    control_grpc: str  # its gRPC address, host:port
    state_dir: Path  # the last snapshot, HAProxy's files and sockets
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    status_port: int = 9101
    token: str | None = None  # an admin-scoped token when the control plane has auth on
    wait_s: float = 20.0  # long-poll
    retry_s: float = 1.0
    drain_timeout_s: float = 10.0
    max_request_bytes: int = 256 * 1024 * 1024
    # HAProxy in its own container on state_dir/haproxy: write its files, reload it
    # through its master socket (Kubernetes); else the agent starts HAProxy itself
    haproxy_external: bool = False
    grpc_upstream_reuse: GrpcReuse = GrpcReuse.AUTO  # Layout.grpc_upstream_reuse
    haproxy_tune: tuple[tuple[str, str], ...] = ()  # Layout.tune
    observe_s: float = 1.0
    upstream_timeout_s: float = 60.0  # the replica's forwarder's bound on a member's answer
    canary_lease_s: float = LEASE_S  # no verdict for this long: the candidate's share to stable
    agent_id: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    # False: no HAProxy here; the replica's forwarder alone, on host:http_port and
    # host:grpc_port, behind an HAProxy the control plane programs (``gateway serve``'s
    # layout on one node, gateway/local_replica.py)
    haproxy: bool = True


class Agent:
    def __init__(self, settings: AgentSettings, metrics: GatewayMetrics | None = None) -> None:
        self.settings = settings
        self.replica: ReplicaForwarder | None = None  # built from the configuration (run)
        self.telemetry = Telemetry(metrics) if metrics is not None else Telemetry()
        self.metrics = self.telemetry.metrics
        run_dir = settings.state_dir / "haproxy"
        if settings.haproxy and not sockets_fit(run_dir):  # one per state folder, reused
            digest = hashlib.sha256(str(settings.state_dir.resolve()).encode()).hexdigest()
            run_dir = private_run_dir(f"infergate-agent-{os.getuid()}-{digest[:16]}",
                                      "pass a shorter --state-dir")
        self.layout = Layout(
            http_bind=f"{settings.host}:{settings.http_port}",
            grpc_bind=f"{settings.host}:{settings.grpc_port}",
            control_http=settings.control_http, control_grpc=settings.control_grpc,
            run_dir=run_dir, log_address=f"127.0.0.1:{free_port()}",
            max_body_bytes=settings.max_request_bytes,
            grpc_upstream_reuse=settings.grpc_upstream_reuse, tune=settings.haproxy_tune,
        )
        if settings.haproxy_external and run_dir != settings.state_dir / "haproxy":
            raise ValueError(f"--state-dir {settings.state_dir}: too long for unix sockets")
        self.proxy: SnapshotProxy | None = self._proxy() if settings.haproxy else None
        self.version = ""
        self.received: Snapshot | None = None  # the control plane's, before local shares
        self.activity = TenantActivity()
        self._active: dict[str, frozenset[str]] = {}  # pool -> tenants, as last applied
        self.control_plane_seen_at: float | None = None
        # (the control plane's clock, ours) at its last snapshot: the leases' clock
        self._control_clock: tuple[float, float] | None = None
        self.routed_version = ""  # what HAProxy and the forwarder route by (fail_safe)
        # holdings routed before and not now, until this replica's requests there end:
        # each poll says them, an eviction waits for them (gateway/haproxy/drain.py)
        self.left = LeftHoldings()
        # HAProxy's answers per version of the models under rollout (its log lines): the
        # report carries them to the control plane's verdicts, beside the forwarder's
        self.tally = VersionTally()
        self._receiver = LogReceiver(self.layout.log_address,
                                     RequestLog(self.metrics, tally=self.tally))
        self._reported: dict[str, float] = {}  # user requests per model, at the last report
        # what this replica does with each member's gRPC connections (its own setting
        # over the versions the control plane read)
        self.versions = VersionWatch(self.metrics.member_info, settings.grpc_upstream_reuse)
        self._applying = asyncio.Lock()  # one snapshot applied at a time (:meth:`_apply`)
        self._version = Versions()  # each snapshot's version, hashed once
        # past its waits for the control plane (first configuration, first snapshot): a
        # stop drains; before, there is nothing to drain and it ends at once
        self.serving = False

    def _proxy(self) -> SnapshotProxy:
        return SnapshotProxy(
            self.layout, HAProxyProcess(self.layout, external=self.settings.haproxy_external))

    def _note_versions(self, snapshot: Snapshot) -> None:
        members = [(p.name, join_host_port(m.host, m.grpc_port), m.triton_version)
                   for p in snapshot.pools for m in p.members]
        self.versions.observe(members)
        self.versions.forget({(pool, member) for pool, member, _ in members})

    @property
    def snapshot_file(self) -> Path:
        return self.settings.state_dir / "snapshot.json"

    # -- the control plane -------------------------------------------------------------
    async def fetch(self, client: httpx.AsyncClient, wait_s: float,
                    busy: dict[Pair, int] | None = None) -> Snapshot | None:
        """The next snapshot (None: unchanged after ``wait_s``); raises httpx errors.
        ``busy``: this replica's requests at holdings it no longer routes."""
        resp = await client.get(
            f"http://{self.settings.control_http}/v1/dataplane/snapshot",
            params={"have": self.version, "agent": self.settings.agent_id, "wait": wait_s,
                    "busy": encode_busy(busy or {})},
            headers=self._auth_headers(), timeout=wait_s + 10,
        )
        self.control_plane_seen_at = time.time()
        if resp.status_code == 304:
            return None
        resp.raise_for_status()
        body = resp.json()
        if "now" in body:  # the control plane's clock, which its rollouts' leases are on
            self._control_clock = (float(body["now"]), time.monotonic())
        snapshot = snapshot_from_dict(body["snapshot"])
        if self._version(snapshot, body["snapshot"]) != body["version"]:
            raise ValueError("snapshot does not match its version")
        return snapshot

    @property
    def config_file(self) -> Path:
        return self.settings.state_dir / "config.json"

    def _save(self, snapshot: Snapshot) -> None:
        write_atomically(self.snapshot_file, json.dumps(snapshot_to_dict(snapshot)))

    async def first_config(self, client: httpx.AsyncClient) -> GatewayConfig:
        """The gateway's configuration: the control plane's (kept for the next start),
        else the one kept last time (the control plane is down), else the control
        plane's once it answers."""
        while True:
            try:
                resp = await client.get(f"http://{self.settings.control_http}/v1/dataplane/config",
                                        headers=self._auth_headers(), timeout=5.0)
                resp.raise_for_status()
                config = GatewayConfig.model_validate(resp.json()["config"])
                await asyncio.to_thread(write_atomically, self.config_file,
                                        json.dumps(resp.json()["config"]))
                return config
            except (httpx.HTTPError, ValueError, KeyError) as exc:
                with contextlib.suppress(OSError, ValueError):
                    saved = GatewayConfig.model_validate_json(self.config_file.read_text())
                    log.warning("agent: starting on the configuration kept last time (%s)",
                                exc)
                    return saved
                log.warning("agent: no configuration yet from %s: %s",
                            self.settings.control_http, exc)
            await asyncio.sleep(self.settings.retry_s)

    def _auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.settings.token}"} if self.settings.token \
            else {}

    def _saved(self) -> Snapshot | None:
        with contextlib.suppress(OSError, ValueError, json.JSONDecodeError):
            return snapshot_from_dict(json.loads(self.snapshot_file.read_text()))
        return None

    async def first_snapshot(self, client: httpx.AsyncClient) -> Snapshot:
        """The one saved last time, else the control plane's (waiting for it)."""
        saved = self._saved()
        if saved is not None:
            log.warning("agent: starting on the saved snapshot %s", self._version(saved))
            return saved
        while True:
            try:
                snapshot = await self.fetch(client, 0.0)
                if snapshot is not None:
                    return snapshot
            except (httpx.HTTPError, ValueError, KeyError) as exc:
                log.warning("agent: no snapshot yet from %s: %s", self.settings.control_http,
                            exc)
            await asyncio.sleep(self.settings.retry_s)

    async def _supervised(self, name: str, loop: Callable[[], Awaitable[None]]) -> None:
        """One of the agent's loops, for good: one that fails is logged with its
        traceback and started again after ``retry_s``. (A loop that raised used to end
        unseen: the follower once did, on a failed write of the snapshot file, and the
        replica routed by a stale snapshot until it was restarted.)"""
        while True:
            try:
                await loop()
            except Exception:  # noqa: BLE001 - logged whole; the loop goes on
                log.exception("agent: its %s loop failed; starting it again in %.1f s",
                              name, self.settings.retry_s)
            await asyncio.sleep(self.settings.retry_s)

    async def _follow(self, client: httpx.AsyncClient) -> None:
        while True:
            busy = await self.busy()
            try:
                snapshot = await self.fetch(
                    client, BUSY_POLL_S if busy else self.settings.wait_s, busy)
            except (httpx.HTTPError, ValueError, KeyError) as exc:
                log.warning("agent: control plane unreachable (%s); routing on snapshot %s",
                            exc, self.version)
                await asyncio.sleep(self.settings.retry_s)
                continue
            if snapshot is not None:
                await self._apply(snapshot)

    async def busy(self) -> dict[Pair, int]:
        """This replica's requests still in flight at holdings it no longer routes: its
        forwarder's, and its HAProxy's (their residency backends' servers)."""
        if not self.left.pending:
            return {}
        at_server: dict[tuple[str, str, str], int] = {}
        if self.proxy is not None:
            try:
                at_server = read_haproxy(await self.proxy.api.aquery("show stat"), "",
                                         False).at_model_server
            except OSError as exc:  # counted as busy until HAProxy answers
                log.warning("agent: HAProxy stats unavailable: %s", exc)
                return self.left.busy(lambda pair: 1)
        members = {} if self.replica is None else {
            (m.pool, server_name(m.key)): m for m in self.replica.core.state.members()}

        def in_flight(pair: Pair) -> int:
            model, pool, server = pair
            member = members.get((pool, server))
            here = 0 if member is None else member.model_in_flight.get(model, 0)
            return here + at_server.get((pool, residency_suffix(model), server), 0)

        return self.left.busy(in_flight)

    async def _observe(self) -> None:
        """This replica's share of each pool's load, every second: requests HAProxy has
        at the pool's members over the pool's capacity. Prometheus sums the gauge over
        replicas and the control plane (which adds Triton's own queues): the HPA's
        ``sum by (pool)``."""
        while True:
            await asyncio.sleep(self.settings.observe_s)
            assert self.proxy is not None  # (observed only where HAProxy runs)
            snapshot = self.proxy.applied
            if snapshot is None:
                continue
            try:
                api = self.proxy.api
                queries = [api.aquery("show stat"), api.aquery("show table st_route")]
                if snapshot.tenancy is not None:  # the arrivals the tenancy rules refused
                    queries.append(api.aquery("show table st_seen"))
                stats_text, routes_text, *refused = await asyncio.gather(*queries)
            except OSError as exc:
                log.warning("agent: HAProxy stats unavailable: %s", exc)
                continue
            counts = read_haproxy(stats_text, routes_text, snapshot.tenancy is not None,
                                  "".join(refused))
            for pool in snapshot.pools:
                self.metrics.saturation.labels(pool.name).set(
                    counts.held.get(pool.name, 0) / max(1, pool.capacity))
            await self._observe_routes(snapshot, counts)

    async def _observe_routes(self, snapshot: Snapshot, counts: HAProxyCounts) -> None:
        """In flight per model and pool; the tenants active here, whose shares this
        replica applies once the set changes."""
        now = time.monotonic()
        self.telemetry.routes(counts)
        for pool_name, tenant in counts.active:
            self.activity.note(pool_name, tenant, now)
        if snapshot.tenancy is not None and self.received is not None:
            active = {p.name: self.activity.active(p.name, now) for p in snapshot.pools}
            if active != self._active:
                await self._apply(self.received)

    def _localized(self, snapshot: Snapshot) -> Snapshot:
        """The control plane's snapshot with the shares of the tenants active here."""
        if snapshot.tenancy is None or not snapshot.tenancy.enabled:
            return snapshot
        now = time.monotonic()
        self._active = {p.name: self.activity.active(p.name, now) for p in snapshot.pools}
        return replace(snapshot, tenancy=snapshot.tenancy.with_shares(self._active))

    def control_now(self) -> float:
        """The control plane's clock as this replica estimates it: its last snapshot's
        ``now`` plus what our monotonic clock counted since (the skew between the two
        machines cancels); ``inf`` before any (started on the saved snapshot)."""
        if self._control_clock is None:
            return math.inf
        at, seen = self._control_clock
        return at + time.monotonic() - seen

    def _routed(self, snapshot: Snapshot) -> Snapshot:
        """What to route by: ``snapshot`` with every rollout whose lease ran out moved to
        stable (canaries fail safe while the control plane is away)."""
        return fail_safe(snapshot, self.control_now(), self.settings.canary_lease_s)

    async def _apply(self, snapshot: Snapshot) -> None:
        """Route by ``snapshot`` (the newest received), one at a time: the follower, the
        leases' watch and the tenants' observer all apply, and interleaved at their
        awaits, an older snapshot's apply could end after a newer one's (or two saves
        of the snapshot file run at once). One that waited while a newer one arrived
        leaves it to that one's caller."""
        self.received = snapshot
        async with self._applying:
            if self.received is snapshot:
                await self._apply_now(snapshot)

    async def _apply_now(self, snapshot: Snapshot) -> None:
        watch_rollouts(self.tally, snapshot)
        routed = self._routed(snapshot)
        if routed is not snapshot and self.routed_version != self._version(routed):
            stale = [r.model for r in snapshot.routes if r not in routed.routes]
            log.warning("agent: no verdict from the control plane for %.0f s: %s served by "
                        "stable alone", self.settings.canary_lease_s,
                        ", ".join(stale) or "the default route")
        if self.replica is not None:
            self.replica.follow(routed)
        how = "forwarder only"
        if self.proxy is not None:
            try:
                how = await self.proxy.amove(self._localized(routed))
            except Exception:  # noqa: BLE001 - keep routing on the last good snapshot
                log.exception("agent: HAProxy refused snapshot %s", self._version(snapshot))
                await asyncio.sleep(self.settings.retry_s)
                return
        self.left.applied(routed)
        await asyncio.to_thread(self._save, snapshot)
        self.version = self._version(snapshot)  # what the feed sent: what we report
        self.routed_version = self._version(routed)
        self._note_versions(snapshot)
        log.info("agent: routing on snapshot %s (%s)", self.version, how)

    def report(self) -> dict[str, Any] | None:
        """What this replica served since the last report (None: nothing): user
        requests per model (its request counter's growth), the answers per version of
        the models under rollout (HAProxy's and the forwarder's), and the shadow step's
        pairs its forwarder mirrored (stable's and the candidate's answers)."""
        totals: dict[str, float] = {}
        for family in self.metrics.requests.collect():
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.labels.get("traffic") == "user":
                    model = sample.labels["model"]
                    totals[model] = totals.get(model, 0.0) + sample.value
        served = {m: int(n - self._reported.get(m, 0.0)) for m, n in totals.items()
                  if n - self._reported.get(m, 0.0) >= 1}
        self._reported = {m: self._reported.get(m, 0.0) + served.get(m, 0)
                          for m in totals}
        answers: dict[str, dict[int, list[tuple[bool, float]]]] = self.tally.take()
        shadows: dict[str, dict[str, Any]] = {}
        if self.replica is not None:
            state = self.replica.core.state
            for model, versions in state.tally.take().items():
                for version, more in versions.items():
                    answers.setdefault(model, {}).setdefault(version, []).extend(more)
            for model, shadow in state.shadows.items():
                pairs, skipped = shadow.tally.take()
                if pairs or skipped:
                    shadows[model] = {"stable": shadow.stable, "candidate": shadow.candidate,
                                      "pairs": pairs, "skipped": skipped}
        if not (served or answers or shadows):
            return None
        return {"served": served, "answers": answers, "shadows": shadows}

    async def _report(self, client: httpx.AsyncClient) -> None:
        """Every second, what this replica served, to the control plane
        (``POST /v1/dataplane/report``): the residency's demand and the rollouts'
        verdicts count the traffic the replicas carry. Lost while it is away (no verdict
        is taken then; demand resumes with the next report)."""
        while True:
            await asyncio.sleep(REPORT_S)
            body = self.report()
            if body is None:
                continue
            with contextlib.suppress(httpx.HTTPError):
                await client.post(f"http://{self.settings.control_http}/v1/dataplane/report",
                                  json=body, headers=self._auth_headers(), timeout=REPORT_S * 2)

    async def _watch_leases(self) -> None:
        """Every second: a rollout whose lease ran out meanwhile moves to stable (no
        snapshot arrives when the control plane is gone, which is when it matters)."""
        while True:
            await asyncio.sleep(LEASE_CHECK_S)
            received = self.received
            if received is not None and self._version(self._routed(received)) != \
                    self.routed_version:
                await self._apply(received)

    # -- its own status port -----------------------------------------------------------
    def status_app(self) -> FastAPI:
        app = FastAPI(title="infergate data-plane agent")

        @app.get("/status")
        async def status() -> JSONResponse:
            replica = self.replica
            phase = "serving" if replica is None or not replica.core.state.draining else \
                "http_closed" if replica.http_closed else "draining"
            return JSONResponse({"agent": self.settings.agent_id, "version": self.version,
                                 "phase": phase,
                                 "control_plane_seen_at": self.control_plane_seen_at,
                                 "reloads": self.proxy.reloads if self.proxy else 0,
                                 # where HAProxy's files are (the state folder's, or a
                                 # temporary one where that is too long for sockets)
                                 "haproxy_run_dir": str(self.layout.run_dir)
                                 if self.proxy else None})

        @app.get("/ready")
        async def ready() -> Response:
            """200 once this replica routes: a snapshot applied and HAProxy answering."""
            try:
                if self.proxy is not None:
                    await self.proxy.api.aquery("show info")
            except OSError:
                return Response(status_code=503)
            return Response(status_code=200 if self.version else 503)

        @app.get("/metrics")
        async def metrics() -> Response:
            return Response(self.metrics.render(),
                            media_type="text/plain; version=0.0.4; charset=utf-8")

        return app

    async def _start_replica(self, client: httpx.AsyncClient) -> ReplicaForwarder:
        settings = self.settings
        # without HAProxy here, the forwarder serves the replica's own ports
        ports = None if settings.haproxy else (
            f"{settings.host}:{settings.http_port}", f"{settings.host}:{settings.grpc_port}")
        replica = ReplicaForwarder(await self.first_config(client), ReplicaSettings(
            settings.control_http, settings.token, settings.upstream_timeout_s,
            settings.drain_timeout_s, settings.max_request_bytes), self.metrics, ports)
        await replica.start()
        if settings.haproxy:
            # HAProxy sends what it cannot route to it: its ports are in HAProxy's config
            self.layout = replace(self.layout, local_http=replica.http_address,
                                  local_grpc=replica.grpc_address)
            self.proxy = self._proxy()
        return replica

    async def run(self, stop: asyncio.Event) -> None:
        async with httpx.AsyncClient(trust_env=False) as client:
            self.replica = await self._start_replica(client)
            snapshot = await self.first_snapshot(client)
            self.serving = True  # from here on a stop drains, in order
            self.received = snapshot
            routed = self._routed(snapshot)
            self.replica.follow(routed)
            self.left.applied(routed)
            if self.proxy is not None:
                self._receiver.start()
                await asyncio.to_thread(self.proxy.start, self._localized(routed))
            await asyncio.to_thread(self._save, snapshot)
            self.version = self._version(snapshot)
            self.routed_version = self._version(routed)
            self._note_versions(snapshot)
            status = EmbeddedServer(uvicorn.Config(
                self.status_app(), host=self.settings.host, port=self.settings.status_port,
                log_level="warning", lifespan="off", access_log=False))
            loops: dict[str, Callable[[], Awaitable[None]]] = {
                "follow": lambda: self._follow(client), "leases": self._watch_leases,
                "report": lambda: self._report(client)}
            if self.proxy is not None:
                loops["observe"] = self._observe
            tasks = [asyncio.create_task(self._supervised(name, loop), name=name)
                     for name, loop in loops.items()]
            served = asyncio.create_task(status.serve(), name="status")
            log.warning("infergate data-plane agent: HTTP %s gRPC %s%s, control plane %s, "
                        "snapshot %s", self.layout.http_bind, self.layout.grpc_bind,
                        "" if self.proxy else " (its forwarder alone)",
                        self.settings.control_http, self.version)
            try:
                await stop.wait()
            finally:
                for task in tasks:
                    task.cancel()
                # HAProxy drains and stops while the forwarder still serves what it sends
                await asyncio.gather(
                    self.replica.drain(self.settings.drain_timeout_s),
                    *([asyncio.to_thread(self.proxy.process.stop,
                                         self.settings.drain_timeout_s)]
                      if self.proxy is not None else []))
                await self.replica.stop()
                if self.proxy is not None:
                    self._receiver.stop()
                    if not self.layout.run_dir.is_relative_to(self.settings.state_dir):
                        # the temporary folder of a state folder too long for sockets:
                        # HAProxy ended with us, nothing in it outlives this run
                        shutil.rmtree(self.layout.run_dir, ignore_errors=True)
                status.should_exit = True  # (its phase was read until now)
                tasks.append(served)
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await asyncio.gather(*tasks, return_exceptions=True)


async def run_agent(settings: AgentSettings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    await run_until_stopped(Agent(settings), stop)


async def run_until_stopped(agent: Agent, stop: asyncio.Event) -> None:
    """The agent until ``stop``: one serving drains and stops in order (:meth:`Agent.run`);
    one still starting (waiting for a control plane that does not answer: its first
    configuration or snapshot) has nothing to drain and ends at once. (It used to wait
    for the control plane for good, deaf to SIGTERM: a replica whose control plane
    failed to start outlived it.)"""
    running = asyncio.ensure_future(agent.run(stop))
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({running, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not running.done() and not agent.serving:
            running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
    finally:
        stopping.cancel()


