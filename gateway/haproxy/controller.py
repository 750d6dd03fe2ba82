"""The control plane's hold on HAProxy: build a snapshot each round, move HAProxy to it
(runtime API for weights, member states and maps; a seamless reload for structure),
and read HAProxy's counters back into the gateway's gauges.

The gateway's state (:class:`~gateway.core.Core`) stays the owner of what the gateway
knows (pools, members' health and queue depth, model assignments, readiness); this
module only reads it, once per round, never per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from gateway.auth import TokenTable
from gateway.config.tenancy import Priority
from gateway.core import Core
from gateway.haproxy.process import HAProxyProcess
from gateway.haproxy.proxy import SnapshotProxy
from gateway.haproxy.runtime import RuntimeAPI, parse_table
from gateway.haproxy.snapshot import (
    Layout,
    MemberState,
    PoolState,
    RouteState,
    Snapshot,
    TenancyState,
    TenantState,
    published_lease,
    residency_suffix,
    server_name,
)
from gateway.haproxy.telemetry import LogReceiver, RequestLog
from gateway.netaddr import free_port
from gateway.policy.access import configured_digest
from gateway.policy.rate import configured_classes
from gateway.policy.routing import RoutingPolicy, ranked_pools
from gateway.pools import Pool, PoolMember
from gateway.state import GatewayState
from gateway.telemetry import read_haproxy
from gateway.upstream.triton_version import VersionWatch

log = logging.getLogger(__name__)


def snapshot_of(state: GatewayState, auth: TokenTable, now: float,
                policy: RoutingPolicy | None = None, tenancy_rules: bool = False) -> Snapshot:
    """What HAProxy must know, read off the gateway's state at ``now``;
    ``tenancy_rules``: the process has the tenancy rules (kept when tenancy is off)."""
    policy = policy or RoutingPolicy()
    pools = tuple(
        PoolState(
            name=pool.name,
            members=tuple(
                MemberState(
                    name=server_name(m.key), host=m.spec.host, http_port=m.spec.http_port,
                    grpc_port=m.spec.grpc_port, routable=m.healthy and not m.restoring,
                    weight=policy.weight(m, now),
                    triton_version=m.triton_version,
                )
                for m in pool.members
            ),
            capacity=pool.capacity,
            elsewhere=state.queued_elsewhere(pool),
            member_slots=pool.spec.capacity_per_member if pool.spec.gateway_queue else 0,
            max_wait_ms=pool.spec.max_queue_wait_ms if pool.spec.gateway_queue else 0,
            lane_slots=pool.spec.lane_per_member if pool.spec.gateway_queue else 0,
        )
        for pool in state.pools
    )
    routable = {p.name for p in pools if any(m.routable for m in p.members)}
    routes = tuple(
        route for model in sorted(state.known_models())
        if (route := _route(state, model, state.pools_for(model), routable))
    )
    wildcard = [p for p in state.pools if "*" in p.spec.models]
    default = _route(state, "", wildcard, routable, weigh=False) if wildcard else None
    rate_default, rate_per_key = configured_classes(state.config.rate_limits)
    return Snapshot(
        pools=pools,
        routes=routes,
        default_route=default,
        rate_default=rate_default,
        rate_keys=tuple(sorted((configured_digest(k), c) for k, c in rate_per_key.items())),
        tokens=tuple(sorted(
            (digest.hex(), f"{','.join(sorted(p.scopes))};{p.name}")
            for digest, p in auth.digests()
        )),
        predict_gated=auth.predict_gated,
        tenancy=_tenancy(state, policy, tenancy_rules),
        levels=tuple(sorted(state.leveled_models().items())),
    )


def _tenancy(state: GatewayState, policy: RoutingPolicy,
             keep_rules: bool) -> TenancyState | None:
    tenancy = state.tenancy
    if tenancy is None:
        return TenancyState(tenants=(), enabled=False) if keep_rules else None
    # each pool's rules (Tenancy.in_pool: one that queues in the gateway has its own)
    pools = [(p.name, p.capacity, tenancy.in_pool(p.spec.gateway_queue)) for p in state.pools]
    return TenancyState(
        tenants=tuple(TenantState(t.name, t.priority.value, t.max_in_flight, t.rate, t.weight)
                      for t in tenancy.tenants),
        keys=tenancy.keys,
        ceilings=tuple((pool, p.value, rules.ceiling(p, cap))
                       for pool, cap, rules in pools for p, _ in rules.refuse_at),
        shares=tuple((pool, name, share) for pool, cap, rules in pools
                     for name, share in rules.shares(cap, state.active_tenants(pool)).items()),
        bounds=tuple((p.value, tenancy.bound_permille(p)) for p, _ in tenancy.refuse_at),
        pool_bounds=tuple((pool, p.value, rules.bound_permille(p))
                          for pool, _, rules in pools for p, _ in rules.refuse_at
                          if rules is not tenancy),
        refusal_delay_ms=tenancy.refusal_delay_ms,
        refusals_per_s=tenancy.refusals_per_s,
        triton_levels=tenancy.triton_levels,
    )


def _route(state: GatewayState, model: str, pools: list[Pool], routable: set[str],
           weigh: bool = True) -> RouteState | None:
    if not pools:
        return None
    weights = {p.name: (p.spec.weight(model) if weigh else 1.0) for p in pools}
    live = {p: w for p, w in weights.items() if p in routable and w > 0}
    chosen = ranked_pools(live or weights)  # none routable: let HAProxy answer 503
    if not chosen:
        return None
    limits = state.admission_limits(model, pools)
    split, shadow = state.split_of(model), state.shadow_of(model)
    by_name = {p.name: p for p in pools}
    service = tuple((name, us, state.drain_us(model, by_name[name], us))
                    for name, _ in chosen if name in by_name
                    and (us := state.service_us(model, by_name[name])) is not None)
    holders = state.holders(model) if weigh else None
    return RouteState(model=model, pools=chosen, max_in_system=limits.in_system,
                      not_ready=state.not_ready_reason(model),
                      split=None if split is None else (split.stable, split.candidate,
                                                        split.percent),
                      service=service,
                      # every pool serving it, chosen or not: a pool leaving the split
                      # keeps its model backends (a runtime change, not a reload)
                      holders=None if holders is None else tuple(
                          (pool.name, tuple(sorted(server_name(m.key) for m in pool.members
                                                   if m.key in holders and m.healthy
                                                   and not m.restoring)))
                          for pool in pools),
                      shadow=None if shadow is None else shadow.percent,
                      verdict_at=_lease(state, model))


def _lease(state: GatewayState, model: str) -> float | None:
    """The rollout's lease, while its candidate has a share (a split above 0 % or a
    shadow step), on the published grid: the snapshot changes once per LEASE_STEP_S
    while verdicts come every tick."""
    split, shadow, at = state.split_of(model), state.shadow_of(model), state.verdict_at(model)
    share = (split is not None and split.percent > 0) or (shadow is not None and shadow.percent)
    return published_lease(at) if share and at is not None else None


@dataclass
class HAProxyController:
    """HAProxy carrying the hot path, programmed from the gateway's state."""

    core: Core
    auth: TokenTable
    layout: Layout
    process: HAProxyProcess
    policy: RoutingPolicy = field(default_factory=RoutingPolicy)
    _receiver: LogReceiver | None = None
    _errors_seen: dict[tuple[str, str], int] = field(default_factory=dict)
    # HAProxy has the tenancy rules: once rendered they stay, so that turning tenancy
    # off and on again is a change of maps, not a reload
    _tenancy_rules: bool = False
    proxy: SnapshotProxy = field(init=False)
    versions: VersionWatch = field(init=False)
    # set once HAProxy runs: a lifecycle step that settles meanwhile (a fast preload)
    # waits for it instead of moving a process that is not there yet
    started: asyncio.Event = field(init=False, default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.proxy = SnapshotProxy(self.layout, self.process)
        self.versions = VersionWatch(self.core.metrics.member_info,
                                     self.layout.grpc_upstream_reuse)

    @property
    def api(self) -> RuntimeAPI:
        return self.proxy.api

    @property
    def reloads(self) -> int:
        return self.proxy.reloads

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Telemetry socket first (HAProxy logs to it from its first request), then the
        files, then the process. Blocking: run it in a thread; ``loop`` is the control
        plane's, where served-request notes are delivered."""
        self.layout.run_dir.mkdir(parents=True, exist_ok=True)

        def served(models: set[str]) -> None:  # from the telemetry thread
            loop.call_soon_threadsafe(self._note_user_requests, models)

        self._receiver = LogReceiver(self.layout.log_address,
                                     RequestLog(self.core.metrics, on_served=served,
                                                tally=self.core.state.tally))
        self._receiver.start()
        self.core.state.follow(self.apply)
        self.core.state.count_in_flight(self.model_in_flight)
        self.core.telemetry.add_source(self.observe)
        self.proxy.start(self.snapshot())
        loop.call_soon_threadsafe(self.started.set)

    def _note_user_requests(self, models: set[str]) -> None:
        now = self.core.clock()
        for model in models:
            self.core.state.note_used(model, now)

    async def apply(self) -> None:
        """Move HAProxy to the current snapshot (runtime commands, else a reload: a
        member's gRPC connection mode changes with its Triton version)."""
        await self.started.wait()
        self.versions.observe((m.pool, m.key, m.triton_version)
                              for m in self.core.state.members() if m.version_probed)
        self.versions.forget({(m.pool, m.key) for m in self.core.state.members()})
        await self.proxy.amove(self.snapshot())

    def snapshot(self) -> Snapshot:
        core = self.core
        self._tenancy_rules = self._tenancy_rules or core.state.tenancy is not None
        return snapshot_of(core.state, self.auth, core.clock(), self.policy,
                           self._tenancy_rules)

    async def observe(self) -> None:
        """HAProxy's live counts -> gauges: in flight per model and pool, queued per
        model, per-member in flight (saturation) and connection errors; the tenants
        active in HAProxy's tables noted (their shares are applied next)."""
        queries = [self.api.aquery("show stat"), self.api.aquery("show table st_route")]
        if self._tenancy_rules:  # the arrivals the tenancy rules refused
            queries.append(self.api.aquery("show table st_seen"))
        stats_text, routes_text, *refused = await asyncio.gather(*queries)
        counts = read_haproxy(stats_text, routes_text, self._tenancy_rules, "".join(refused))
        state, telemetry = self.core.state, self.core.telemetry
        metrics = telemetry.metrics
        for pool in state.pools:
            for member in pool.members:
                name = server_name(member.key)
                member.haproxy_in_flight(counts.at_server.get((pool.name, name), 0))
                failures = counts.errors.get((pool.name, name), 0)
                seen = self._errors_seen.get((pool.name, member.key), 0)
                if failures > seen:
                    metrics.upstream_errors.labels(pool.name, member.key).inc(failures - seen)
                self._errors_seen[(pool.name, member.key)] = failures
        now = self.core.clock()
        for pool_name, tenant in counts.active:
            state.note_tenant(pool_name, tenant, now)
        telemetry.routes(counts)
        in_pool: dict[str, int] = defaultdict(int)
        for (_, pool_name), current in counts.routes.items():
            in_pool[pool_name] += current
        queued: dict[str, float] = defaultdict(float)
        for (model, pool_name), current in counts.routes.items():
            if in_pool[pool_name]:
                queued[model] += counts.queued.get(pool_name, 0) * current / in_pool[pool_name]
        for model, value in queued.items():
            metrics.queued.labels(model).set(round(value))
        tenancy = state.tenancy
        if tenancy is not None:
            for t in tenancy.tenants:
                metrics.tenant_in_flight.labels(t.name, t.priority.value).set(
                    counts.tenants.get(t.name, 0))
                for other in Priority:  # a tenant moved to another class leaves no series
                    if other is not t.priority:
                        with contextlib.suppress(KeyError):
                            metrics.tenant_in_flight.remove(t.name, other.value)

    async def model_in_flight(self, model: str, member: PoolMember) -> int:
        """Requests of ``model`` HAProxy has at ``member`` now (its residency backend's
        count there: an eviction unloads once it is 0); 1 while HAProxy does not answer
        (not known: the eviction waits, within its bound)."""
        try:
            text = await self.api.aquery("show stat")
        except OSError as exc:
            log.warning("HAProxy's counts unavailable: %s", exc)
            return 1
        counts = read_haproxy(text, "", False)
        return counts.at_model_server.get(
            (member.pool, residency_suffix(model), server_name(member.key)), 0)

    async def in_flight(self) -> int:
        """Inference requests HAProxy holds now (at members or in its queues)."""
        with contextlib.suppress(OSError):
            table = parse_table(await self.api.aquery("show table st_model"))
            return sum(v.get("conn_cur", 0) for v in table.values())
        return 0

    async def run_forever(self, interval_s: float) -> None:
        await self.started.wait()
        while True:
            try:
                # observed first: the tenants active now set the shares applied next
                await self.observe()
                await self.apply()
            except Exception:  # noqa: BLE001 - keep serving on the last good state
                log.exception("programming HAProxy failed; it keeps its last state")
            await asyncio.sleep(interval_s)

    def stop(self, grace_s: float = 10.0) -> None:
        self.process.stop(grace_s)
        if self._receiver is not None:
            self._receiver.stop()


def default_layout(host: str, http_port: int, grpc_port: int, control_http: str,
                   control_grpc: str, run_dir: Path) -> Layout:
    return Layout(
        http_bind=f"{host}:{http_port}",
        grpc_bind=f"{host}:{grpc_port}",
        control_http=control_http,
        control_grpc=control_grpc,
        run_dir=run_dir,
        log_address=f"127.0.0.1:{free_port()}",
    )
