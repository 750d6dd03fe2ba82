"""What HAProxy must know to route, as plain frozen data: the data plane's snapshot.

The control plane builds one :class:`Snapshot` per probe round from what it owns (pools,
members' health and queue depth, model assignments, admission limits, rate limits,
token digests); :mod:`gateway.haproxy.render` turns it into HAProxy's configuration, map
files and error files, :mod:`gateway.haproxy.changes` into runtime commands, without any
I/O. Nothing here refers to a live object, so a snapshot can be compared, stored and
replayed.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from gateway.config.tenancy import DEFAULT_REFUSAL_DELAY_MS, DEFAULT_REFUSALS_PER_S, Priority
from gateway.netaddr import split_host_port
from gateway.policy.rate import RateClass
from gateway.policy.routing import MAX_POOLS_PER_MODEL, MAX_WEIGHT
from gateway.policy.tenancy import split_shares
from gateway.upstream.triton_version import GrpcReuse


@dataclass(frozen=True)
class MemberState:
    """One Triton server as HAProxy sees it."""

    name: str  # HAProxy server name (an identifier derived from the member key)
    host: str
    http_port: int
    grpc_port: int
    routable: bool  # False: held in maintenance (unhealthy, or being restored)
    weight: int = MAX_WEIGHT  # 1..256, from the member's queue depth
    # the Triton version it reported (None: not read); decides whether its gRPC
    # connections are shared (gateway.upstream.triton_version)
    triton_version: str | None = None


@dataclass(frozen=True)
class PoolState:
    name: str
    members: tuple[MemberState, ...]
    capacity: int = 1  # requests the pool holds before it is saturated (the HPA's unit)
    elsewhere: int = 0  # requests queued in its members that are not the gateway's
    # requests wait in HAProxy, not in Triton (gateway/policy/queueing.py): each member
    # takes this many at once (its servers' maxconn), 0: no cap, nothing waits here
    member_slots: int = 0
    max_wait_ms: int = 0  # the longest a request waits in the queue (timeout queue)
    # a light tenant's extra slots per member (its lane's servers' maxconn), 0: none
    lane_slots: int = 0


@dataclass(frozen=True)
class RouteState:
    """Where one model's requests go and how many it may have in the gateway at once."""

    model: str
    pools: tuple[tuple[str, float], ...]  # (pool, weight), heaviest first
    max_in_system: int  # in flight + queued; beyond that: 429 / RESOURCE_EXHAUSTED
    not_ready: str | None = None  # why it cannot take requests yet (503 + Retry-After)
    # during a rollout: (stable, candidate, candidate's percent of unversioned requests)
    split: tuple[int, int, int] | None = None
    # (pool, the model's service time there, microseconds per request the pool works off
    # beyond its capacity): the deadline rule
    service: tuple[tuple[str, int, int], ...] = ()
    # model residency (docs/haproxy.md#model-residency): None, not managed (every member
    # of its pools serves it); else per pool of the route, the HAProxy server names
    # (server_name) of the members that hold the model and may take its requests now.
    # A pool with none is a miss there: its requests go to the control plane, which
    # holds them while the model loads
    holders: tuple[tuple[str, tuple[str, ...]], ...] | None = None
    # a rollout's shadow step: the percent of unversioned requests HAProxy hands to the
    # control plane, whose forwarder answers them from stable and mirrors them
    shadow: int | None = None
    # the lease of a rollout that gives the candidate a share (a split above 0 % or a
    # shadow step): when the control plane last took a verdict on it, epoch seconds of
    # its clock, published on a LEASE_STEP_S grid (:func:`published_lease`); None
    # otherwise. A replica that sees it grow older than LEASE_S moves the model's
    # traffic to stable (:func:`fail_safe`)
    verdict_at: float | None = None

    @property
    def candidate_share(self) -> bool:
        """Whether the candidate of a rollout answers any unversioned request here: a
        split above 0 %, or a shadow step's mirrors."""
        return (self.split is not None and self.split[2] > 0) or bool(self.shadow)


@dataclass(frozen=True)
class Resident:
    """One managed (pool, model): its own backend per protocol, whose servers track the
    pool's and are ready only on the model's holders."""

    pool: str
    model: str
    holders: frozenset[str]  # server names

    @property
    def backend(self) -> str:
        """``{pool}.r{h}``: behind ``http_`` / ``grpc_``, the backend's name; the value
        of map ``resident`` while it has holders."""
        return f"{self.pool}.{residency_suffix(self.model)}"


