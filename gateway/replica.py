"""A data-plane replica's own Python forwarder: what HAProxy cannot route, served by the
replica itself, so that it stands alone while the control plane is away.

HAProxy carries inference. What it cannot route it sends here, never to the control
plane: ``ModelStreamInfer`` streams, ``generate`` and ``generate_stream``, a miss (a
model no member holds), a rollout's shadow share, gRPC detours (a message too large or
cut short); and so every call a client makes besides inference that is not the control
plane's (``gateway/policy/planes.py``): health and readiness (this replica's view),
server and model metadata, readiness, config and statistics (asked of the members).

The forwarder is the Python data plane's (``gateway/python``), over a state of its own
(:class:`~gateway.core.Core`) built from the gateway's configuration (fetched from the
control plane once, and kept beside the last snapshot) and moved by every snapshot the
agent follows (:func:`apply_snapshot`): the members' health, the models' pools,
readiness, holders, rollout split and shadow, the tokens. It probes nothing itself.

A miss waits here (:class:`ControlPlaneMisses`): the replica asks the control plane to
load the model (``POST /v1/dataplane/misses/<model>``: its waiting room loads it once
however many ask). The answer names the members that hold it: the request goes to them,
whether or not this replica's snapshot names them yet (an answer naming none it knows is
followed by its snapshot until that does), answered by 19/20 of the request's deadline
whatever happens (the waiting room's own bound). When the control plane cannot be
reached, the miss is answered at once (503 / ``UNAVAILABLE``) saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI

from gateway.auth import Principal, Scope, TokenTable
from gateway.config import GatewayConfig
from gateway.control.http_app import add_serving_routes
from gateway.control.model_control import ModelControl
from gateway.core import Core
from gateway.embedded import CLOSE_S, EmbeddedServer
from gateway.errors import DeadlineExceeded, GatewayError, ModelNotFound, Overloaded, Unavailable
from gateway.haproxy.snapshot import Snapshot, server_name
from gateway.metrics import GatewayMetrics
from gateway.netaddr import free_ports, split_host_port
from gateway.policy import readiness
from gateway.policy.deadline import last_share_s
from gateway.policy.rollout import Shadow, Split
from gateway.python.forwarder import Forwarder
from gateway.python.grpc_api import create_grpc_server
from gateway.python.http_api import create_http_app
from gateway.python.http_framing import GatewayHttpToolsProtocol
from gateway.state import GatewayState
from gateway.telemetry import VersionTally
from gateway.upstream.grpc import UpstreamGRPC
from gateway.upstream.http import UpstreamHTTP
from gateway.upstream.triton import MemberAdmin

log = logging.getLogger(__name__)
CONNECT_S = 1.0  # a miss waits this long to reach the control plane before it is answered
NO_DEADLINE_WAIT_S = 60.0  # what a miss without a deadline waits at most for the control plane
CONTROL_DOWN = ("model '{model}' is held by no member now, and the gateway's control plane, "
                "which loads it, cannot be reached ({why}); retry shortly")


def apply_snapshot(state: GatewayState, snapshot: Snapshot,
                   previous: Snapshot | None = None) -> None:
    """Move ``state`` to what ``snapshot`` says (``previous``: the one applied before,
    whose routes that are gone are undone): the only writer of a replica's state."""
    pools = {p.name: p for p in state.pools}
    for pool_state in snapshot.pools:
        pool = pools.get(pool_state.name)
        if pool is None:
            continue
        if pool.spec.dns is not None:
            ports = pool.spec.dns_ports
            state.resolved(pool, [ports.model_copy(update={
                "host": m.host, "http_port": m.http_port, "grpc_port": m.grpc_port})
                for m in pool_state.members])
        by_name = {m.name: m for m in pool_state.members}
        for member in pool.members:
            seen = by_name.get(server_name(member.key))
            member.routed(seen is not None and seen.routable,
                          None if seen is None else seen.triton_version)
    keys = {server_name(m.key): m.key for m in state.members()}
    routes = {r.model: r for r in snapshot.routes}
    for model, route in routes.items():
        state.serve(model, [pool for pool, _ in route.pools])
        if route.not_ready is None:
            state.mark_ready(model)
        else:
            state.mark_not_ready(model, route.not_ready)
        split = None if route.split is None else Split(*route.split)
        if state.split_of(model) != split:
            state.set_split(model, split)
        _apply_shadow(state, model, route.shadow, split)
        if route.holders is not None:
            state.set_holders(model, {keys[n] for _, names in route.holders for n in names
                                      if n in keys})
    for route in previous.routes if previous is not None else ():
        if route.model not in routes:  # gone: nothing of it stays
            state.mark_ready(route.model)
            if state.split_of(route.model) is not None:
                state.set_split(route.model, None)
            _apply_shadow(state, route.model, None, None)
    levels = dict(snapshot.levels)  # as the control plane's members read them (no probes here)
    for member in state.members():
        for model in levels.keys() | member.priority_levels.keys():
            member.read_levels(model, levels.get(model, 0), state.clock())
    watch_rollouts(state.tally, snapshot)
    # ready as the control plane is: once no model is still preloading at its start-up
    state.set_preloaded(not any(r.not_ready == readiness.PRELOADING for r in snapshot.routes))


