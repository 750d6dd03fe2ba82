"""The Python plane's queue in front of a pool (gateway/python/queueing.py), with a fake
clock and slots the test sets: the policy's order, and the interleavings that break a
queue (a caller cancelled while queued or just as it is granted, the bound passing,
members leaving and coming back while requests wait); then through the forwarder, with
a fake member (no sockets): a member gets only its slots, a deadline passing in the
queue and a member leaving while requests wait are answered as the policy says."""

from __future__ import annotations

import asyncio

import pytest

from gateway.config import GatewayConfig
from gateway.config.pools import MemberSpec, PoolSpec
from gateway.config.tenancy import Priority, parse_tenancy
from gateway.errors import DeadlineExceeded, Unavailable
from gateway.policy import queueing
from gateway.python.forwarder import Forwarder, RequestOptions
from gateway.python.queueing import PoolQueue, QueueTimeout
from tests.gateway.conftest import Held


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _queue(slots: int = 1) -> tuple[PoolQueue, list[int], FakeClock]:
    box, clock = [slots], FakeClock()
    return PoolQueue(lambda: box[0], clock), box, clock


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_queue_serves_critical_before_earlier_sheddable_when_a_slot_frees() -> None:
    queue, _, _ = _queue()
    await queue.acquire((0, 0), 1.0)  # the one slot, held
    order: list[str] = []

    async def wait(name: str, priority: Priority, arrived_ms: int) -> None:
        await queue.acquire(queueing.order_key(priority, arrived_ms, 0), 5.0)
        order.append(name)
        queue.release()

    tasks = [asyncio.create_task(wait("shed", Priority.SHEDDABLE, 1)),
             asyncio.create_task(wait("std", Priority.STANDARD, 2)),
             asyncio.create_task(wait("crit", Priority.CRITICAL, 3))]
    await _settle()
    assert queue.waiting == 3 and order == []
    queue.release()
    await asyncio.gather(*tasks)
    assert order == ["crit", "std", "shed"]
    assert queue.busy == 0 and queue.waiting == 0


async def test_queue_orders_a_class_by_virtual_time_when_a_tenant_has_a_backlog() -> None:
    """A flood with 64 in the gateway queued 100 ms before a light tenant with none: the
    light one goes first (64 x 10 ms of virtual time at weight 1)."""
    queue, _, _ = _queue()
    await queue.acquire((0, 0), 1.0)
    order: list[str] = []
    cost = queueing.cost_us(1.0)

    async def wait(name: str, arrived_ms: int, backlog: int) -> None:
        key = queueing.order_key(Priority.STANDARD, arrived_ms,
                                 queueing.offset_ms(backlog, cost))
        await queue.acquire(key, 5.0)
        order.append(name)
        queue.release()

    tasks = [asyncio.create_task(wait("flood", 1000, 64)),
             asyncio.create_task(wait("light", 1100, 0))]
    await _settle()
    queue.release()
    await asyncio.gather(*tasks)
    assert order == ["light", "flood"]


def test_offset_grows_with_backlog_over_weight_and_is_capped() -> None:
    assert queueing.offset_ms(0, queueing.cost_us(1.0)) == 0
    assert queueing.offset_ms(64, queueing.cost_us(1.0)) == 640
    assert queueing.offset_ms(64, queueing.cost_us(2.0)) == 320
    assert queueing.offset_ms(10**9, queueing.cost_us(0.001)) == queueing.MAX_OFFSET_MS
    assert queueing.order_key(None, 5, 0) == (queueing.NO_CLASS_RANK, 5)


async def test_cancelled_while_queued_leaves_no_trace_and_the_next_one_gets_the_slot() -> None:
    queue, _, _ = _queue()
    await queue.acquire((0, 0), 1.0)
    first = asyncio.create_task(queue.acquire((1, 1), 5.0))
    second = asyncio.create_task(queue.acquire((1, 2), 5.0))
    await _settle()
    first.cancel()
    await _settle()
    assert queue.waiting == 1
    queue.release()
    assert await second == 0.0  # the fake clock did not move
    assert queue.busy == 1 and queue.waiting == 0
    with pytest.raises(asyncio.CancelledError):
        await first


async def test_cancelled_just_as_granted_hands_the_slot_on() -> None:
    queue, _, _ = _queue()
    await queue.acquire((0, 0), 1.0)
    first = asyncio.create_task(queue.acquire((1, 1), 5.0))
    second = asyncio.create_task(queue.acquire((1, 2), 5.0))
    await _settle()
    queue.release()  # granted to first, which has not resumed yet ...
    first.cancel()  # ... and is cancelled before it does
    await _settle()
    assert second.done() and queue.busy == 1 and queue.waiting == 0
    with pytest.raises(asyncio.CancelledError):
        await first