@dataclass(frozen=True)
class TenantState:
    name: str
    priority: str  # gateway.policy.tenancy.Priority's value
    max_in_flight: int | None = None
    rate: RateClass | None = None
    weight: float = 1.0  # its share among the active tenants of its class


@dataclass(frozen=True)
class TenancyState:
    """The tenancy rule's inputs for HAProxy (``gateway/policy/tenancy.py``): tenants
    (the default first), key digests, and per pool its capacity, class ceilings, every
    tenant's share (beside the tenants active there); per class (and per pool where a
    pool's rules differ), the model's bound in permille. Capacities and the load queued
    elsewhere are the pools' own."""

    tenants: tuple[TenantState, ...]
    keys: tuple[tuple[str, str], ...] = ()  # (key digest, tenant)
    ceilings: tuple[tuple[str, str, int], ...] = ()  # (pool, priority, load)
    shares: tuple[tuple[str, str, int], ...] = ()  # (pool, tenant, requests)
    bounds: tuple[tuple[str, int], ...] = ()  # (priority, the model's bound in permille)
    # (pool, priority, permille) where a pool's own rules differ (Tenancy.in_pool: it
    # queues in the gateway): its requests' model bound
    pool_bounds: tuple[tuple[str, str, int], ...] = ()
    enabled: bool = True
    # a tenancy refusal's tarpit (gateway.policy.tenancy.refusal_delay_ms); tenancy off
    # keeps the default, so turning it off and on again needs no reload
    refusal_delay_ms: int = DEFAULT_REFUSAL_DELAY_MS
    refusals_per_s: int = DEFAULT_REFUSALS_PER_S  # ... longer for a tenant with many
    triton_levels: bool = True  # classes as Triton's levels (gateway.policy.triton_priority)

    def rate_classes(self) -> tuple[RateClass, ...]:
        return tuple(t.rate for t in self.tenants if t.rate is not None)

    def with_shares(self, active: Mapping[str, Collection[str]]) -> TenancyState:
        """The same rules with every pool's shares for the tenants ``active`` there (pool
        -> names): what a data-plane replica applies over the tenants it sees itself."""
        tenants = [(t.name, Priority(t.priority), t.weight) for t in self.tenants]
        pools = sorted({p for p, _, _ in self.ceilings})
        shares = []
        for pool in pools:
            ceilings = {Priority(k): c for p, k, c in self.ceilings if p == pool}
            shares += [(pool, name, share) for name, share in
                       split_shares(ceilings, tenants, active.get(pool, ())).items()]
        return replace(self, shares=tuple(shares))


@dataclass(frozen=True)
class Snapshot:
    """Everything routing depends on. ``default_route`` serves models no pool names
    explicitly (pools that serve ``*``); ``None`` means unknown models are answered 404."""

    pools: tuple[PoolState, ...]
    routes: tuple[RouteState, ...] = ()
    default_route: RouteState | None = None
    rate_default: RateClass | None = None
    # (the key's digest, gateway.policy.access.key_digest, class)
    rate_keys: tuple[tuple[str, RateClass], ...] = ()
    tokens: tuple[tuple[str, str], ...] = ()  # (sha256 hex, comma-separated scopes)
    predict_gated: bool = False
    tenancy: TenancyState | None = None
    # (model, the priority levels of its dynamic batcher, the fewest its pools' members
    # read) for the models with two or more, whatever routes them (a wildcard pool's
    # too): a request with a class gets its level (gateway/policy/triton_priority.py)
    levels: tuple[tuple[str, int], ...] = ()

    def rate_classes(self) -> tuple[RateClass, ...]:
        """Distinct limits, default first, then per key, then tenants': one stick table
        each."""
        classes: list[RateClass] = []
        tenants = self.tenancy.rate_classes() if self.tenancy else ()
        for rate in (self.rate_default, *(c for _, c in self.rate_keys), *tenants):
            if rate is not None and rate not in classes:
                classes.append(rate)
        return tuple(classes)

    def refusals_delayed(self) -> TenancyState | None:
        """The tenancy when its refusals wait before they are answered (a refusal delay:
        the frontends' tarpit, ``st_delay``, the delay's rules), else None."""
        if self.tenancy is None or self.tenancy.refusal_delay_ms <= 0:
            return None
        return self.tenancy

    def split_ranks(self) -> int:
        widest = max((len(r.pools) for r in self.all_routes()), default=1)
        return max(1, min(MAX_POOLS_PER_MODEL, widest))

    def all_routes(self) -> tuple[RouteState, ...]:
        extra = (self.default_route,) if self.default_route is not None else ()
        return (*self.routes, *extra)

    def residents(self) -> tuple[Resident, ...]:
        """The managed (pool, model) pairs of the named routes (pools this snapshot has;
        holders among the pool's members), by pool then model."""
        members = {p.name: {m.name for m in p.members} for p in self.pools}
        return tuple(sorted(
            (Resident(pool, route.model, frozenset(names) & members[pool])
             for route in self.routes if route.holders is not None
             for pool, names in route.holders if pool in members),
            key=lambda r: (r.pool, r.model)))


