"""The residency policy's terms (:mod:`gateway.policy.residency`): the view of a pool
a round builds, the plan it gets back, the knobs, and the formulas of demand (smoothed
rates, replicas wanted). Pure data and arithmetic."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

# a replica is dropped only when demand is below this share of what the rest carry, and a
# model evicts another for demand only when that one's demand is at most this share of its
HYSTERESIS = 0.7
# a model's next replica is wanted once its demand passes this share of what its replicas
# carry: it loads while they still keep up, before requests queue behind them
REPLICA_LEAD = 0.9
# the share of each member's budget that the main segment leaves to misses (probation)
PROBATION_SHARE = 0.25
# a probation model (loaded for a miss) stays at least this long: its waiters go on first
PROBATION_MIN_S = 5.0
# ... and, whatever a miss's hurry, at least this long: its waiters reach the member (the
# snapshot that routes them reaches every data-plane replica first). Taken 7 ms after its
# load for another miss, a model's waiters waited for it until their deadline; simulated
# (forwarding 0.3 s), 1 s failed the fewest requests (0.5 s and 2 s more)
WAITERS_S = 1.0
LOAD_REASONS = ("pinned", "demand", "miss", "preload", "fill", "deploy", "operator")
EVICTION_REASONS = ("room", "surplus", "operator")


@dataclass(frozen=True)
class ResidencyKnobs:
    min_resident_s: float = 30.0  # no eviction within this of a load
    rps_per_replica: float = 50.0  # smoothed demand one member carries before another
    failed_retry_s: float = 60.0  # a member a load failed on is not tried again before
    probation_share: float = PROBATION_SHARE  # of a budget kept for misses (probation)
    probation_min_s: float = PROBATION_MIN_S  # a probation model is never evicted before
    # the next replica loads once demand passes this share of what the replicas carry
    replica_lead: float = REPLICA_LEAD


@dataclass(frozen=True)
class ModelView:
    name: str
    footprint_bytes: int
    min_replicas: int  # already resolved (0 for on-demand; len(members) pinned)
    demand_rps: float  # smoothed
    last_used: float | None  # clock seconds, None: never
    frozen: bool = False  # under rollout: keeps the members it has, neither loaded nor evicted

    @property
    def value_per_byte(self) -> float:
        """Demand per byte held: what a byte of a member's budget earns holding it."""
        return self.demand_rps / max(1, self.footprint_bytes)


@dataclass(frozen=True)
class MemberView:
    key: str
    budget_bytes: int  # headroom already taken off
    available: bool  # healthy and routable
    held: Mapping[str, float]  # model -> when it became resident
    failed: Mapping[str, float] = field(default_factory=dict)  # model -> when a load failed
    draining: frozenset[str] = frozenset()  # being evicted: still counted in use
    # queued, loading or warming there: counted in use, never evicted, never loaded again
    pending: frozenset[str] = frozenset()
    # loaded for a miss and not promoted: the first a miss evicts (residency_misses)
    probation: frozenset[str] = frozenset()
    # pending model -> when it is expected resident (the measured load times): when its
    # room may be had again (miss_room_at); a pending model without one frees none
    ready_at: Mapping[str, float] = field(default_factory=dict)
    # pending model -> bytes of the draining models whose room it takes once they leave (a
    # miss placed here waits for its victims): counted once, not as both
    covered: Mapping[str, int] = field(default_factory=dict)
    # loaded by a plan's fill and not used since (room lent): evicted at any age, before
    # any other model of the main segment
    lent: frozenset[str] = frozenset()
    # what a placement leaves free of the budget (evictions for the budget start only past
    # the whole of it): room for the held models' footprints measured again larger
    margin_bytes: int = 0


@dataclass(frozen=True)
class ResidencyView:
    now: float
    models: tuple[ModelView, ...]
    members: tuple[MemberView, ...]


@dataclass(frozen=True)
class Move:
    model: str
    member: str
    reason: str  # loads: LOAD_REASONS; evictions: EVICTION_REASONS


@dataclass(frozen=True)
class Plan:
    loads: tuple[Move, ...]
    evictions: tuple[Move, ...]
    replicas: Mapping[str, int]  # wanted members per model
    # holdings that change segment (reason "promote": probation -> main, "demote": main ->
    # probation): no load, no eviction
    segments: tuple[Move, ...] = ()


def resolve_min_replicas(min_replicas: int | None, on_demand: bool, members: int,
                         under_rollout: bool) -> int:
    """A model's ``min_replicas`` as the plan reads it: the configured figure (capped at
    the pool's members), 0 for an on-demand model, every member for one configured
    neither way (pinned everywhere: the behaviour without residency); a model under
    rollout needs at least one (its versions load side by side there)."""
    if min_replicas is not None:
        wanted = min(min_replicas, members)
    elif on_demand:
        wanted = 0
    else:
        wanted = members
    return max(wanted, 1) if under_rollout else wanted


def smoothed_rate(previous_rps: float, previous_at: float, count: float, now: float,
                  half_life_s: float) -> float:
    """Requests per second, exponentially weighted: ``count`` requests arrived between
    ``previous_at`` (when the rate was ``previous_rps``) and ``now``. The old rate keeps
    ``0.5 ** (elapsed / half_life_s)`` of its weight, the rate of the interval the rest,
    so reading more often or less often gives the same rate for the same steady traffic.
    No time elapsed: the previous rate; ``half_life_s`` <= 0: the interval's rate."""
    elapsed = now - previous_at
    if elapsed <= 0:
        return previous_rps
    rate = count / elapsed
    if half_life_s <= 0:
        return rate
    keep = 0.5 ** (elapsed / half_life_s)
    return previous_rps * keep + rate * (1.0 - keep)


def wanted_replicas(model: ModelView, members: int, knobs: ResidencyKnobs,
                    now: float | None = None) -> int:
    """How many of ``members`` (the available ones) should hold ``model`` (module
    docstring); ``now`` given, a use within ``min_resident_s`` wants one too."""
    demanded = 0
    if model.demand_rps > 0:
        carried = knobs.rps_per_replica * knobs.replica_lead
        demanded = max(1, math.ceil(model.demand_rps / carried - 1e-9))
    elif (now is not None and model.last_used is not None
          and now - model.last_used <= knobs.min_resident_s):
        demanded = 1
    return max(0, min(members, max(model.min_replicas, demanded)))
