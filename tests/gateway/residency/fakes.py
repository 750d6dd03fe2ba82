"""Fakes at the residency's true boundaries: the members (``MemberAdmin``), the loader
that loads and warms on them, the footprints measured there, and the clock."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Collection, Coroutine
from typing import Any, TypeVar

from gateway.config import GatewayConfig, ModelPolicy
from gateway.config.pools import MemberSpec, PoolSpec
from gateway.config.residency import ResidencySpec, WaitingRoomSpec
from gateway.core import Core
from gateway.errors import DeployFailed
from gateway.pools import Pool, PoolMember
from gateway.residency.demand import DemandMeter
from gateway.residency.manager import Residency
from gateway.residency.metrics import ResidencyMetrics

MB = 1_000_000
T = TypeVar("T")


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock jumps to the next timer whenever nothing is ready: no
    real waiting (nothing here does I/O)."""

    def __init__(self) -> None:
        super().__init__()
        self._virtual = 0.0

    def time(self) -> float:
        return self._virtual

    def _run_once(self) -> None:
        scheduled = self._scheduled  # type: ignore[attr-defined]
        if not self._ready and scheduled:  # type: ignore[attr-defined]
            self._virtual = max(self._virtual, scheduled[0].when())
        super()._run_once()  # type: ignore[misc]


def run_virtual(work: Coroutine[Any, Any, T]) -> T:
    """``work`` to its end on a :class:`VirtualLoop` of its own."""
    loop = VirtualLoop()
    try:
        return loop.run_until_complete(work)
    finally:
        loop.close()


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeMembers:
    """What each member has loaded, and loads the test finishes when it says so: each
    load waits on its own future (``finish``/``fail``), or finishes at once
    (``instant``)."""

    def __init__(self, instant: bool = False) -> None:
        self.instant = instant
        self.ready: dict[str, set[str]] = {}
        self.pending: dict[tuple[str, str], asyncio.Future[None]] = {}
        self.loads: Counter[tuple[str, str]] = Counter()
        self.unloads: Counter[tuple[str, str]] = Counter()
        self.index_calls = 0
        self.client: Any = None  # (Footprints reads it; the fake footprints never call)

    # -- MemberAdmin's surface the residency uses ----------------------------------------
    async def load(self, member: PoolMember, model: str, config: Any = None) -> None:
        self.loads[member.key, model] += 1
        if not self.instant:
            future = self.pending[member.key, model] = (
                asyncio.get_running_loop().create_future())
            try:
                await future
            finally:
                self.pending.pop((member.key, model), None)
        self.ready.setdefault(member.key, set()).add(model)

    async def unload(self, member: PoolMember, model: str) -> None:
        self.unloads[member.key, model] += 1
        self.ready.setdefault(member.key, set()).discard(model)

    async def repository_index(self, member: PoolMember) -> list[dict[str, Any]]:
        self.index_calls += 1
        return [{"name": m, "state": "READY"} for m in sorted(self.ready.get(member.key, ()))]

    # -- the test's hand -------------------------------------------------------------------
    def finish(self, member: str, model: str) -> None:
        self.pending[member, model].set_result(None)

    def fail(self, member: str, model: str, message: str = "out of memory") -> None:
        self.pending[member, model].set_exception(DeployFailed(message))

    def restart(self, member: str) -> None:
        """The member's Triton restarted: nothing loaded."""
        self.ready[member] = set()


class FakeFootprints:
    """Footprints as configured (no process is measured)."""

    def __init__(self, sizes: dict[str, int]) -> None:
        self.sizes = sizes
        self.surges: dict[str, int] = {}  # what a load takes beyond its size (as measured)
        self.growths: dict[str, int] = {}  # the most a figure rose at a measure
        self.grown: dict[str, int] = {}  # figures the next remeasure of the model reads
        # figures another measure sets while the next remeasure runs (a load's first)
        self.meanwhile: dict[str, int] = {}
        self.remeasured: list[tuple[str, tuple[str, ...]]] = []

    def surge(self, models: Collection[str]) -> int:
        return max((self.surges.get(m, 0) for m in models), default=0)

    def growth(self, models: Collection[str]) -> int:
        return max((self.growths.get(m, 0) for m in models), default=0)

    def of(self, model: str, pool: Pool) -> tuple[int, str]:
        return self.sizes.get(model, 100 * MB), "configured"

    def bytes(self, model: str, pool: Pool) -> int:
        return self.of(model, pool)[0]

    def refresh(self, models: list[str]) -> None:
        pass

    async def gpu_before(self, member: PoolMember) -> int | None:
        return None

    async def measure(self, member: PoolMember, model: str, gpu_before: int | None = None,
                      started_after: float | None = None) -> None:
        pass

    async def released(self, member: PoolMember, model: str, timeout_s: float) -> bool:
        return True

    async def remeasure(self, member: PoolMember, models: Collection[str]) -> None:
        self.remeasured.append((member.key, tuple(sorted(models))))
        self.sizes.update({m: self.grown[m] for m in models if m in self.grown})
        self.sizes.update(self.meanwhile)
        self.meanwhile = {}


