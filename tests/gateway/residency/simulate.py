"""The residency's mechanism and policy over ``bench_residency``'s trace in virtual time:
fake members whose loads take what a real one's do, the rounds every second, every
request through the waiting room. Minutes of traffic in about a second, so a change to
the policy can be judged before the benchmark's real run (which measures what this
cannot: CPU, memory, the data planes).

    python -m tests.gateway.residency.simulate [--budget 0.25] [--seed 1]
        [--knob probation_share=0.25 ...] [--cores 2 --release-s 0.5 | --host measured]
        [--table]

The trace begins once the residency has settled (:func:`settled`: with the gateway's
default ``fill_free_room``, its free room filled), as ``bench_residency``'s does.
Prints per phase the hit ratio against the best fixed placement's, failures by message,
loads and evictions by reason; ``--table``: one row per budget (half, a quarter) and seed
(1, 2), as docs/residency.md's simulated table.

By default a member's loads slow only each other (20 % per other load there), and an
evicted model's room is free as soon as Triton unloads it. ``--cores N`` shares N cores
among every member's loads (a load of about 1.1 cores each, as measured on this host:
with more loads than that at once, each takes longer), and ``--release-s S`` has an
evicted model's processes exit S seconds after its unload (``release_wait_s`` waits for
them): the shared 2-core host of the real benchmark, roughly.

``--host measured`` times loads and exits as this host's members took them during the
benchmark itself (:data:`MEASURED`: Triton's own log, the gateway's transitions), with the
gateway's default waiting room: about three times slower than the plain model, and near
the failures the benchmark sees; its verdict on a change can still flip with its settings,
so the benchmark judges (docs/residency.md, "Measured").
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gateway.config.residency import ResidencySpec
from gateway.errors import GatewayError
from gateway.pools import PoolMember
from gateway.residency.holdings import PENDING
from loadtests.residency_figures import Outcome, recovery_s
from loadtests.residency_trace import (
    PHASES,
    Arrival,
    best_placement,
    popularity,
    reshuffles,
    schedule,
)
from tests.gateway.residency.fakes import MB, Rig, run_virtual

# a miss's waiters reach the member this long after its load (the control plane settles
# the snapshot that routes them on every data-plane replica, then answers the replica):
# a model evicted meanwhile fails them (in the benchmark they waited for it until their
# deadline)
FORWARD_S = 0.3
SETTLE_LIMIT_S = 120.0  # the most the trace waits for the residency to settle
EVICTED_FIRST = "evicted before its waiters reached it"
PAST_DEADLINE = "served after the client's own deadline"  # (its client had given up)
# stubs measured by bench_residency: 14 models of ~31 MB, 12 of ~64 MB, 10 of ~131 MB
CATALOGUE = ((14, "1mb", 31), (12, "32mb", 64), (10, "100mb", 131))


def catalogue() -> dict[str, int]:
    models, i = {}, 0
    for count, kind, mb in CATALOGUE:
        for _ in range(count):
            models[f"m{i:02d}_{kind}"] = mb * MB
            i += 1
    return models


def load_seconds(size: int) -> float:
    """A load's time on one of this host's members alone (bench_member_loads: about
    0.5 s for a 131 MB stub), 20 % longer for each other load running there."""
    return 0.35 + size / 1e9


LOAD_CORES = 1.1  # what one load keeps busy (bench_member_loads)


@dataclass(frozen=True)
class Host:
    """How long the members' loads and evicted models' exits take."""

    load_base_s: float  # a load's time, less its size's share
    load_s_per_gb: float
    release_s: float  # an evicted model's processes exit this long after its unload
    crowding: float  # a load's time grows by this for each other load on its member
    waiting_room: int | None  # requests the waiting room holds (None: the default)

    def load_seconds(self, size: int) -> float:
        """A load's time alone on its member."""
        return self.load_base_s + self.load_s_per_gb * size / 1e9


# bench_residency --quick, a quarter budget, on this 2-core host (2026-12-06, a run with
# nothing else running): Triton's own "loading" -> "successfully loaded", medians 0.65,
# 0.86 and 1.29 s for the 31, 64 and 131 MB stubs (74, 92 and 48 loads), under the
# benchmark's traffic and its other loads (so no crowding on top); an evicted model's
# "unloading" -> gone (the unload, then its stubs' exit), 1.35 s whatever its size: 1 s of
# it Triton's Python backend sleeping before it finalizes each instance (its stub's
# health check, StubLauncher::UpdateHealth; members serving the onnxruntime or tensorrt
# platforms have no stub to wait for: ``--release-s 0.35`` plays those); the gateway's
# default waiting room (REQUESTS_PER_MEMBER per member: 256 for the two here)
MEASURED = Host(load_base_s=0.45, load_s_per_gb=6.4, release_s=1.35, crowding=0.0,
                waiting_room=None)