@dataclass(frozen=True)
class Layout:
    """Where HAProxy listens and where its files live (fixed for a process's life)."""

    http_bind: str  # "127.0.0.1:8000"
    grpc_bind: str
    control_http: str  # the control plane's own HTTP server, "127.0.0.1:PORT"
    control_grpc: str
    run_dir: Path  # config, maps, error files, sockets
    # "127.0.0.1:PORT": the control plane's TCP listener HAProxy's ring streams the
    # per-request lines to (TCP, not a unix socket: config._global says why)
    log_address: str
    nbthread: int = 1
    connect_timeout_ms: int = 2000
    client_timeout_s: int = 300
    server_timeout_s: int = 60  # no deadline from the client: the upstream wait's bound
    queue_timeout_s: int = 60
    health_interval_ms: int = 1000
    max_body_bytes: int = 256 * 1024 * 1024
    stream_timeout_s: int = 3600  # HAProxy's wait for the Python forwarder's gRPC answers
    # gRPC requests to a member share HTTP/2 connections when its Triton has the fix
    # for server#8034 (auto), always, or never (gateway.upstream.triton_version)
    grpc_upstream_reuse: GrpcReuse = GrpcReuse.AUTO
    # HAProxy ``tune.*`` settings over config.TUNING's defaults: (key, value)
    tune: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    # a data-plane replica's own Python forwarder (gateway/replica.py), "127.0.0.1:PORT":
    # what HAProxy cannot route, and every call that is not the control plane's
    # (gateway/policy/planes.py), go there; None: the control plane's servers carry
    # them (one process serves both, ``gateway serve``)
    local_http: str | None = None
    local_grpc: str | None = None

    @property
    def config_path(self) -> Path:
        return self.run_dir / "haproxy.cfg"

    @property
    def admin_socket(self) -> Path:
        return self.run_dir / ADMIN_SOCKET

    @property
    def master_socket(self) -> Path:
        return self.run_dir / MASTER_SOCKET

    def map_path(self, name: str) -> Path:
        return self.run_dir / "maps" / f"{name}.map"


ADMIN_SOCKET, MASTER_SOCKET = "admin.sock", "master.sock"
# HAProxy's longest unix socket path: "stats socket ... too long (max 97)" (2.6), below
# the kernel's 108 bytes
MAX_SOCKET_PATH = 97


def sockets_fit(run_dir: Path) -> bool:
    """Whether HAProxy takes the unix sockets a run folder ``run_dir`` holds (the admin
    socket and the master CLI's). The agent once checked 100 bytes, not HAProxy's 97,
    and under a state folder one level deeper than usual its HAProxy refused to start."""
    return all(len(str(run_dir / name)) <= MAX_SOCKET_PATH
               for name in (ADMIN_SOCKET, MASTER_SOCKET))


_NOT_IDENTIFIER = re.compile(r"[^A-Za-z0-9_.-]")


_TUNE_KEY = re.compile(r"tune\.[a-z0-9][a-z0-9.-]*")
_TUNE_VALUE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def parse_tune(text: str) -> tuple[str, str]:
    """``"tune.bufsize=65536"`` (or ``"tune.bufsize 65536"``) -> (key, value); ValueError
    for anything but one ``tune.*`` keyword and one plain value (a line of HAProxy's
    ``global`` section, so nothing else may slip in)."""
    key, _, value = text.strip().replace("=", " ", 1).partition(" ")
    key, value = key.strip(), value.strip()
    if not _TUNE_KEY.fullmatch(key) or not _TUNE_VALUE.fullmatch(value):
        raise ValueError(f"{text!r}: expected 'tune.KEY=VALUE' (HAProxy's global tune.* "
                         "settings, one plain value)")
    return key, value


