"""Holdings a data-plane replica stopped routing to, and its requests still there.

An eviction takes a model out of routing at one member, waits until no data plane has a
request of it there, then unloads it (``gateway/residency/actuator.py``). A replica that
runs elsewhere (the local replica process, a Kubernetes data-plane pod) holds requests
of its own at members: its forwarder's (misses, streams, ``generate``) and, in a pod, its
HAProxy's. The control plane cannot count those, so the replica says them: each long
poll of the snapshot feed carries, beside the version it applied, its requests still in
flight at the holdings that version no longer routes (``busy``). Unloaded under such a
request, Triton answers it ``404`` "unknown model" for a model the gateway serves.

Why counts carried on the poll rather than on the 1 s report: the count means something
only beside the version it was taken under. A replica reports a holding's count once
that holding has left its routing, and from then on the count can only fall (no new
request goes there), so a count read late errs on the side of waiting. While it has
such requests, the replica polls every :data:`BUSY_POLL_S` instead of long-polling, so
the control plane hears of the last one ending within that.

A pair is ``(model, pool, server name)`` (:func:`gateway.haproxy.snapshot.server_name`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.haproxy.snapshot import Snapshot

Pair = tuple[str, str, str]  # (model, pool, server name)
BUSY_POLL_S = 0.1  # how often a replica with requests at a holding it left polls
KEEP_S = 120.0  # a holding's requests are counted this long after it left, at most
MAX_BUSY = 256  # pairs one poll carries (a replica has a few at once)


def held_pairs(snapshot: Snapshot) -> frozenset[Pair]:
    """The holdings ``snapshot`` routes to: managed models' holders per pool."""
    return frozenset((route.model, pool, name)
                     for route in snapshot.routes if route.holders is not None
                     for pool, names in route.holders for name in names)


@dataclass
class LeftHoldings:
    """A replica's side: the holdings it routed by an earlier snapshot and no longer
    does, until its requests there end (or :data:`KEEP_S` passes). One writer: the
    replica's snapshot follower."""

    clock: Callable[[], float] = time.monotonic
    _routed: frozenset[Pair] = frozenset()
    _left: dict[Pair, float] = field(default_factory=dict)  # pair -> when it left

    def applied(self, snapshot: Snapshot) -> None:
        """The replica routes by ``snapshot`` from now on."""
        routed, now = held_pairs(snapshot), self.clock()
        for pair in self._routed - routed:
            self._left.setdefault(pair, now)
        for pair in routed:  # routed again: a new holding, counted by the control plane
            self._left.pop(pair, None)
        self._routed = routed

    @property
    def pending(self) -> bool:
        return bool(self._left)

    def busy(self, in_flight: Callable[[Pair], int]) -> dict[Pair, int]:
        """The left holdings with requests still in flight (``in_flight`` counts them);
        a holding whose requests ended, or that left over :data:`KEEP_S` ago, is
        forgotten."""
        now, busy = self.clock(), {}
        for pair, since in list(self._left.items()):
            count = in_flight(pair)
            if count > 0 and now - since < KEEP_S:
                busy[pair] = count
            else:
                del self._left[pair]
        return dict(sorted(busy.items())[:MAX_BUSY])


def encode_busy(busy: dict[Pair, int]) -> str:
    """The poll's ``busy`` parameter: a JSON list of ``[model, pool, server, count]``."""
    return json.dumps([[*pair, count] for pair, count in sorted(busy.items())],
                      separators=(",", ":"))


def decode_busy(text: str) -> dict[Pair, int]:
    """:func:`encode_busy` read back; raises ValueError on anything else."""
    if not text:
        return {}
    rows = json.loads(text)
    if not isinstance(rows, list) or len(rows) > MAX_BUSY:
        raise ValueError(f"busy: a list of at most {MAX_BUSY} rows expected")
    busy: dict[Pair, int] = {}
    for row in rows:
        if not (isinstance(row, list) and len(row) == 4
                and all(isinstance(part, str) for part in row[:3])
                and isinstance(row[3], int) and not isinstance(row[3], bool) and row[3] > 0):
            raise ValueError(f"busy: [model, pool, server, count > 0] expected, got {row!r}")
        busy[(row[0], row[1], row[2])] = row[3]
    return busy