@dataclass
class Result:
    phases: list[tuple[float, float, int]]  # (hits, best fixed's hits, failed) per phase
    failed: collections.Counter[str] = field(default_factory=collections.Counter)
    moves: collections.Counter[str] = field(default_factory=collections.Counter)
    over_budget: int = 0  # transitions that left a member's accounted use over budget
    requests: int = 0
    minutes: float = 0.0  # of traffic
    recovery: list[float | None] = field(default_factory=list)  # s after each reshuffle
    settle_s: float = 0.0  # before the trace (:func:`settled`)
    # every request: (arrival, hit / miss / failed, a failure's message)
    outcomes: list[tuple[Arrival, str, str]] = field(default_factory=list)

    @property
    def failures(self) -> int:
        return sum(self.failed.values())

    @property
    def loads_per_min(self) -> float:
        loads = sum(n for k, n in self.moves.items() if k.startswith("infergate_model_loads"))
        return loads / max(self.minutes, 1e-9)


async def simulate(budget_share: float, seed: int = 1, rate: float = 20.0,
                   phase_s: float = 30.0, deadline_s: float = 15.0,
                   knobs: dict[str, Any] | None = None,
                   load_s: Callable[[int], float] = load_seconds,
                   cores: float | None = None, release_s: float = 0.0,
                   host: Host | None = None) -> Result:
    """One trace over a pool of two members whose budgets each hold ``budget_share`` of
    every model's footprint together (``cores``, ``release_s``, ``host``: the
    module's; ``host`` replaces ``load_s`` and ``release_s``)."""
    models = catalogue()
    budget = int(sum(models.values()) * budget_share)
    crowding, room = 0.2, 128
    if host is not None:
        load_s, release_s = host.load_seconds, host.release_s
        crowding, room = host.crowding, host.waiting_room
    # the gateway's own default fill (the fakes' is off, for the mechanism's tests)
    knobs = {"min_resident_s": 5.0,
             "fill_free_room": ResidencySpec.model_fields["fill_free_room"].default,
             **(knobs or {})}
    knobs.setdefault("waiting_room", {"max_requests": room})
    rig = Rig(models, budget=budget, **knobs)
    loop = asyncio.get_running_loop()
    rig.on_loop_time()
    members = rig.members

    async def timed_load(member: PoolMember, model: str, config: Any = None) -> None:
        members.loads[member.key, model] += 1
        running = sum(1 for key, _ in members.pending if key == member.key)
        shared = 1.0 if cores is None else max(
            1.0, (len(members.pending) + 1) * LOAD_CORES / cores)
        members.pending[member.key, model] = loop.create_future()
        try:
            await asyncio.sleep(load_s(models[model]) * (1 + crowding * running) * shared)
        finally:
            members.pending.pop((member.key, model), None)
        members.ready.setdefault(member.key, set()).add(model)

    async def released(member: PoolMember, model: str, timeout_s: float) -> bool:
        await asyncio.sleep(min(release_s, timeout_s))
        return release_s <= timeout_s

    members.load = timed_load  # type: ignore[method-assign]
    rig.footprints.released = released  # type: ignore[method-assign]
    arrivals = schedule(list(models), rate, phase_s, seed)
    outcomes: list[tuple[Arrival, str, str]] = []  # (arrival, hit/miss/failed, message)
    result = Result([])

    async def request(arrival: Arrival) -> None:
        await asyncio.sleep(max(0.0, start + arrival.t - loop.time()))
        rig.core.state.note_used(arrival.model)
        hit = rig.core.state.resident(arrival.model)
        try:
            await rig.core.state.wait_resident(arrival.model, deadline_s)
            if not hit:  # the waiter goes on once every replica routes it there
                await asyncio.sleep(FORWARD_S)
                if not rig.core.state.resident(arrival.model):
                    raise GatewayError(EVICTED_FIRST)
                if loop.time() - start - arrival.t > deadline_s:
                    raise GatewayError(PAST_DEADLINE)
            outcomes.append((arrival, "hit" if hit else "miss", ""))
        except GatewayError as error:
            outcomes.append((arrival, "failed", error.message))
        # counted as its answer is (a data plane counts a request once it ends)
        rig.core.metrics.requests.labels(arrival.model, "p", arrival.protocol, "success",
                                         "user").inc()

    async def rounds() -> None:
        while True:
            await rig.residency.round()
            await asyncio.sleep(1.0)

    listener = rig.residency.table._listener
    assert listener is not None

    def watch(before: Any, after: Any) -> None:
        listener(before, after)
        if after is not None and rig.residency.used_bytes(rig.pool, after.member) > budget:
            result.over_budget += 1

    rig.residency.table._listener = watch
    start = await settled(rig)  # the trace begins once the residency has settled
    result.settle_s = start
    ticking = asyncio.ensure_future(rounds())
    await asyncio.gather(*(request(a) for a in arrivals))
    ticking.cancel()
    await rig.residency.close()
    result.requests, result.outcomes = len(outcomes), outcomes
    result.minutes = len(PHASES) * phase_s / 60
    popular = popularity(list(models), seed)
    for phase, p in enumerate(popular):
        mine = [o for o in outcomes if o[0].phase == phase]
        best = best_placement(p, models, budget)
        result.phases.append((sum(o[1] == "hit" for o in mine) / max(1, len(mine)),
                              float(sum(p[m] for m in best)),
                              sum(o[1] == "failed" for o in mine)))
    best_of = [best_placement(p, models, budget) for p in popular]
    marked = [Outcome(a.t, a.model, a.phase, a.protocol, "OK" if kind != "failed" else
                      "503", 0.0, None if kind == "hit" else 1.0, message)
              for a, kind, message in outcomes]
    shifts = reshuffles(phase_s)
    result.recovery = [recovery_s(marked, best_of, at, stop)
                       for at, stop in zip(shifts, [*shifts[1:], len(PHASES) * phase_s],
                                           strict=True)]
    result.failed.update(failure_kind(message) for _, kind, message in outcomes
                         if kind == "failed")
    for family in (*rig.residency.metrics.loads.collect(),
                   *rig.residency.metrics.evictions.collect()):
        for sample in family.samples:
            if sample.name.endswith("_total"):
                result.moves[f"{family.name}:{sample.labels['reason']}"] += int(sample.value)
    return result


