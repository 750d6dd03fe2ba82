"""A replica's requests at holdings it left (``gateway/haproxy/drain.py``): what it tells
the feed on each poll, and what the feed tells an eviction (``SnapshotFeed.in_flight_at``)
through the interleavings that lost requests: the replica still routing by the old
version, a request ending after the holding left, a replica gone, the holding back."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from gateway.auth import TokenTable
from gateway.config import GatewayConfig
from gateway.config.pools import MemberSpec, PoolSpec
from gateway.config.residency import ResidencySpec
from gateway.core import Core
from gateway.haproxy.drain import (
    KEEP_S,
    MAX_BUSY,
    LeftHoldings,
    decode_busy,
    encode_busy,
    held_pairs,
)
from gateway.haproxy.feed import LIVE_AGENT_S, SnapshotFeed
from gateway.haproxy.snapshot import RouteState, Snapshot, server_name

POOL = PoolSpec(name="p", members=(MemberSpec(host="127.0.0.1", http_port=8000, grpc_port=8001),
                                   MemberSpec(host="127.0.0.2", http_port=8000, grpc_port=8001)),
                models=("*",), residency=ResidencySpec(memory_budget_bytes=1 << 30))


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _snapshot(*held: tuple[str, str]) -> Snapshot:
    """A bare snapshot whose routes hold ``(model, server)`` pairs in pool p."""
    models = sorted({model for model, _ in held})
    routes = tuple(RouteState(model=m, pools=(("p", 1.0),), max_in_system=10,
                              holders=(("p", tuple(s for x, s in held if x == m)),))
                   for m in models)
    return Snapshot(pools=(), routes=routes)


def test_holding_left_is_busy_until_its_requests_end_when_replica_moves_on() -> None:
    left = LeftHoldings(clock=Clock(0.0))
    left.applied(_snapshot(("m", "a"), ("m", "b")))
    assert not left.pending  # routed holdings are the control plane's to count
    left.applied(_snapshot(("m", "b")))
    counts = {("m", "p", "a"): 2}
    assert left.busy(lambda pair: counts.get(pair, 0)) == {("m", "p", "a"): 2}
    counts[("m", "p", "a")] = 0
    assert left.busy(lambda pair: counts.get(pair, 0)) == {}
    assert not left.pending  # forgotten: nothing new goes there


def test_holding_routed_again_is_no_longer_left_when_reloaded() -> None:
    left = LeftHoldings(clock=Clock(0.0))
    left.applied(_snapshot(("m", "a")))
    left.applied(_snapshot())
    left.applied(_snapshot(("m", "a")))
    assert not left.pending


def test_left_holding_forgotten_after_keep_bound_when_a_request_never_ends() -> None:
    clock = Clock(0.0)
    left = LeftHoldings(clock=clock)
    left.applied(_snapshot(("m", "a")))
    left.applied(_snapshot())
    assert left.busy(lambda pair: 1) == {("m", "p", "a"): 1}
    clock.t += KEEP_S
    assert left.busy(lambda pair: 1) == {}


def test_busy_round_trips_and_refuses_malformed_rows_when_decoded() -> None:
    busy = {("m/x", "p", "srv_1"): 3, ("n", "q", "s"): 1}
    assert decode_busy(encode_busy(busy)) == busy
    assert decode_busy("") == {}
    for bad in ('{"a": 1}', '[["m", "p", "s", 0]]', '[["m", "p", 1, 2]]',
                '[["m", "p", "s", true]]', '[["m", "p", "s"]]', "not json",
                "[" + ",".join(['["m","p","s",1]'] * (MAX_BUSY + 1)) + "]"):
        with pytest.raises(ValueError):
            decode_busy(bad)


def test_held_pairs_names_only_managed_routes_holders() -> None:
    unmanaged = RouteState(model="u", pools=(("p", 1.0),), max_in_system=10)
    snapshot = replace(_snapshot(("m", "a")), routes=(*_snapshot(("m", "a")).routes, unmanaged))
    assert held_pairs(snapshot) == {("m", "p", "a")}


# -- the feed: what an eviction reads ----------------------------------------------------
def _feed(mono: Clock) -> tuple[SnapshotFeed, Core]:
    core = Core.for_config(GatewayConfig(pools=(POOL,)))
    return SnapshotFeed(core, TokenTable(), clock=mono, wall_clock=Clock(1e9)), core


def test_eviction_waits_for_replica_requests_when_the_holding_left_its_routing() -> None:
    """The path of the residency benchmark's 404s: a replica's forwarder had a request
    at the member when the control plane, counting only its own HAProxy, unloaded."""
    feed, core = _feed(Clock(100.0))
    state = core.state
    member = state.pools[0].members[0]
    pair = ("m", "p", server_name(member.key))

    async def scenario() -> list[int]:
        seen = []
        state.set_holders("m", {member.key})
        routed, _ = await feed.next_after("", 0.0)  # the replica takes the holding
        feed.saw("r", routed)
        seen.append(await feed.in_flight_at("m", member))  # it routes there: unknown
        state.set_holders("m", set())  # draining: out of routing
        applied, _ = await feed.next_after(routed, 0.0)
        feed.saw("r", routed, {})  # not yet applied: its 0 says nothing of the holding
        seen.append(await feed.in_flight_at("m", member))
        feed.saw("r", applied, {pair: 2})  # applied, two requests still there
        seen.append(await feed.in_flight_at("m", member))
        feed.saw("r", applied, {})  # they ended
        seen.append(await feed.in_flight_at("m", member))
        return seen

    assert asyncio.run(scenario()) == [1, 1, 2, 0]


def test_replica_gone_or_of_unknown_version_counted_as_it_deserves_when_evicting() -> None:
    mono = Clock(100.0)
    feed, core = _feed(mono)
    member = core.state.pools[0].members[0]
    feed.saw("restored", "")  # expected back after a restart, version unknown
    assert asyncio.run(feed.in_flight_at("m", member)) == 1
    mono.t += LIVE_AGENT_S + 1  # silent since: gone, its requests with it
    assert asyncio.run(feed.in_flight_at("m", member)) == 0


def test_busy_said_last_stands_through_a_long_poll_when_not_repeated() -> None:
    feed, core = _feed(Clock(100.0))
    member = core.state.pools[0].members[0]
    pair = ("m", "p", server_name(member.key))
    version, _ = asyncio.run(feed.next_after("", 0.0))
    with feed.polling("r", version, {pair: 1}):
        assert asyncio.run(feed.in_flight_at("m", member)) == 1
    assert asyncio.run(feed.in_flight_at("m", member)) == 1
    feed.forget("r")
    assert asyncio.run(feed.in_flight_at("m", member)) == 0
