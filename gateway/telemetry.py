"""The gateway's figures in one place: the metrics, what is read into them at a scrape
(gauge sources), saturation, the counting of synthetic requests, and the reading of
HAProxy's live counts (``show stat``, ``show table st_route``) that both the HAProxy
controller and a data-plane agent do.

Every data plane feeds this component; none owns it. The control plane reads it
through :class:`gateway.core.Core`. Per-request metrics of the Python forwarder stay
in the forwarder (it caches metric children per model for the hot path); HAProxy's
per-request lines arrive through :mod:`gateway.haproxy.telemetry`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from gateway.errors import GatewayError, outcome_name
from gateway.haproxy.runtime import parse_csv_stats, parse_table
from gateway.metrics import GatewayMetrics, create_metrics
from gateway.policy.rollout import Window
from gateway.pools import Pool, PoolMember

T = TypeVar("T")
GaugeSource = Callable[[], Awaitable[None]]
MAX_TALLIED = 200_000  # answers kept per version between two reads of a window


@dataclass(frozen=True)
class HAProxyCounts:
    """What one HAProxy says now. Keys are its names: backends ``<proto>_<pool>``, and
    under model residency ``<proto>_<pool>.<suffix>`` per managed model
    (:func:`gateway.haproxy.snapshot.residency_suffix`), counted toward their pool;
    servers by :func:`gateway.haproxy.snapshot.server_name`; ``st_route``'s keys are
    ``model/pool``, with tenancy rules ``model/pool/tenant``."""

    # pool -> requests at its servers, and waiting in HAProxy's queue (both protocols)
    held: dict[str, int]
    queued: dict[str, int]
    # (pool, server) -> requests at that server, and its connection + response errors
    at_server: dict[tuple[str, str], int]
    errors: dict[tuple[str, str], int]
    # (model, pool) -> requests in flight; tenant -> requests in flight
    routes: dict[tuple[str, str], int]
    tenants: dict[str, int]
    # (pool, tenant) with requests in flight or one arrived within the table's window
    active: frozenset[tuple[str, str]]
    # (pool, a managed model's backend suffix, server) -> its requests at that server
    # (both protocols): a model's requests at a member it leaves have drained at 0
    at_model_server: dict[tuple[str, str, str], int] = field(default_factory=dict)


def read_haproxy(stats_text: str, routes_text: str, tenancy_rules: bool,
                 seen_text: str = "") -> HAProxyCounts:
    """``show stat`` and ``show table st_route`` -> :class:`HAProxyCounts`; with tenancy
    rules also ``show table st_seen``: the arrivals they refused, which make a tenant
    active without counting in flight (``gateway/haproxy/admission_rules.py``)."""
    held: dict[str, int] = defaultdict(int)
    queued: dict[str, int] = defaultdict(int)
    at_server: dict[tuple[str, str], int] = defaultdict(int)
    errors: dict[tuple[str, str], int] = defaultdict(int)
    at_model: dict[tuple[str, str, str], int] = defaultdict(int)
    for row in parse_csv_stats(stats_text):
        proto, _, backend = row["pxname"].partition("_")
        pool, _, suffix = backend.partition(".")  # pool names have no dot
        if proto not in ("http", "grpc") or not pool:
            continue
        if row["svname"] == "BACKEND":
            held[pool] += _int(row.get("scur"))
            queued[pool] += _int(row.get("qcur"))
        elif row["svname"] != "FRONTEND":
            at_server[pool, row["svname"]] += _int(row.get("scur"))
            errors[pool, row["svname"]] += _int(row.get("econ")) + _int(row.get("eresp"))
            if suffix:
                at_model[pool, suffix, row["svname"]] += _int(row.get("scur"))
    routes: dict[tuple[str, str], int] = defaultdict(int)
    tenants: dict[str, int] = defaultdict(int)
    active: set[tuple[str, str]] = set()
    for key, values in parse_table(routes_text).items():
        current = values.get("conn_cur", 0)
        if tenancy_rules:
            key, _, tenant = key.rpartition("/")
            tenants[tenant] += current
        model, _, pool = key.rpartition("/")
        routes[model, pool] += current
        if tenancy_rules and (current or values.get("http_req_rate", 0)):
            active.add((pool, tenant))
    for key, values in parse_table(seen_text).items():
        rest, _, tenant = key.rpartition("/")
        if tenancy_rules and values.get("http_req_rate", 0):
            active.add((rest.rpartition("/")[2], tenant))
    return HAProxyCounts(dict(held), dict(queued), dict(at_server), dict(errors),
                         dict(routes), dict(tenants), frozenset(active), dict(at_model))


def _int(value: str | None) -> int:
    return int(value) if value and value.isdigit() else 0


@dataclass
class Telemetry:
    """The gateway's metrics and what feeds them outside a request's own path."""

    metrics: GatewayMetrics = field(default_factory=create_metrics)
    # awaited before a scrape: HAProxy's live counts read now, not a round ago
    _sources: list[GaugeSource] = field(default_factory=list)
    # called once per probe round, before saturation (a forwarder notes its tenants)
    _rounds: list[Callable[[], None]] = field(default_factory=list)

    def add_source(self, source: GaugeSource) -> None:
        self._sources.append(source)

    def each_round(self, hook: Callable[[], None]) -> None:
        self._rounds.append(hook)

    async def refresh(self, pools: Iterable[Pool]) -> None:
        """What a ``/metrics`` scrape sees: every gauge source read now, then a round."""
        for source in self._sources:
            with contextlib.suppress(OSError):  # one that cannot answer keeps its last
                await source()
        self.round(pools)

    def round(self, pools: Iterable[Pool]) -> None:
        """Once per probe round (and at a scrape): the round hooks, then each pool's
        saturation, its load (requests at its members, from either plane, plus Triton's
        queues) over its capacity."""
        for hook in self._rounds:
            hook()
        for pool in pools:
            load = sum(m.in_flight + m.external_in_flight + m.upstream_queue
                       for m in pool.members)
            self.metrics.saturation.labels(pool.name).set(load / pool.capacity)

    def routes(self, counts: HAProxyCounts) -> None:
        """In flight per model and pool, from HAProxy's ``st_route``."""
        for (model, pool), current in counts.routes.items():
            self.metrics.in_flight.labels(model, pool).set(current)

    async def synthetic(self, model: str, member: PoolMember, call: Callable[[PoolMember],
                        Awaitable[T]], *, protocol: str, traffic: str = "warmup",
                        outcome: Callable[[T], str] | None = None) -> T:
        """One synthetic request (warm-up, keep-warm, replay) to a chosen member, outside
        admission and routing, counted in the member's in-flight and under ``traffic``,
        so that SLO figures can leave it out."""
        metrics = self.metrics
        started = time.monotonic()
        member.request_started()
        try:
            result = await call(member)
        except GatewayError as err:
            metrics.requests.labels(model, member.pool, protocol, outcome_name(err),
                                    traffic).inc()
            raise
        finally:
            member.request_ended()
        metrics.requests.labels(model, member.pool, protocol,
                                outcome(result) if outcome else "success", traffic).inc()
        metrics.latency.labels(model, member.pool, protocol, traffic).observe(
            time.monotonic() - started)
        return result