A, B = "127.0.0.1:9001", "127.0.0.1:9011"


def config(models: dict[str, int], budget: int, members: int = 2, **knobs: Any
           ) -> GatewayConfig:
    room = knobs.pop("waiting_room", {})
    # the mechanism's tests drive misses and plans into a budget as they set it; one that
    # tests the fill asks for it (the product's default is on)
    knobs.setdefault("fill_free_room", False)
    spec = ResidencySpec(memory_budget_bytes=budget, waiting_room=WaitingRoomSpec(**room),
                         **knobs)
    member_specs = tuple(MemberSpec(host="127.0.0.1", http_port=9000 + 10 * i,
                                    grpc_port=9001 + 10 * i, metrics_port=9002 + 10 * i)
                         for i in range(members))
    return GatewayConfig(
        pools=(PoolSpec(name="p", members=member_specs, models=tuple(models),
                        residency=spec),),
        models={m: ModelPolicy(on_demand=True, footprint_bytes=size)
                for m, size in models.items()})


class Rig:
    """A residency over fake members and a fake clock."""

    def __init__(self, models: dict[str, int], budget: int, members: int = 2,
                 instant: bool = False, **knobs: Any) -> None:
        self.clock = FakeClock()
        self.config = config(models, budget, members, **knobs)
        self.core = Core.for_config(self.config, clock=self.clock)
        self.members = FakeMembers(instant)
        self.footprints = FakeFootprints(models)
        self.warmed: list[tuple[str, str]] = []
        self.residency = Residency(
            self.core, self.members, self.load_one,  # type: ignore[arg-type]
            self.footprints,  # type: ignore[arg-type]
            DemandMeter(self.core.metrics, self._half_life(), None),
            ResidencyMetrics.create(self.core.metrics.registry))
        self.core.state.on_miss(self.residency.wait)
        self.used_seen: list[tuple[str, int]] = []  # (member, accounted use) at every change
        self.residency.table._listener = self._watch(self.residency.table._listener)

    def _half_life(self) -> float:
        spec = self.config.pools[0].residency
        assert spec is not None
        return spec.demand_half_life_s

    def _watch(self, listener: Any) -> Callable[[Any, Any], None]:
        def watched(before: Any, after: Any) -> None:
            listener(before, after)
            holding = after or before
            pool = self.pool
            self.used_seen.append((holding.member,
                                   self.residency.used_bytes(pool, holding.member)))
        return watched

    async def load_one(self, member: PoolMember, model: str, loaded: Callable[[], None]
                       ) -> None:
        await self.members.load(member, model)
        loaded()
        self.warmed.append((member.key, model))

    @property
    def pool(self) -> Pool:
        return self.core.state.pools[0]

    def member(self, key: str) -> PoolMember:
        return next(m for m in self.pool.members if m.key == key)

    def phase(self, member: str, model: str) -> str | None:
        holding = self.residency.table.get(member, model)
        return None if holding is None else str(holding.phase)

    async def settle(self, rounds: int = 5) -> None:
        """Let the tasks the residency started run as far as they can now."""
        for _ in range(rounds):
            await asyncio.sleep(0)

    def on_loop_time(self) -> None:
        """One clock, the running loop's (a :class:`VirtualLoop`'s: timed tests)."""
        loop = asyncio.get_running_loop()
        self.clock.now = loop.time()
        self.core.state.clock = loop.time
        self.residency.table._clock = loop.time
        self.residency.actuator.clock = loop.time
        self.residency.room.clock = loop.time

    async def until(self, check: Callable[[], bool], timeout_s: float = 2.0) -> None:
        async def poll() -> None:
            while not check():
                await asyncio.sleep(0.001)
        await asyncio.wait_for(poll(), timeout_s)
