"""What the gateway knows, changed through its owner's methods, followed by the Python
forwarder (no sockets)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.config import GatewayConfig
from gateway.config.pools import MemberSpec, PoolSpec
from gateway.errors import ModelNotFound
from gateway.policy.upstream import HEALTH_FALL, EjectionPolicy
from gateway.pools import PoolMember, build_pools
from gateway.python.forwarder import Forwarder
from gateway.state import GatewayState


def _dataplane() -> Forwarder:
    config = GatewayConfig(pools=(
        PoolSpec(name="a", members=(MemberSpec(grpc_port=1),), models=("m",),
                 capacity_per_member=2),
        PoolSpec(name="b", members=(MemberSpec(grpc_port=2), MemberSpec(grpc_port=3)),
                 models=("other",), capacity_per_member=3),
    ))
    return Forwarder.for_config(config, clock=lambda: 100.0)


def test_serving_a_model_from_other_pools_moves_the_forwarders_route_when_assigned() -> None:
    dataplane = _dataplane()
    state = dataplane.state
    route = dataplane.route("m")
    assert [p.name for p in route.pools] == ["a"] and route.limits.concurrency == 2
    state.serve("m", ["b"])  # the lifecycle's one call
    assert [p.name for p in route.pools] == ["b"] and route.limits.concurrency == 6
    assert [m.key for m in state.members_of("m")] == ["127.0.0.1:2", "127.0.0.1:3"]
    assert state.assignments() == {"m": ("b",)}
    with pytest.raises(ModelNotFound, match="unknown model: 'nope'"):
        state.members_of("nope")


def test_watchers_hear_of_readiness_changes_and_state_reads_back() -> None:
    state = _dataplane().state
    heard: list[str] = []
    state.watch(lambda: heard.append("changed"))
    state.mark_not_ready("m", "loading version 2")
    assert state.not_ready_reason("m") == "loading version 2"
    assert state.not_ready() == {"m": "loading version 2"}
    state.mark_ready("m")
    state.mark_ready("m")  # nothing left to change: no news
    assert heard == ["changed", "changed"] and state.not_ready_reason("m") is None
    state.note_used("late-model", 5.0)
    assert state.last_used() == {"late-model": 5.0}
    assert {"m", "other", "late-model"} <= state.known_models()


def test_ready_only_when_preloaded_not_draining_and_every_pool_has_a_member() -> None:
    state = _dataplane().state
    assert state.ready()
    state.set_preloaded(False)
    assert not state.ready()
    state.set_preloaded(True)
    member = state.pools[0].members[0]
    for _ in range(HEALTH_FALL):
        member.probed(passed=False, refused=False)
    assert not member.healthy and not state.ready()
    assert member.probed(passed=True, refused=False)  # back from the dead
    state.start_draining()
    assert not state.ready()


def test_recovery_hooks_hold_member_out_of_routing_until_done() -> None:
    async def scenario() -> None:
        state = _dataplane().state
        member = state.pools[0].members[0]
        release = asyncio.Event()
        seen: list[bool] = []

        async def reload(m: PoolMember) -> None:
            seen.append(m.available(state.clock()))
            await release.wait()

        state.on_recovery(reload)
        state.recovered(member, on_error=lambda exc: None)
        await asyncio.sleep(0)
        assert seen == [False] and member.restoring
        release.set()
        for _ in range(3):
            await asyncio.sleep(0)
        assert not member.restoring and member.available(state.clock())

    asyncio.run(scenario())


def test_a_member_back_again_while_restoring_is_restored_anew_and_routable_after() -> None:
    """It failed again mid-restore, and its restore waits on a call that failure lost:
    before, its next return found it still restoring and did nothing, and it stayed out
    of routing until that call's own timeout (a load's: minutes)."""
    async def scenario() -> None:
        state = _dataplane().state
        member = state.pools[0].members[0]
        lost, calls = asyncio.Event(), []

        async def reload(m: PoolMember) -> None:
            calls.append(len(calls))
            if len(calls) == 1:
                await lost.wait()  # never answered

        state.on_recovery(reload)
        for passed, refused in ((False, True), (True, False)):  # down, then back
            member.probed(passed, refused)
        state.recovered(member, on_error=lambda exc: None)
        await asyncio.sleep(0)
        assert calls == [0] and member.restoring
        for passed, refused in ((False, True), (True, False)):  # down again, back again
            assert member.probed(passed, refused) is (passed and not refused)
        state.recovered(member, on_error=lambda exc: None)
        for _ in range(5):
            await asyncio.sleep(0)
        assert calls == [0, 1]
        assert not member.restoring and member.available(state.clock())
        # the first restore ended (cancelled), not left waiting
        assert asyncio.all_tasks() == {asyncio.current_task()}

    asyncio.run(scenario())


def test_member_ejected_after_failure_and_back_when_it_answers() -> None:
    member = PoolMember("a", MemberSpec())
    assert member.failed(10.0, EjectionPolicy(failures=2)) is False
    assert member.failed(10.0, EjectionPolicy(failures=2))
    assert not member.available(10.5) and member.available(11.0)
    member.answered()
    assert member.consecutive_failures == 0
    member.observed(queue=4, version="2.57.0", now=12.0)
    assert (member.upstream_queue, member.queue_scraped_at, member.triton_version) == \
        (4, 12.0, "2.57.0")
    member.observed(queue=None, version=None, now=13.0)  # the queue kept, version unread
    assert member.upstream_queue == 4 and member.triton_version is None


def test_dns_pool_keeps_known_members_and_declared_ones_when_resolved() -> None:
    config = GatewayConfig(pools=(PoolSpec(name="d", dns="triton.svc"),))
    state = GatewayState(config, build_pools(config.pools))
    pool = state.pools[0]
    heard: list[int] = []
    state.watch(lambda: heard.append(len(pool.members)))
    assert state.resolved(pool, [MemberSpec(host="10.0.0.1"), MemberSpec(host="10.0.0.2")]) \
        == ["10.0.0.1:8001", "10.0.0.2:8001"]
    first = pool.members[0]
    first.request_started()
    assert state.resolved(pool, [MemberSpec(host="10.0.0.1")]) == []
    assert pool.members == [first] and first.in_flight == 1 and heard == [2, 1]