async def test_bound_passing_while_queued_raises_with_the_wait() -> None:
    queue, _, clock = _queue()
    await queue.acquire((0, 0), 1.0)
    waiting = asyncio.create_task(queue.acquire((1, 1), 0.05))
    await _settle()
    clock.now += 0.3
    with pytest.raises(QueueTimeout) as raised:
        await waiting
    assert raised.value.waited_s == pytest.approx(0.3) and raised.value.members
    assert queue.waiting == 0 and queue.busy == 1
    queue.release()
    assert queue.busy == 0


async def test_member_removed_while_queued_times_out_as_no_member_and_back_grants() -> None:
    queue, slots, _ = _queue(slots=2)
    await queue.acquire((0, 0), 1.0)
    await queue.acquire((0, 1), 1.0)
    slots[0] = 0  # both members gone
    waiting = asyncio.create_task(queue.acquire((1, 1), 0.05))
    with pytest.raises(QueueTimeout) as raised:
        await waiting
    assert not raised.value.members
    queue.release()
    queue.release()  # their requests ended: no slot to give while the pool has none
    assert queue.busy == 0
    later = asyncio.create_task(queue.acquire((1, 2), 5.0))
    await _settle()
    assert not later.done()
    slots[0] = 1  # a member back: the probe round's grant() hands its slot out
    queue.grant()
    await later
    assert queue.busy == 1


def test_expired_message_reads_like_tritons_deadline() -> None:
    text = queueing.expired_message("p", 301, 300)
    assert text == ("Deadline Exceeded: no member was free in time (301 ms in the gateway's "
                    "queue of pool 'p', at most 300 ms)")
    assert queueing.expired_message("p", 5, 300, members=False).startswith(
        "no healthy Triton member could take the request (5 ms")
    assert queueing.expired_message("p", 20, 300, deadline_passed=True).startswith(
        "Deadline Exceeded: the request's deadline passed while it waited (20 ms")


# -- through the forwarder: a fake member, the queue's slots and its answers -----------

def _forwarder(slots: int = 1, wait_ms: int = 5_000, lane: int = 0) -> Forwarder:
    """``lane``: the pool's lane_per_member (0 here unless a test is about the lane)."""
    config = GatewayConfig(
        pools=(PoolSpec(name="p", members=(MemberSpec(grpc_port=1),), capacity_per_member=slots,
                        gateway_queue=True, max_queue_wait_ms=wait_ms,
                        lane_per_member=lane),),
        queue_factor=20.0,
        tenancy=parse_tenancy({
            "refuse_at": {"sheddable": 8, "standard": 9, "critical": 10},
            "tenants": [{"name": "batch", "priority": "sheddable", "keys": ["batch-key"]},
                        {"name": "pay", "priority": "critical", "keys": ["pay-key"]},
                        {"name": "app", "keys": ["app-key"]},
                        {"name": "ops", "keys": ["ops-key"]}]}))
    return Forwarder.for_config(config, clock=FakeClock())


def _send(dp: Forwarder, call: Held, key: str,
          deadline_s: float | None = None) -> asyncio.Task[str]:
    return asyncio.create_task(dp.forward("m", call, protocol="http", options=RequestOptions(
        api_key=key, deadline_s=deadline_s)))


async def _behind_one(dp: Forwarder, held: Held,
                      key: str) -> tuple[asyncio.Task[str], asyncio.Task[str]]:
    """The pool's one slot taken by a sheddable request held at its member, then a
    request of ``key``'s, each settled."""
    first = _send(dp, held, "batch-key")
    await _settle()
    second = _send(dp, held, key)
    await _settle()
    return first, second


async def test_forwarder_sends_a_member_only_its_slots_and_serves_critical_first() -> None:
    dp, held = _forwarder(slots=1), Held()
    order: list[str] = []

    async def noted(name: str) -> str:
        result = await _send(dp, held, f"{name}-key")
        order.append(name)
        return result

    first = asyncio.create_task(noted("batch"))
    await _settle()
    member = dp.state.pools[0].members[0]
    later = [asyncio.create_task(noted("batch")), asyncio.create_task(noted("pay"))]
    await _settle()
    assert member.in_flight == 1 and dp.queues["p"].waiting == 2
    held.release.set()
    await asyncio.gather(first, *later)
    assert order == ["batch", "pay", "batch"]
    assert dp.queues["p"].busy == 0 and dp.ledger.pools["p"] == 0


