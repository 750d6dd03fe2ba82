"""Who holds what: one record per (member, model), its state machine, and the one place
that writes it (:class:`HoldingTable`).

A holding moves through named phases, and only along these transitions::

    queued ──▶ loading ──▶ warming ──▶ resident ──▶ draining ──▶ unloading ──▶ gone
       │          │           │           ▲  │          │            │
       └──────────┴───────────┴─▶ failed  │  └──────────┴────────────┴──▶ gone (lost)
                                          └── draining / unloading (eviction refused)

- **queued**: decided (a plan's load, a miss, a deploy), waiting for one of the member's
  load slots; its footprint counts in the member's use from this moment, so a decision
  made meanwhile sees the room as taken.
- **loading** / **warming**: Triton loads it (and runs its ``model_warmup``); then the
  gateway's warm-up at the model's own shapes.
- **resident**: routed to; its age (``min_resident_s``) counts from here.
- **draining**: out of routing, its requests in flight there end; **unloading**: Triton
  unloads it; **gone**: the record is removed.
- **failed**: its load failed there (the reason kept); retried after ``failed_retry_s``.

A queued, loading or warming holding is never evicted (the policy is told they are
*pending*). Every transition is checked against :data:`ALLOWED`; one that arrives for a
record that changed meanwhile (its ``token`` no longer current: the member restarted and
the record was dropped, a deploy took it over) is refused and reported stale, so a load
that finishes after a contrary decision cannot mark anything resident. The gateway's
routing (:meth:`GatewayState.set_holders`) is published in the same step as every
transition into or out of *resident*.
"""

from __future__ import annotations

import enum
import itertools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from gateway.state import GatewayState

log = logging.getLogger(__name__)


class Phase(enum.StrEnum):
    QUEUED = "queued"
    LOADING = "loading"
    WARMING = "warming"
    RESIDENT = "resident"
    DRAINING = "draining"
    UNLOADING = "unloading"
    FAILED = "failed"


GONE = None  # a transition to GONE removes the record
ALLOWED: dict[Phase, frozenset[Phase | None]] = {
    Phase.QUEUED: frozenset({Phase.LOADING, Phase.FAILED, GONE}),
    Phase.LOADING: frozenset({Phase.WARMING, Phase.RESIDENT, Phase.FAILED, GONE}),
    Phase.WARMING: frozenset({Phase.RESIDENT, Phase.FAILED, GONE}),
    Phase.RESIDENT: frozenset({Phase.DRAINING, GONE}),
    Phase.DRAINING: frozenset({Phase.UNLOADING, Phase.RESIDENT, GONE}),
    Phase.UNLOADING: frozenset({Phase.RESIDENT, GONE}),
    Phase.FAILED: frozenset({Phase.QUEUED, GONE}),
}
PENDING = frozenset({Phase.QUEUED, Phase.LOADING, Phase.WARMING})
LEAVING = frozenset({Phase.DRAINING, Phase.UNLOADING})
MAIN, PROBATION = "main", "probation"


class StaleTransition(Exception):
    """A transition for a record that is no longer the one it was meant for."""


@dataclass(frozen=True)
class Holding:
    member: str
    model: str
    phase: Phase
    since: float  # when it entered this phase
    reason: str  # why it was loaded, why it leaves, or why it failed
    token: int  # which record this is: each queue() or adopt() makes a new one
    queued_at: float
    resident_since: float | None = None
    segment: str = MAIN  # PROBATION: loaded for a miss and not promoted

    @property
    def in_use(self) -> bool:
        """Whether its footprint counts in the member's use (everything but failed)."""
        return self.phase is not Phase.FAILED

    def lent(self, last_used: float | None) -> bool:
        """Whether it holds room nobody asked for: loaded by the plan's fill, resident,
        and its model not used (``last_used``: the model's last request) since. The
        first of its member's main segment to go, at any age."""
        return (self.reason == "fill" and self.phase is Phase.RESIDENT
                and (last_used is None or last_used < (self.resident_since or self.since)))


Listener = Callable[[Holding | None, Holding | None], None]