def residency_suffix(model: str) -> str:
    """``r`` + the first 10 hex digits of the model name's SHA-1: identifier-safe, stable
    across processes, and the part of a model backend's name after ``{pool}.`` (pool
    names have no dot)."""
    return "r" + hashlib.sha1(model.encode(), usedforsecurity=False).hexdigest()[:10]


def server_name(member_key: str) -> str:
    """``127.0.0.1:8001`` -> ``127.0.0.1_8001``: a valid HAProxy server name; an IPv6
    member's ``[fd00::5]:8001`` -> ``v6_fd00--5_8001`` (distinct for distinct addresses:
    no host name has ``_``, no IPv6 address has ``-``)."""
    host, port = split_host_port(member_key)
    if ":" in host:
        return f"v6_{_NOT_IDENTIFIER.sub('.', host.replace(':', '-'))}_{port}"
    return _NOT_IDENTIFIER.sub("_", member_key)


# -- the wire form: what the control plane publishes and every data-plane replica follows
def snapshot_to_dict(snapshot: Snapshot) -> dict[str, object]:
    return asdict(snapshot)


def snapshot_from_dict(data: Any) -> Snapshot:
    """The inverse of :func:`snapshot_to_dict` (parsed JSON); ValueError when malformed."""
    def route(r: Any) -> RouteState | None:
        if r is None:
            return None
        reason, split, holders = r.get("not_ready"), r.get("split"), r.get("holders")
        return RouteState(str(r["model"]), tuple((str(p), float(w)) for p, w in r["pools"]),
                          int(r["max_in_system"]), None if reason is None else str(reason),
                          None if split is None else (int(split[0]), int(split[1]),
                                                      int(split[2])),
                          tuple((str(p), int(us), int(q)) for p, us, q in r.get("service", ())),
                          None if holders is None else tuple(
                              (str(p), tuple(str(n) for n in names)) for p, names in holders),
                          None if r.get("shadow") is None else int(r["shadow"]),
                          None if r.get("verdict_at") is None else float(r["verdict_at"]))

    def rate(r: Any) -> RateClass | None:
        return None if r is None else RateClass(float(r["rate_per_s"]), float(r["burst"]))

    def tenancy(t: Any) -> TenancyState | None:
        if t is None:
            return None
        return TenancyState(
            tenants=tuple(TenantState(str(x["name"]), str(x["priority"]),
                                      None if x["max_in_flight"] is None
                                      else int(x["max_in_flight"]), rate(x["rate"]),
                                      float(x.get("weight", 1.0)))
                          for x in t["tenants"]),
            keys=tuple((str(d), str(n)) for d, n in t["keys"]),
            ceilings=tuple((str(p), str(k), int(c)) for p, k, c in t["ceilings"]),
            shares=tuple((str(p), str(n), int(c)) for p, n, c in t["shares"]),
            bounds=tuple((str(k), int(c)) for k, c in t.get("bounds", ())),
            pool_bounds=tuple((str(p), str(k), int(c)) for p, k, c in t.get("pool_bounds", ())),
            enabled=bool(t.get("enabled", True)),
            refusal_delay_ms=int(t.get("refusal_delay_ms", DEFAULT_REFUSAL_DELAY_MS)),
            refusals_per_s=int(t.get("refusals_per_s", DEFAULT_REFUSALS_PER_S)),
            triton_levels=bool(t.get("triton_levels", True)),
        )

    try:
        return Snapshot(
            pools=tuple(PoolState(str(p["name"]), tuple(MemberState(**m) for m in p["members"]),
                                  int(p.get("capacity", 1)), int(p.get("elsewhere", 0)),
                                  int(p.get("member_slots", 0)), int(p.get("max_wait_ms", 0)),
                                  int(p.get("lane_slots", 0)))
                        for p in data["pools"]),
            routes=tuple(r for r in (route(x) for x in data["routes"]) if r is not None),
            default_route=route(data.get("default_route")),
            rate_default=rate(data.get("rate_default")),
            rate_keys=tuple((str(k), c) for k, raw in data["rate_keys"]
                            if (c := rate(raw)) is not None),
            tokens=tuple((str(d), str(scopes)) for d, scopes in data["tokens"]),
            predict_gated=bool(data["predict_gated"]),
            tenancy=tenancy(data.get("tenancy")),
            levels=tuple((str(m), int(n)) for m, n in data.get("levels", ())),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"malformed data-plane snapshot: {exc!r}") from exc


