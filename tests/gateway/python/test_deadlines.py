"""The Python forwarder sheds a request its pool cannot answer within its deadline
(gateway/policy/deadline.py), from the members' measured service time and the pool's
load: at a fake member that holds requests until released, no sockets."""

from __future__ import annotations

import asyncio

import pytest

from gateway.config import GatewayConfig
from gateway.config.pools import MemberSpec, PoolSpec
from gateway.errors import DeadlineExceeded
from gateway.python.forwarder import Forwarder, RequestOptions
from tests.gateway.conftest import Held


def _dataplane(capacity: int = 2) -> Forwarder:
    config = GatewayConfig(pools=(PoolSpec(name="p", members=(MemberSpec(grpc_port=1),),
                                           capacity_per_member=capacity),))
    return Forwarder.for_config(config, clock=lambda: 100.0)


async def test_a_deadline_the_pool_cannot_meet_is_refused_before_the_member_sees_it() -> None:
    dp, held = _dataplane(), Held()
    member = dp.state.pools[0].members[0]
    within = RequestOptions(deadline_s=0.05)
    # nothing measured yet: nothing is refused for its deadline
    first = asyncio.create_task(dp.forward("m", held, protocol="http", options=within))
    await asyncio.sleep(0)
    member.served({"m": (10, 200_000)}, now=100.0)  # 20 ms a request
    # load 1 in a pool that executes 2 at once: 20 ms expected, within 50
    second = asyncio.create_task(dp.forward("m", held, protocol="http", options=within))
    await asyncio.sleep(0)
    # load 2: the third waits for one request's worth of the pool's work (no throughput
    # measured yet: 20 ms over a capacity of 2), 30 ms
    assert not second.done()
    with pytest.raises(DeadlineExceeded) as refused:  # 30 ms is more than 9/10 of 33
        await dp.forward("m", held, protocol="grpc", options=RequestOptions(deadline_s=0.033))
    assert refused.value.message == (
        "Deadline Exceeded: deadline of 33 ms cannot be met: model 'm' is expected to take "
        "30 ms in pool 'p' (load 2 for capacity 2), more than 9/10 of it; refused before "
        "Triton does the work")
    third = asyncio.create_task(dp.forward("m", held, protocol="http",
                                           options=RequestOptions(deadline_s=0.034)))
    no_deadline = asyncio.create_task(dp.forward("m", held, protocol="http"))
    await asyncio.sleep(0)
    held.release.set()
    assert await asyncio.gather(first, second, third, no_deadline) == ["ok"] * 4
    text = dp.metrics.render().decode()
    assert 'infergate_rejected_requests_total{model="m",reason="deadline"} 1.0' in text
    assert ('infergate_requests_total{model="m",outcome="deadline",pool="-",protocol="grpc",'
            'traffic="user"} 1.0') in text


async def test_a_call_its_client_ends_at_its_deadline_counts_deadline_before_it_cancelled(
        ) -> None:
    """A gRPC client ends a call at its deadline itself: the forwarder sees its task
    cancelled then, at about the deadline (``deadline.given_up_at_deadline``); with the
    grace HAProxy gives a stream, at the client's deadline, not the gateway's."""
    now = [100.0]
    config = GatewayConfig(pools=(PoolSpec(name="p", members=(MemberSpec(grpc_port=1),)),))
    dp, held = Forwarder.for_config(config, clock=lambda: now[0]), Held()

    async def cancelled_after(seconds: float, options: RequestOptions) -> None:
        call = asyncio.create_task(dp.forward("m", held, protocol="grpc", options=options))
        await asyncio.sleep(0)
        now[0] += seconds
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

    await cancelled_after(0.5, RequestOptions(deadline_s=0.5))  # its deadline: ended by it
    await cancelled_after(0.2, RequestOptions(deadline_s=0.5))  # the client gave up
    await cancelled_after(0.2, RequestOptions())  # no deadline
    # a stream behind HAProxy: 1.5 s left to the gateway, 0.5 s of them the client's
    await cancelled_after(0.5, RequestOptions(deadline_s=1.5, grace_s=1.0))
    text = dp.metrics.render().decode()
    for outcome, count in (("deadline", 2), ("cancelled", 2)):
        assert (f'infergate_requests_total{{model="m",outcome="{outcome}",pool="p",'
                f'protocol="grpc",traffic="user"}} {count}.0') in text