def watch_rollouts(tally: VersionTally, snapshot: Snapshot) -> None:
    """``tally`` keeps the answers of the models under rollout in ``snapshot`` (a split),
    and only theirs: what the replica reports to the control plane's verdicts."""
    rolling = {r.model for r in snapshot.routes if r.split is not None}
    for model in tally.watched() - rolling:
        tally.forget(model)
    for model in rolling:
        tally.watch(model)


def _apply_shadow(state: GatewayState, model: str, percent: int | None,
                  split: Split | None) -> None:
    current = state.shadow_of(model)
    if percent is None or split is None:
        if current is not None:
            state.set_shadow(model, None)
        return
    if current is None or (current.stable, current.candidate, current.percent) != (
            split.stable, split.candidate, percent):
        metric = current.metric if current is not None else "cosine"
        state.set_shadow(model, Shadow(split.stable, split.candidate, percent, metric))


def snapshot_tokens(snapshot: Snapshot) -> TokenTable:
    """The tokens the snapshot names, by digest (``"<scopes>;<name>"`` each)."""
    digests = []
    for digest, text in snapshot.tokens:
        scopes, _, name = text.partition(";")
        digests.append((bytes.fromhex(digest), Principal(
            name, frozenset(Scope(s) for s in scopes.split(",") if s))))
    return TokenTable.of_digests(digests, snapshot.predict_gated)


class ControlPlaneMisses:
    """A replica's misses (:meth:`GatewayState.on_miss`): the control plane loads, this
    replica follows its snapshot until a member holds the model."""

    def __init__(self, state: GatewayState, client: httpx.AsyncClient, control_http: str,
                 token: str | None = None) -> None:
        self.state, self.client = state, client
        self.url = f"http://{control_http}/v1/dataplane/misses"
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._applied = asyncio.Event()

    def snapshot_applied(self) -> None:
        """Every snapshot applied wakes the misses that wait for it."""
        self._applied.set()
        self._applied = asyncio.Event()

    async def __call__(self, model: str, deadline_s: float | None) -> frozenset[str] | None:
        """Ask the control plane to load ``model`` and wait for its answer: None once
        this replica's snapshot routes the model, or the keys of the members the answer
        names that this replica knows and finds available, before its snapshot says so."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        if deadline_s is None:
            give_up, asked_by = began + NO_DEADLINE_WAIT_S, began + NO_DEADLINE_WAIT_S + 5.0
        else:
            # answered within the deadline's last share, as the waiting room answers: the
            # client's own deadline would otherwise fire first (the control plane answers
            # within it too; a control plane that does not is given the whole deadline)
            give_up = began + last_share_s(max(0.0, deadline_s))
            asked_by = began + max(0.0, deadline_s)
        params = {} if deadline_s is None else {"wait": f"{max(0.0, deadline_s):.3f}"}
        try:
            answer = await self.client.post(
                f"{self.url}/{model}", params=params, headers=self.headers,
                timeout=httpx.Timeout(max(0.001, asked_by - loop.time()), connect=CONNECT_S))
        except httpx.HTTPError as exc:
            raise Unavailable(CONTROL_DOWN.format(model=model, why=type(exc).__name__)) \
                from exc
        if answer.status_code != 200:
            raise _answer_error(answer)
        named = _named_holders(answer)
        while not self.state.resident(model):  # published there: soon in our snapshot
            # the answer names where it is loaded: the request goes there without waiting
            # for the snapshot that says so (a replica short of CPU applies it late: seen
            # failing 1-2 requests of 2,347 at a quarter budget, bench_residency)
            known = frozenset(m.key for m in self.state.available_among(model, named))
            if known:
                return known
            applied = self._applied
            left = give_up - loop.time()
            if left <= 0:
                raise Unavailable(f"model '{model}' is loaded, but this data-plane replica "
                                  "has not received the snapshot that routes it yet")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(applied.wait(), left)
        return None


def _named_holders(answer: httpx.Response) -> list[str]:
    """The member keys the control plane's answer to a miss says hold the model."""
    try:
        holders = answer.json()["holders"]
    except (ValueError, KeyError, TypeError):
        return []
    return [h for h in holders if isinstance(h, str)] if isinstance(holders, list) else []


def _answer_error(answer: httpx.Response) -> GatewayError:
    """The control plane's answer to a miss, as the error it stands for."""
    try:
        message = str(answer.json()["error"])
    except (ValueError, KeyError, TypeError):
        message = f"the control plane answered the miss with HTTP {answer.status_code}"
    retry = answer.headers.get("retry-after")
    retry_s = float(retry) if retry is not None and retry.isdigit() else None
    if answer.status_code == 404:
        return ModelNotFound(message)
    if answer.status_code == 504:
        return DeadlineExceeded(message)
    if answer.status_code == 429:
        return Overloaded(message, retry_s or 1.0)
    return Unavailable(message, retry_s)


