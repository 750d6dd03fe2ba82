"""Model residency as declared (issue 29): a pool whose members each hold only some of
its models, within a memory budget per member. The policy that decides which is
:mod:`gateway.policy.residency`; the control plane that carries it out is
:mod:`gateway.residency`.

A pool without ``residency:`` keeps every model it serves on every member (the
behaviour before residency existed).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

# the waiting room's default size, per member of the pool: what the pool can load grows
# with its members (docs/residency.md, the waiting room's row, has the figures)
REQUESTS_PER_MEMBER = 128


class WaitingRoomSpec(BaseModel):
    """Requests for a model resident nowhere (misses) wait here while it loads."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # misses held at once, all models of the pool together; beyond: 503 + Retry-After.
    # None: REQUESTS_PER_MEMBER per member of the pool
    max_requests: int | None = Field(None, ge=0)
    # a miss without a deadline of its own waits at most this long for its model
    max_wait_s: float = Field(30.0, gt=0)

    def limit(self, members: int) -> int:
        """The misses held at once in a pool of ``members`` members."""
        if self.max_requests is not None:
            return self.max_requests
        return REQUESTS_PER_MEMBER * max(1, members)


class ResidencySpec(BaseModel):
    """A pool's residency: a memory budget per member and the policy's knobs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # per member: in Kubernetes the MIG profile's memory (1g.10gb: 10 GB) minus headroom
    memory_budget_bytes: int = Field(ge=1)
    # kept free of the budget (the runtime's own allocations, fragmentation)
    headroom_bytes: int = Field(0, ge=0)
    # members on this host: also keep free the largest surge a load of one of the pool's
    # models was measured to take beyond what it keeps (real memory within the budget
    # while loads run; at a small budget it costs hits: docs/residency.md)
    surge_headroom: bool = False
    min_resident_s: float = Field(30.0, ge=0)  # no eviction within this of a load
    # smoothed requests per second one member carries before the model gets another
    rps_per_replica: float = Field(50.0, gt=0)
    demand_half_life_s: float = Field(30.0, gt=0)  # smoothing of requests per second
    # a member a load failed on is not tried for that model again before this
    failed_retry_s: float = Field(60.0, ge=0)
    # loads at once per member (Triton loads in the background; each costs CPU)
    loads_per_member: int = Field(2, ge=1)
    # the share of a member's budget that misses may always take from the coldest models
    # (the probation segment, docs/residency.md): the cold are served, the hot kept
    probation_share: float = Field(0.25, ge=0, le=1)
    # a model loaded for a miss is not evicted within this of its load (its waiters go on)
    probation_min_s: float = Field(5.0, ge=0)
    # an evicted model's room goes to another load only once its processes have exited
    # (Triton answers the unload first), waited for at most this long; 0: not waited for
    release_wait_s: float = Field(10.0, ge=0)
    # models held nowhere load into the room nothing else wants (leaving a miss the room
    # of the largest), and are the main segment's first to go until used: no room idles
    # while a model could be ready in it (a start without recorded demand is not cold)
    fill_free_room: bool = True
    # a placement leaves free the most one round's measures raised a member's accounted
    # use (measured again each round on this host: a stub grows by 0.3-0.7 MB as it first
    # serves), the budget's evictions starting only past the whole of it; at least this
    # share of the budget (where figures move unmeasured)
    placement_margin: float = Field(0.0, ge=0, lt=1)
    waiting_room: WaitingRoomSpec = Field(default_factory=WaitingRoomSpec)
    # where each model's measured demand is recorded, so that a restarted gateway
    # preloads by use (relative to the configuration file), where the gateway has no
    # lifecycle records (with them, the records keep it: gateway/residency/demand.py);
    # default: the lifecycle's state folder, else not recorded
    demand_file: Path | None = None

    @model_validator(mode="after")
    def _room_left(self) -> ResidencySpec:
        if self.headroom_bytes >= self.memory_budget_bytes:
            raise ValueError(f"headroom_bytes ({self.headroom_bytes}) leaves nothing of "
                             f"memory_budget_bytes ({self.memory_budget_bytes})")
        return self

    @property
    def usable_bytes(self) -> int:
        """What a member's models may take together: the budget less the headroom."""
        return self.memory_budget_bytes - self.headroom_bytes