def snapshot_version(snapshot: Snapshot, wire: dict[str, object] | None = None) -> str:
    """Content address of a snapshot: equal snapshots have equal versions, whichever
    control-plane process published them. ``wire``: its :func:`snapshot_to_dict`, when
    already made."""
    if wire is None:
        wire = snapshot_to_dict(snapshot)
    canonical = snapshot_to_dict(snapshot_from_dict(wire))  # 1 == 1.0
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class Versions:
    """:func:`snapshot_version`, once per snapshot object (the last ``kept`` remembered,
    by identity): a version is a canonical JSON text's hash, and a data-plane agent asks
    it of each snapshot several times as it is received and applied, and every second
    as it watches the rollouts' leases (one snapshot's ``asdict`` after another: 15 % of
    the agent's Python time at a quarter residency budget)."""

    def __init__(self, kept: int = 4) -> None:
        self.kept = kept
        self._seen: list[tuple[Snapshot, str]] = []

    def __call__(self, snapshot: Snapshot, wire: dict[str, object] | None = None) -> str:
        """``wire``: the snapshot's :func:`snapshot_to_dict`, when at hand."""
        for seen, version in self._seen:
            if seen is snapshot:
                return version
        version = snapshot_version(snapshot, wire)
        self._seen = [(snapshot, version), *self._seen[:self.kept - 1]]
        return version


# -- a rollout's lease: canaries that fail safe -------------------------------------------
LEASE_S = 15.0  # a replica sends a candidate's share to stable once its lease is this old
# the published lease moves on this grid: while a rollout judges, the snapshot (and each
# replica's copy) changes once per LEASE_STEP_S, not at every verdict (every 0.25 s)
LEASE_STEP_S = 5.0


def published_lease(verdict_at: float) -> float:
    """A verdict's time as a snapshot carries it: rounded down to the LEASE_STEP_S grid.
    Rounding down errs towards safety: a published lease reads older than the verdict,
    never younger, so a replica fails safe at most ``LEASE_S`` after the last verdict,
    and a live control plane's lease is at most ``LEASE_STEP_S`` old when published."""
    return math.floor(verdict_at / LEASE_STEP_S) * LEASE_STEP_S


def fail_safe(snapshot: Snapshot, now: float, lease_s: float = LEASE_S) -> Snapshot:
    """``snapshot`` with every route whose rollout lease is older than ``lease_s`` at
    ``now`` moved to stable: the split pinned to stable at 0 % (as a recovered rollout
    is, so requests that name either version still get it) and no shadow step. The same
    object when every lease is fresh, so ``fail_safe(s, now) is s`` says nothing moved.

    Only routes that give a candidate a share carry a lease
    (:attr:`RouteState.candidate_share`); a share without one is left as it is: a
    promotion under way (stable may be unloading, the candidate is the verdict), or a
    control plane older than leases.

    How a data-plane replica calls it: keep each snapshot as the feed sent it, and route
    by ``fail_safe(received, now)``, checked on a timer (every second, say), not only
    when a snapshot arrives: a gone control plane is exactly when none arrives. When the
    result differs from what HAProxy runs, move HAProxy to it (runtime map changes, no
    reload). ``now`` is the control plane's clock, as the replica estimates it: the
    ``now`` of the feed's last 200 answer (``GET /v1/dataplane/snapshot``, epoch seconds
    on the control plane when it answered) plus what the replica's own monotonic clock
    counted since that answer arrived. Not the replica's wall clock: the lease and
    ``now`` come from one clock, so the skew between the two machines cancels, and only
    the replica's drift over the outage counts. A replica with no answer yet (started
    from its saved snapshot while the control plane is down) has no estimate and passes
    ``math.inf``: every leased share goes to stable."""
    routes = tuple(_stable_if_stale(r, now, lease_s) for r in snapshot.routes)
    default = snapshot.default_route
    if default is not None:
        default = _stable_if_stale(default, now, lease_s)
    if default is snapshot.default_route and \
            all(a is b for a, b in zip(routes, snapshot.routes, strict=True)):
        return snapshot
    return replace(snapshot, routes=routes, default_route=default)


def _stable_if_stale(route: RouteState, now: float, lease_s: float) -> RouteState:
    if not route.candidate_share or route.verdict_at is None or \
            now - route.verdict_at <= lease_s:
        return route
    split = route.split
    return replace(route, split=None if split is None else (split[0], split[1], 0),
                   shadow=None)