async def settled(rig: Rig, limit_s: float = SETTLE_LIMIT_S) -> float:
    """Rounds every second until the residency settles (no load pending, and what the
    members hold the same a round later: the fill, if on, is done), at most ``limit_s``;
    when it did, on the loop's clock. ``bench_residency`` waits so before its traffic,
    as its all-resident arm waits for its members' loads."""
    loop = asyncio.get_running_loop()
    before: set[tuple[str, str, str]] | None = None
    while loop.time() < limit_s:
        await rig.residency.round()
        await asyncio.sleep(1.0)
        now = {(h.member, h.model, str(h.phase)) for h in rig.residency.table}
        if now == before and not any(h.phase in PENDING for h in rig.residency.table):
            break
        before = now
    return loop.time()


def failure_kind(message: str) -> str:
    """A failure's cause, as the benchmark counts them (at once: known when it came)."""
    if "waiting room" in message and "full" in message:
        return "room_full"
    if "has room for it now" in message:
        return "no_room"
    if "expected in" in message:
        return "load_too_long (at once)"
    if "so far" in message:
        return "load_too_long (held)"
    return message[:70]


def run(budget_share: float, seed: int = 1, **kwargs: Any) -> Result:
    return run_virtual(simulate(budget_share, seed, **kwargs))


def row(budget_share: float, seed: int, result: Result) -> str:
    """One line of docs/residency.md's simulated table."""
    hits = ", ".join(f"{100 * h:.1f} / {100 * b:.1f}" for h, b, _ in result.phases)
    recovery = ", ".join("-" if r is None else f"{r:.0f}" for r in result.recovery)
    share = {0.5: "half", 0.25: "a quarter"}.get(budget_share, str(budget_share))
    failed = 100 * result.failures / max(1, result.requests)
    return (f"| {share} | {seed} | {result.failures} ({failed:.1f} %) | {hits} % | {recovery} "
            f"| {result.loads_per_min:.0f} |")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=float, default=0.25,
                        help="a member's budget, as a share of every footprint together")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE",
                        help="a residency setting (JSON value), repeatable")
    parser.add_argument("--cores", type=float, default=None,
                        help="cores every member's loads share (default: not shared)")
    parser.add_argument("--release-s", type=float, default=None,
                        help="an evicted model's processes exit this long after its unload "
                             "(default 0; with --host measured, replaces its 1.35 s)")
    parser.add_argument("--host", choices=["measured"], default=None,
                        help="loads and exits timed as this host's members took them in "
                             "the benchmark (MEASURED), the default waiting room")
    parser.add_argument("--table", action="store_true",
                        help="both budgets (half, a quarter) and both seeds, one row each")
    args = parser.parse_args(argv)
    knobs = {k: json.loads(v) for k, v in (item.split("=", 1) for item in args.knob)}
    measured = None if args.host is None else MEASURED if args.release_s is None else \
        replace(MEASURED, release_s=args.release_s)
    host = {"cores": args.cores, "release_s": args.release_s or 0.0, "host": measured}
    if args.table:
        print("| budgets hold | seed | failed | hits / best fixed, per phase "
              "| recovery s | loads / min |")
        print("|---|---|---|---|---|---|")
        for share in (0.5, 0.25):
            for seed in (1, 2):
                print(row(share, seed, run(share, seed, knobs=knobs, **host)), flush=True)
        return
    result = run(args.budget, args.seed, knobs=knobs, **host)
    for i, (hits, best, failed) in enumerate(result.phases):
        print(f"phase {i}: hits {hits:.3f} (best fixed {best:.3f}), failed {failed}")
    print("failed:", dict(result.failed))
    print("moves:", dict(result.moves))
    print("recovery after each reshuffle (s):", result.recovery,
          f"loads / min: {result.loads_per_min:.0f}")
    print("accounted use over budget:", result.over_budget)
    print(f"settled before the trace in {result.settle_s:.0f} s")


if __name__ == "__main__":
    main()
