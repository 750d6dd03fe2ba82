"""What owners and operators see of the residency (``GET /v1/residency``, the console,
``infergate models status``): per pool and member, every holding with its phase, how
long, why, its footprint, whether it holds room lent (loaded by the fill and not used
since: the main segment's first to go) and the requests waiting for it; per pool, the misses waiting
for room, in the order room goes to them; per model, where it is resident, its holdings
elsewhere and how long its last load took; the typical load and eviction the waiting
room expects (``timings``)."""

from __future__ import annotations

from typing import Any, Protocol

from gateway.config.residency import ResidencySpec
from gateway.policy.residency import ResidencyView
from gateway.pools import Pool
from gateway.residency.actuator import Actuator
from gateway.residency.demand import DemandMeter
from gateway.residency.footprints import Footprints
from gateway.residency.holdings import PENDING, Holding, HoldingTable
from gateway.residency.waiting import WaitingRoom
from gateway.state import GatewayState


class Reported(Protocol):
    """What the report reads of the residency (:class:`~gateway.residency.manager.
    Residency`)."""

    table: HoldingTable
    actuator: Actuator
    room: WaitingRoom
    footprints: Footprints
    demand: DemandMeter

    @property
    def state(self) -> GatewayState: ...

    def pools(self) -> list[Pool]: ...

    def spec(self, pool: Pool) -> ResidencySpec: ...

    def models(self, pool: Pool) -> list[str]: ...

    def view(self, pool: Pool, now: float | None = None) -> ResidencyView: ...

    def used_bytes(self, pool: Pool, member_key: str) -> int: ...

    def headroom_bytes(self, pool: Pool) -> int: ...

    def usable_bytes(self, pool: Pool) -> int: ...

    def margin_bytes(self, pool: Pool) -> int: ...


def build(residency: Reported) -> dict[str, Any]:
    now = residency.state.clock()
    last_used = residency.state.last_used()
    pools, models = [], {}
    for pool in residency.pools():
        spec = residency.spec(pool)
        members = []
        for member in pool.members:
            holdings = residency.table.of_member(member.key)
            members.append({
                "key": member.key, "available": member.available(now),
                "budget_bytes": spec.memory_budget_bytes,
                "usable_bytes": residency.usable_bytes(pool),
                "margin_bytes": residency.margin_bytes(pool),
                "used_bytes": residency.used_bytes(pool, member.key),
                "load_slots": spec.loads_per_member,
                "loads_running": residency.actuator.running(member.key),
                "models": [dict(_holding(residency, h, now), model=m,
                                footprint_bytes=residency.footprints.bytes(m, pool),
                                lent=h.lent(last_used.get(m)))
                           for m, h in sorted(holdings.items())],
            })
        pools.append({"name": pool.name, "budget_bytes": spec.memory_budget_bytes,
                      "headroom_bytes": residency.headroom_bytes(pool),
                      "usable_bytes": residency.usable_bytes(pool),
                      "waiting": residency.room.waiting(pool),
                      "waiting_for_room": _waiting_for_room(residency.room, pool, now),
                      "members": members})
        views = {v.name: v for v in residency.view(pool, now).models}
        for model in residency.models(pool):
            configured = residency.state.config.models.get(model)
            used = last_used.get(model)
            size, source = residency.footprints.of(model, pool)
            holdings = residency.table.of_model(model)
            models[model] = {
                "pool": pool.name,
                "on_demand": bool(configured and configured.on_demand),
                "min_replicas": views[model].min_replicas,
                "footprint_bytes": size, "footprint_source": source,
                "demand_rps": round(residency.demand.rate(model), 4),
                "last_used_s_ago": None if used is None else round(now - used, 1),
                "load_s": _rounded(residency.actuator.load_seconds.get(model)),
                "members": residency.table.resident_on(model),
                "waiting": residency.room.waiters(model),
                "holdings": [dict(_holding(residency, h, now), member=k,
                                  lent=h.lent(used))
                             for k, h in sorted(holdings.items())],
            }
    return {"pools": pools, "models": models, "timings": residency.actuator.timings()}


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)


def _waiting_for_room(room: WaitingRoom, pool: Pool, now: float) -> list[dict[str, Any]]:
    """The misses of ``pool`` no member has room for yet, in the order room goes to
    them (:meth:`WaitingRoom.unplaced`): the requests waiting, for how long, and whether
    the first of them fails unless its room is made now (``urgent``)."""
    return [{"model": f.model, "waiting": f.waiters, "for_s": round(now - f.started, 1),
             "urgent": room.placer.urgent(f)}
            for f in room.unplaced() if f.pool is pool]


def _holding(residency: Reported, holding: Holding, now: float) -> dict[str, Any]:
    return {"state": str(holding.phase), "for_s": round(now - holding.since, 1),
            "reason": holding.reason, "segment": holding.segment,
            "waiting": residency.room.waiters(holding.model) if holding.phase in PENDING
            else 0}
