"""The waiting room's order: room goes to the misses already waiting for it, the urgent
first, and a new miss does not take the room an urgent one needs. Driven through
``WaitingRoom.wait`` with a scripted placer (the residency's side of
:class:`~gateway.residency.waiting.Placer`: which models have room now, which misses are
urgent); the whole mechanism's effect is the simulator's (test_simulation.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from gateway.config.residency import ResidencySpec
from gateway.pools import Pool
from gateway.residency.waiting import Flight, WaitingRoom
from tests.gateway.residency.fakes import MB, A, Rig


@dataclass
class ScriptedPlacer:
    pool: Pool
    room_for: set[str] = field(default_factory=set)  # models a member has room for now
    urgent_models: set[str] = field(default_factory=set)
    tried: list[str] = field(default_factory=list)  # place() calls, in order

    def pool_of(self, model: str) -> Pool | None:
        return self.pool

    def resident(self, model: str) -> bool:
        return False

    def known(self, pool: Pool, model: str) -> bool:
        return True

    async def refresh(self, pool: Pool) -> None:
        return None

    def place(self, flight: Flight) -> None:
        self.tried.append(flight.model)
        if flight.model in self.room_for:
            self.room_for.discard(flight.model)
            flight.member = A

    def expected_in(self, flight: Flight) -> float | None:
        return 1.0

    def under_way(self, flight: Flight) -> bool:
        return False

    def stage(self, flight: Flight) -> tuple[str, str]:
        return (f"on member {flight.member}", "loading") if flight.member else (
            "", "no member has room yet")

    def never_fits(self, pool: Pool, model: str) -> bool:
        return False

    def no_room(self, pool: Pool, model: str) -> str:
        return "no room"

    def urgent(self, flight: Flight) -> bool:
        return flight.model in self.urgent_models


def _room() -> tuple[WaitingRoom, ScriptedPlacer]:
    pool = Rig({}, budget=100 * MB).pool
    placer = ScriptedPlacer(pool)
    spec = ResidencySpec(memory_budget_bytes=100 * MB)
    return WaitingRoom(placer, lambda pool: spec, asyncio.get_running_loop().time), placer


async def _waiting(room: WaitingRoom, model: str) -> asyncio.Future[None]:
    task = asyncio.ensure_future(room.wait(model, 10.0))
    for _ in range(3):
        await asyncio.sleep(0)
    assert room.waiters(model) >= 1
    return task


async def test_a_new_miss_waits_behind_an_urgent_one_no_member_has_room_for() -> None:
    room, placer = _room()
    big = await _waiting(room, "big")  # no room for it: unplaced
    placer.urgent_models.add("big")  # its first request fails unless its room is made now
    placer.room_for.add("small")  # room a small model fits, a part of what big needs
    small = await _waiting(room, "small")
    assert placer.tried == ["big", "big"]  # big tried again first; small not placed
    assert room.flights["small"].member is None
    assert [f.model for f in room.unplaced()] == ["big", "small"]
    for task in (big, small):
        task.cancel()
    await asyncio.gather(big, small, return_exceptions=True)


async def test_without_an_urgent_miss_waiting_a_new_miss_takes_the_room_it_finds() -> None:
    room, placer = _room()
    big = await _waiting(room, "big")
    placer.room_for.add("small")
    small = await _waiting(room, "small")
    assert placer.tried == ["big", "big", "small"]
    assert room.flights["small"].member == A and room.flights["big"].member is None
    room.resident("small")
    await asyncio.wait_for(small, 1)
    big.cancel()
    await asyncio.gather(big, return_exceptions=True)


async def test_room_freed_since_the_last_round_goes_to_the_miss_waiting_before_a_new_one(
) -> None:
    room, placer = _room()
    old = await _waiting(room, "old")
    placer.room_for.add("old")  # room freed meanwhile (a probation model aged)
    new = await _waiting(room, "new")
    assert placer.tried == ["old", "old", "new"]
    assert room.flights["old"].member == A and room.flights["new"].member is None
    for task in (old, new):
        task.cancel()
    await asyncio.gather(old, new, return_exceptions=True)


async def test_the_urgent_go_first_then_those_most_requests_wait_for() -> None:
    room, placer = _room()
    loop = asyncio.get_running_loop()
    for model, waiters, started in (("cold", 1, 1.0), ("hot", 9, 2.0), ("late", 1, 3.0)):
        room.flights[model] = Flight(model, placer.pool, loop.create_future(), started,
                                     waiters=waiters)
    assert [f.model for f in room.unplaced()] == ["hot", "cold", "late"]
    placer.urgent_models.add("late")
    assert [f.model for f in room.unplaced()] == ["late", "hot", "cold"]