async def test_forwarder_answers_deadline_exceeded_when_the_deadline_passes_queued() -> None:
    dp, held = _forwarder(slots=1), Held()
    first = _send(dp, held, "batch-key")
    await _settle()
    late = _send(dp, held, "pay-key", deadline_s=0.05)
    with pytest.raises(DeadlineExceeded) as raised:
        await late
    assert str(raised.value).startswith(queueing.DEADLINE_PASSED)
    assert dp.ledger.pools["p"] == 1 and dp.queues["p"].waiting == 0  # counted out
    held.release.set()
    assert await first == "ok"
    assert dp.queues["p"].busy == 0


async def test_forwarder_answers_unavailable_when_the_member_leaves_while_queued() -> None:
    dp, held = _forwarder(slots=1, wait_ms=50), Held()
    first, queued = await _behind_one(dp, held, "pay-key")
    dp.state.pools[0].members[0].healthy = False  # the probe finds it down meanwhile
    with pytest.raises(Unavailable) as raised:
        await queued
    assert str(raised.value).startswith(queueing.NO_MEMBER + " (")
    held.release.set()
    assert await first == "ok"


async def test_waiters_gone_while_nothing_is_granted_do_not_pile_up() -> None:
    queue, slots, _ = _queue(slots=0)  # no member: nothing is ever granted
    for i in range(300):
        with pytest.raises(QueueTimeout):
            await queue.acquire((1, i), 0.0)
    assert queue.waiting == 0 and len(queue._heap) <= 64


# -- the lane: a light tenant's request does not wait for a slot ------------------------

def test_takes_lane_is_for_light_standard_tenants_only() -> None:
    assert queueing.takes_lane(Priority.STANDARD, 0, 1)
    assert queueing.takes_lane(Priority.STANDARD, 1, 2)
    assert not queueing.takes_lane(Priority.STANDARD, 1, 1)  # does not fit in it whole
    assert not queueing.takes_lane(Priority.CRITICAL, 0, 4)  # first in line already
    assert not queueing.takes_lane(Priority.SHEDDABLE, 0, 4)  # sheddable waits
    assert not queueing.takes_lane(None, 0, 4)  # no tenants: first come, first served
    assert not queueing.takes_lane(Priority.STANDARD, 0, 0)  # no lane


async def test_lane_slot_only_once_the_pools_slots_are_full_and_per_member() -> None:
    box, lane, clock = [1], [1], FakeClock()
    queue = PoolQueue(lambda: box[0], clock, lambda: lane[0])
    assert not queue.take_lane()  # a slot is free: the request takes it, not the lane
    await queue.acquire((1, 0), 1.0)
    assert queue.take_lane() and not queue.take_lane()  # the lane's one slot
    lane[0] = 2  # a member back: its lane slot too
    assert queue.take_lane()
    queue.release_lane()
    queue.release_lane()
    assert queue.lane_busy == 0 and queue.busy == 1


async def test_forwarder_sends_a_light_tenant_through_the_lane_while_the_slots_are_full(
        ) -> None:
    dp, held = _forwarder(slots=1, lane=1), Held()
    first, app = await _behind_one(dp, held, "app-key")  # light: at its member, in the lane
    member, queue = dp.state.pools[0].members[0], dp.queues["p"]
    assert member.in_flight == 2 and queue.lane_busy == 1 and queue.waiting == 0
    waiting = [_send(dp, held, "app-key"),  # its second: a backlog the lane cannot hold
               _send(dp, held, "ops-key"),  # light too, but the lane is full
               _send(dp, held, "pay-key"),  # critical: first in line, never the lane
               _send(dp, held, "batch-key")]  # sheddable: never the lane
    await _settle()
    assert member.in_flight == 2 and queue.waiting == 4
    held.release.set()
    assert await asyncio.gather(first, app, *waiting) == ["ok"] * 6
    assert queue.busy == 0 and queue.lane_busy == 0 and dp.ledger.pools["p"] == 0


async def test_a_lane_request_cancelled_at_its_member_gives_the_lane_back() -> None:
    dp, held = _forwarder(slots=1, lane=1), Held()
    first, app = await _behind_one(dp, held, "app-key")
    assert dp.queues["p"].lane_busy == 1
    app.cancel()  # its client gave up
    with pytest.raises(asyncio.CancelledError):
        await app
    assert dp.queues["p"].lane_busy == 0
    again = _send(dp, held, "ops-key")  # the lane is free for the next light request
    await _settle()
    assert dp.queues["p"].lane_busy == 1 and dp.queues["p"].waiting == 0
    held.release.set()
    assert await asyncio.gather(first, again) == ["ok", "ok"]