@dataclass(frozen=True)
class ReplicaSettings:
    control_http: str  # the control plane, host:port
    token: str | None = None  # an admin-scoped token, when the control plane has auth on
    upstream_timeout_s: float = 60.0
    drain_timeout_s: float = 10.0
    max_request_bytes: int = 256 * 1024 * 1024
    log_level: str = "warning"


class ReplicaForwarder:
    """The replica's Python forwarder and its HTTP and gRPC servers, on private loopback
    ports that HAProxy sends to (``Layout.local_http`` / ``local_grpc``)."""

    def __init__(self, config: GatewayConfig, settings: ReplicaSettings,
                 metrics: GatewayMetrics | None = None,
                 ports: tuple[str, str] | None = None) -> None:
        """``ports``: the HTTP and gRPC addresses to serve (default: free loopback
        ports)."""
        self.settings = settings
        self.core = Core.for_config(config, metrics)  # the agent's: one /metrics
        self.core.state.set_preloaded(False)  # ready once a snapshot says where to route
        self.auth = TokenTable()
        self.forwarder = Forwarder(self.core)
        self.client = httpx.AsyncClient(trust_env=False)
        self.misses = ControlPlaneMisses(self.core.state, self.client, settings.control_http,
                                         settings.token)
        self.core.state.on_miss(self.misses)
        self.upstream_http = UpstreamHTTP(timeout_s=settings.upstream_timeout_s)
        self.upstream_grpc = UpstreamGRPC()
        self.admin = MemberAdmin(self.client)  # (its batching calls are the control plane's)
        self.http_address, self.grpc_address = ports or tuple(
            f"127.0.0.1:{port}" for port in free_ports(2))
        self.applied: Snapshot | None = None
        self._http: EmbeddedServer | None = None
        self._grpc: Any = None
        self._task: asyncio.Task[None] | None = None
        self.http_closed = False  # (stop) its HTTP server has ended what it held

    def follow(self, snapshot: Snapshot) -> None:
        """Route by ``snapshot`` from now on."""
        apply_snapshot(self.core.state, snapshot, self.applied)
        self.auth.adopt(snapshot_tokens(snapshot))
        self.applied = snapshot
        self.misses.snapshot_applied()

    async def start(self) -> None:
        control = ModelControl(self.core, self.admin)
        serving = FastAPI(title="infergate data-plane replica")
        add_serving_routes(serving, self.core, control, self.upstream_http, self.auth)
        app = create_http_app(self.forwarder, serving, self.upstream_http, self.auth,
                              max_body_bytes=self.settings.max_request_bytes)
        host, port = split_host_port(self.http_address)
        self._http = EmbeddedServer(uvicorn.Config(
            app, host=host, port=int(port), log_level=self.settings.log_level,
            access_log=False, lifespan="off", loop="asyncio", http=GatewayHttpToolsProtocol,
            proxy_headers=False, server_header=False, date_header=False))
        self._grpc, _ = create_grpc_server(
            self.forwarder, control, self.upstream_grpc, self.grpc_address, self.auth,
            max_message_bytes=self.settings.max_request_bytes)
        await self._grpc.start()
        self._task = asyncio.create_task(self._http.serve(), name="replica-http")
        while not self._http.started:
            if self._task.done():
                await self._task  # surfaces bind errors
                raise RuntimeError(f"the replica's HTTP server on {self.http_address} "
                                   "did not start")
            await asyncio.sleep(0.02)

    async def drain(self, timeout_s: float) -> None:
        """Readiness false at once; wait (bounded) until nothing is in flight here."""
        state = self.core.state
        state.start_draining()
        loop = asyncio.get_running_loop()
        give_up = loop.time() + timeout_s
        while any(m.in_flight for m in state.members()) and loop.time() < give_up:
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        """Close both servers, HTTP first: a ``generate_stream`` still open ends with an
        error event saying the gateway is shutting down (within ``CLOSE_S``), which
        HAProxy relays; then gRPC, whose streams get ``2 * CLOSE_S`` to end. An HAProxy in
        front stops in that window (``http_closed`` says when): its GOAWAY is what a gRPC
        client reads as ``UNAVAILABLE`` and retries (HAProxy 2.6 turns a server's end of
        a stream the client keeps open into RST_STREAM(CANCEL): haproxy/haproxy#1219)."""
        if self._http is not None:
            self._http.should_exit = True
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self._task, CLOSE_S + 1.0)
        self.http_closed = True
        if self._grpc is not None:
            await self._grpc.stop(grace=2 * CLOSE_S)
        await self.upstream_http.aclose()
        await self.upstream_grpc.close()
        await self.admin.close()
        await self.client.aclose()
