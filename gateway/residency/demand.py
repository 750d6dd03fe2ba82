"""Each model's demand: user requests per second, smoothed, read once per round from the
request counter both data planes feed (``infergate_requests_total{traffic="user"}``:
the Python forwarder counts its own, HAProxy's log lines count its) and from what the
data-plane replicas report they served (``infergate_replica_requests_total``,
``POST /v1/dataplane/report``), and recorded so that a restarted gateway (or the
replica that leads after a failover) preloads by the use it measured before.

Where it is recorded: with a lifecycle, in its records (the store the leader writes,
:meth:`~gateway.lifecycle.records.store.RecordStore.record_demand`: SQLite or the
PostgreSQL every control-plane replica shares); a store that holds none yet starts from
the file an older gateway wrote, once. Without a lifecycle there is no store: a JSON file
(``residency.demand_file``), written whole and atomically. Recording is best effort: a
failure (a stale leadership term, an unreachable database, a full disk) is logged and the
next record tries again.

A request is counted when it arrives, not when it ends: those waiting in the waiting
room for their model's load count as they enter it (the room's count grows), and not
again when they end (it shrinks as their answer is counted). A model that just became
the favourite reads hot while its first requests still wait, which is when a miss
decides what it may evict. (Counted as they ended, the benchmark's new favourite read
cold for the seconds its load took, and a cold miss evicted it.)
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path

from gateway.errors import GatewayError
from gateway.files import write_atomically
from gateway.lifecycle.records.store import RecordStore
from gateway.metrics import GatewayMetrics
from gateway.policy.residency import smoothed_rate

log = logging.getLogger(__name__)

FAST_SHARE = 0.2  # the short half-life, of half_life_s
AHEAD_READS = 3


class DemandMeter:
    """``store``: the lifecycle's records, where demand is recorded (None: no lifecycle,
    the file at ``path``, if any; with a store, ``path`` is only read while the store
    holds no record yet)."""

    def __init__(self, metrics: GatewayMetrics, half_life_s: float,
                 path: Path | None = None, store: RecordStore | None = None) -> None:
        self.metrics = metrics
        self.half_life_s = half_life_s
        self.path = path
        self.store = store
        self._seen: dict[str, float] | None = None  # counter totals at the last read
        self._read_at = 0.0
        self._rates: dict[str, tuple[float, float]] = {}  # model -> (rps, when)
        # the same with a short half-life: a model that just became hot reads hot within
        # seconds (a reshuffle's new favourite joins the main segment before its misses
        # pile up), and one that cools still reads as the long half-life says
        self._fast: dict[str, float] = {}
        self._waiting: dict[str, int] = {}  # requests waiting in the room, at the last read
        # model -> (requests counted ahead, reads left): ended (the room shrank) before
        # their answers' counts came (a replica reports each second), taken off the next
        # counts for AHEAD_READS reads at most (an answer never counted is forgotten)
        self._ahead: dict[str, tuple[float, int]] = {}
        self._recorded = self._load()

    def _load(self) -> dict[str, float]:
        if self.store is not None:
            try:
                recorded = self.store.recorded_demand()
            except (GatewayError, sqlite3.Error) as exc:
                log.warning("recorded demand unreadable, starting without: %s", exc)
                return {}
            if recorded is not None:
                return {m: r for m, r in recorded.rates.items() if r > 0}
            if self.path is not None and self.path.exists():
                log.info("no demand in the records yet: starting from %s", self.path)
        return self._load_file()

    def _load_file(self) -> dict[str, float]:
        if self.path is None or not self.path.exists():
            return {}
        try:
            data = json.loads(self.path.read_text())
            return {str(m): float(r) for m, r in data.get("models", {}).items() if r > 0}
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            log.warning("recorded demand %s unreadable, starting without: %r", self.path, exc)
            return {}

    def recorded(self) -> dict[str, float]:
        """What the last process measured (model -> requests per second)."""
        return dict(self._recorded)

    def _totals(self) -> dict[str, float]:
        totals: dict[str, float] = defaultdict(float)
        for family in self.metrics.requests.collect():
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.labels.get("traffic") == "user":
                    totals[sample.labels["model"]] += sample.value
        for family in self.metrics.replica_requests.collect():  # what replicas served
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    totals[sample.labels["model"]] += sample.value
        return totals

    def read(self, now: float, waiting: Mapping[str, int] | None = None) -> None:
        """Fold the requests that arrived since the last read into each model's rate:
        those counted since (answered), and the growth of ``waiting`` (model -> requests
        in the waiting room now)."""
        totals = self._totals()
        waiting = dict(waiting or {})
        if self._seen is None:  # the first read: what came before is not a burst now
            self._seen, self._read_at, self._waiting = totals, now, waiting
            for model, rps in self._recorded.items():
                self._rates[model] = (rps, now)
            return
        for model in totals.keys() | self._rates.keys() | waiting.keys() | self._waiting.keys():
            ahead, reads = self._ahead.pop(model, (0.0, AHEAD_READS))
            arrived = (max(0.0, totals.get(model, 0.0) - self._seen.get(model, 0.0))
                       + waiting.get(model, 0) - self._waiting.get(model, 0) - ahead)
            count = max(0.0, arrived)
            if arrived < 0 and reads > 1:
                self._ahead[model] = (-arrived, reads - 1)
            rps, since = self._rates.get(model, (0.0, self._read_at))
            self._rates[model] = (smoothed_rate(rps, since, count, now, self.half_life_s), now)
            self._fast[model] = smoothed_rate(self._fast.get(model, 0.0), since, count, now,
                                              self.half_life_s * FAST_SHARE)
        self._seen, self._read_at, self._waiting = totals, now, waiting

    def rate(self, model: str) -> float:
        """Requests per second: the larger of the two smoothings (rises fast, falls at
        ``half_life_s``)."""
        return max(self._rates.get(model, (0.0, 0.0))[0], self._fast.get(model, 0.0))

    def rates(self) -> dict[str, float]:
        return {m: self.rate(m) for m in self._rates}

    def record(self) -> None:
        """Write the rates measured now, whole: to the store, else to the file
        (atomically: a crash leaves the last whole file)."""
        rates = {m: round(r, 6) for m, r in self.rates().items() if r > 1e-6}
        if self.store is not None:
            try:
                self.store.record_demand(rates)
            except (GatewayError, sqlite3.Error) as exc:
                log.warning("recording demand failed: %s", exc)
            return
        if self.path is None:
            return
        text = json.dumps({"saved_at": time.time(), "models": rates}, sort_keys=True)
        try:
            write_atomically(self.path, text)
        except OSError as exc:
            log.warning("recording demand to %s failed: %r", self.path, exc)