class HoldingTable:
    """Every holding of the residency; the only writer of them, and of the model's
    holders in :class:`GatewayState`. ``listener(before, after)`` is told of each
    transition (after: None when the record went); each is logged at INFO."""

    def __init__(self, state: GatewayState, clock: Callable[[], float],
                 listener: Listener | None = None) -> None:
        self._state = state
        self._clock = clock
        self._listener = listener
        self._records: dict[tuple[str, str], Holding] = {}
        self._gone_at: dict[tuple[str, str], float] = {}
        self._tokens = itertools.count(1)

    # -- reads --------------------------------------------------------------------------
    def get(self, member: str, model: str) -> Holding | None:
        return self._records.get((member, model))

    def __iter__(self) -> Iterator[Holding]:
        return iter(list(self._records.values()))

    def of_member(self, member: str) -> dict[str, Holding]:
        return {h.model: h for h in self._records.values() if h.member == member}

    def of_model(self, model: str) -> dict[str, Holding]:
        return {h.member: h for h in self._records.values() if h.model == model}

    def resident_on(self, model: str) -> list[str]:
        return sorted(h.member for h in self._records.values()
                      if h.model == model and h.phase is Phase.RESIDENT)

    def may_queue(self, member: str, model: str) -> bool:
        """Whether a load of ``model`` may be queued on ``member``: no record there, or a
        failed one."""
        current = self.get(member, model)
        return current is None or current.phase is Phase.FAILED

    def gone_since(self, member: str, model: str, at: float) -> bool:
        """Whether the holding went (unloaded, dropped) at or after ``at``."""
        return self._gone_at.get((member, model), float("-inf")) >= at

    # -- transitions ----------------------------------------------------------------------
    def queue(self, member: str, model: str, reason: str, segment: str = MAIN) -> Holding:
        """A load decided: a new record, queued (a failed one is replaced)."""
        current = self.get(member, model)
        if current is not None and current.phase is not Phase.FAILED:
            raise StaleTransition(f"{model} on {member} is {current.phase} already")
        now = self._clock()
        holding = Holding(member, model, Phase.QUEUED, now, reason, next(self._tokens), now,
                          segment=segment)
        self._write(current, holding)
        return holding

    def adopt(self, member: str, model: str, reason: str = "found loaded") -> Holding:
        """A model the member has ready that no record says so of: resident."""
        now = self._clock()
        holding = Holding(member, model, Phase.RESIDENT, now, reason, next(self._tokens), now,
                          resident_since=now)
        self._write(self.get(member, model), holding)
        return holding

    def advance(self, holding: Holding, phase: Phase | None, reason: str | None = None
                ) -> Holding | None:
        """Move ``holding`` to ``phase`` (None: gone). StaleTransition when the record is
        no longer this one, or the move is not allowed from where it is now."""
        current = self.get(holding.member, holding.model)
        if current is None or current.token != holding.token:
            raise StaleTransition(f"{holding.model} on {holding.member}: the record changed")
        if phase not in ALLOWED[current.phase]:
            raise StaleTransition(f"{holding.model} on {holding.member}: {current.phase} -> "
                                  f"{phase or 'gone'} is not allowed")
        if phase is None:
            self._write(current, None)
            return None
        now = self._clock()
        after = replace(current, phase=phase, since=now,
                        reason=current.reason if reason is None else reason)
        if phase is Phase.RESIDENT and current.resident_since is None:
            after = replace(after, resident_since=now)
        self._write(current, after)
        return after

    def set_segment(self, holding: Holding, segment: str) -> Holding:
        """A holding joins the main segment, or goes back to probation (no load, no
        eviction)."""
        current = self.get(holding.member, holding.model)
        if current is None or current.token != holding.token:
            raise StaleTransition(f"{holding.model} on {holding.member}: the record changed")
        after = replace(current, segment=segment)
        self._write(current, after)
        return after

    def drop(self, holding: Holding) -> None:
        """The member lost it (restarted, the model failed there): gone, whatever its
        phase."""
        current = self.get(holding.member, holding.model)
        if current is not None and current.token == holding.token:
            self._write(current, None)

    def _write(self, before: Holding | None, after: Holding | None) -> None:
        holding = after or before
        assert holding is not None
        key = holding.member, holding.model
        if after is None:
            self._records.pop(key, None)
            self._gone_at[key] = self._clock()
        else:
            self._records[key] = after
        log.info("%s on %s: %s -> %s (%s, %s)", holding.model, holding.member,
                 before.phase if before else "new", after.phase if after else "gone",
                 holding.reason, holding.segment)
        was = before is not None and before.phase is Phase.RESIDENT
        now = after is not None and after.phase is Phase.RESIDENT
        if was != now:
            self.publish(key[1])
        if self._listener is not None:
            self._listener(before, after)

    def publish(self, model: str) -> None:
        """The model's holders in the gateway's state: the members it is resident on."""
        self._state.set_holders(model, self.resident_on(model))