@dataclass(eq=False)
class VersionTally:
    """Answers to pinned requests of the models a rollout watches, per version: both
    data planes record here (the Python forwarder as it answers; HAProxy's telemetry
    thread from its log lines), the rollout reads a window per step. Thread-safe."""

    _answers: dict[str, dict[int, list[tuple[float, bool, float]]]] = field(
        default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def watch(self, model: str) -> None:
        with self._lock:
            self._answers.setdefault(model, {})

    def forget(self, model: str) -> None:
        with self._lock:
            self._answers.pop(model, None)

    def record(self, model: str, version: int, ok: bool, seconds: float, at: float,
               count: int = 1) -> None:
        versions = self._answers.get(model)
        if versions is None:
            return  # no rollout watches it
        with self._lock:
            answers = versions.setdefault(version, [])
            answers.extend([(at, ok, seconds)] * count)
            if len(answers) > MAX_TALLIED:  # unread for long: keep the newest half
                del answers[: len(answers) // 2]

    def take(self) -> dict[str, dict[int, list[tuple[bool, float]]]]:
        """Every answer recorded since the last take, (ok, seconds) per model and version,
        and none kept: what a data-plane replica reports to the control plane, whose
        rollout judges them."""
        with self._lock:
            taken = {model: {v: [(ok, s) for _, ok, s in answers]
                             for v, answers in versions.items() if answers}
                     for model, versions in self._answers.items()}
            for versions in self._answers.values():
                versions.clear()
        return {model: versions for model, versions in taken.items() if versions}

    def watched(self) -> set[str]:
        with self._lock:
            return set(self._answers)

    def window(self, model: str, version: int, since: float) -> Window:
        """Answers of ``version`` recorded at or after ``since`` (older ones dropped)."""
        with self._lock:
            answers = self._answers.get(model, {}).get(version, [])
            kept = [a for a in answers if a[0] >= since]
            if model in self._answers:
                self._answers[model][version] = kept
        return Window.of([(ok, s) for _, ok, s in kept])
