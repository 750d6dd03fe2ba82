"""The Python forwarder applies the tenancy rule (gateway/policy/tenancy.py) with its own
counts: requests held at a fake member until released, no sockets."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable

from gateway.config import GatewayConfig, ModelPolicy
from gateway.config.pools import MemberSpec, PoolSpec
from gateway.config.tenancy import parse_tenancy
from gateway.errors import Overloaded
from gateway.policy import tenancy
from gateway.python.forwarder import Forwarder, RequestOptions
from tests.gateway.conftest import Held
from tests.gateway.residency.fakes import run_virtual

CAPACITY = 4  # one member: standard refused from 8, critical from 12, sheddable from 4


def _dataplane(clock: Callable[[], float] = lambda: 100.0, delay_ms: int = 0,
               refusals_per_s: int = 100) -> Forwarder:
    """``delay_ms``: the tenancy's refusal delay (0 here unless a test looks at it: the
    rule's tests see each refusal at once), ``refusals_per_s`` its refusals a second."""
    config = GatewayConfig(
        pools=(PoolSpec(name="p", members=(MemberSpec(grpc_port=1),),
                        capacity_per_member=CAPACITY),),
        queue_factor=2.0,
        tenancy=parse_tenancy({
            "refusal_delay_ms": delay_ms,
            "refusals_per_s": refusals_per_s,
            "default": {"priority": "sheddable"},
            "tenants": [{"name": "heavy", "keys": ["heavy-key"]},
                        {"name": "light", "keys": ["light-key"]},
                        {"name": "batch", "priority": "sheddable", "keys": ["batch-key"]},
                        {"name": "pay", "priority": "critical", "keys": ["pay-key"],
                         "max_in_flight": 5}]}))
    return Forwarder.for_config(config, clock=clock)


async def _offer(dp: Forwarder, held: Held, key: str, n: int,
                 deadline_s: float | None = None) -> list[asyncio.Task[str]]:
    options = RequestOptions(api_key=key, deadline_s=deadline_s)
    tasks = [asyncio.create_task(dp.forward("m", held, protocol="http", options=options))
             for _ in range(n)]
    await asyncio.sleep(0)  # each runs up to its upstream call, or is refused
    return tasks


def _admitted(tasks: list[asyncio.Task[str]]) -> list[asyncio.Task[str]]:
    return [t for t in tasks if not t.done() or t.exception() is None]


def _outcomes(tasks: list[asyncio.Task[str]]) -> Counter[str]:
    out: Counter[str] = Counter()
    for t in tasks:
        if t.done() and isinstance(t.exception(), Overloaded):
            err = t.exception()
            assert isinstance(err, Overloaded)
            out[err.reason] += 1
        else:
            out["admitted"] += 1
    return out


async def test_a_heavy_tenant_is_held_to_its_share_and_a_light_one_still_gets_in() -> None:
    dp, held = _dataplane(), Held()
    light = await _offer(dp, held, "light-key", 1)  # light is active: it has one in flight
    heavy = await _offer(dp, held, "heavy-key", 20)
    # the pool is anyone's below capacity (4), then heavy keeps its share of the standard
    # ceiling (8 split between the two active tenants, heavy and light: 4)
    assert _outcomes(heavy) == {"admitted": 4, "fair_share": 16}
    light += await _offer(dp, held, "light-key", 3)
    assert _outcomes(light) == {"admitted": 4}
    held.release.set()
    assert set(await asyncio.gather(*_admitted(heavy + light))) == {"ok"}
    assert dp.ledger.pools["p"] == 0 and sum(dp.ledger.totals.values()) == 0


async def test_a_lone_tenant_gets_its_whole_class_ceiling_until_another_arrives() -> None:
    now = [100.0]
    dp, held = _dataplane(lambda: now[0]), Held()
    heavy = await _offer(dp, held, "heavy-key", 20)
    # nobody else sends: heavy's share is the whole standard ceiling (8); the default
    # tenant and light, configured but idle, take nothing
    assert _outcomes(heavy) == {"admitted": 8, "saturated": 12}
    light = await _offer(dp, held, "light-key", 1)  # the pool is at the ceiling
    assert _outcomes(light) == {"saturated": 1}
    # light arrived: heavy's share shrinks to 4 at once; heavy's 8 in flight are not cut
    held.release.set()
    assert set(await asyncio.gather(*_admitted(heavy))) == {"ok"}
    held.release.clear()
    heavy = await _offer(dp, held, "heavy-key", 10)
    assert _outcomes(heavy) == {"admitted": 4, "fair_share": 6}
    light = await _offer(dp, held, "light-key", 2)
    assert _outcomes(light) == {"admitted": 2}
    held.release.set()
    await asyncio.gather(*_admitted(heavy + light))
    held.release.clear()
    now[0] += tenancy.ACTIVE_WINDOW_S + 0.1  # light idle past the window: heavy alone
    heavy = await _offer(dp, held, "heavy-key", 10)
    assert _outcomes(heavy) == {"admitted": 8, "saturated": 2}
    held.release.set()
    await asyncio.gather(*_admitted(heavy))


async def test_sheddable_goes_first_critical_keeps_room_to_the_hard_bound() -> None:
    dp, held = _dataplane(), Held()
    batch = await _offer(dp, held, "batch-key", 6)
    assert _outcomes(batch) == {"admitted": 4, "saturated": 2}  # refused from capacity
    keyless = await _offer(dp, held, "", 1)  # the default tenant: sheddable here
    assert _outcomes(keyless) == {"saturated": 1}
    err = keyless[0].exception()
    assert isinstance(err, Overloaded) and err.message == (
        "pool 'p' is saturated: load 4 for capacity 4; sheddable requests are refused "
        "from load 4") and err.retry_after_s == 1
    pay = await _offer(dp, held, "pay-key", 7)
    # critical gets in above capacity, until its own in-flight limit (5)
    assert _outcomes(pay) == {"admitted": 5, "tenant_limit": 2}
    held.release.set()
    assert set(await asyncio.gather(*_admitted(batch + pay))) == {"ok"}


async def test_a_class_ceiling_counts_every_class_and_metrics_are_per_tenant() -> None:
    dp, held = _dataplane(), Held()
    pay = await _offer(dp, held, "pay-key", 5)
    light = await _offer(dp, held, "light-key", 9)
    # critical's 5 count toward the load: standard gets in up to load 8, its ceiling
    assert _outcomes(pay) == {"admitted": 5}
    assert _outcomes(light) == {"admitted": 3, "saturated": 6}
    text = dp.metrics.render().decode()
    assert 'infergate_tenant_refused_requests_total{priority="standard",reason="saturated",' \
           'tenant="light"} 6.0' in text
    assert 'infergate_tenant_in_flight_requests{priority="critical",tenant="pay"} 5.0' in text
    held.release.set()
    assert set(await asyncio.gather(*_admitted(pay + light))) == {"ok"}
    assert 'infergate_tenant_in_flight_requests{priority="critical",tenant="pay"} 0.0' \
        in dp.metrics.render().decode()


async def test_a_tenancy_change_applies_at_once_and_keeps_counts_in_flight() -> None:
    dp, held = _dataplane(), Held()
    batch = await _offer(dp, held, "batch-key", 4)
    assert _outcomes(batch) == {"admitted": 4}
    dp.state.set_tenancy(parse_tenancy({"tenants": [
        {"name": "batch", "priority": "critical", "keys": ["batch-key"]}]}))
    more = await _offer(dp, held, "batch-key", 2)  # critical now: above capacity is fine
    assert _outcomes(more) == {"admitted": 2}
    dp.state.set_tenancy(None)  # tenancy off: the model's bound only
    assert dp.tenants is None
    held.release.set()
    assert set(await asyncio.gather(*batch, *more)) == {"ok"}
    assert dp.ledger.pools["p"] == 0


async def test_the_models_bound_refuses_lower_classes_first_and_never_critical_for_them(
        ) -> None:
    config = GatewayConfig(
        pools=(PoolSpec(name="p", members=(MemberSpec(grpc_port=1),), capacity_per_member=100),),
        models={"m": ModelPolicy(max_concurrency=4, max_queue=8)},  # the model's bound: 12
        queue_factor=2.0,
        tenancy=parse_tenancy({"tenants": [
            {"name": "batch", "priority": "sheddable", "keys": ["batch-key"]},
            {"name": "pay", "priority": "critical", "keys": ["pay-key"]}]}))
    dp, held = Forwarder.for_config(config, clock=lambda: 100.0), Held()
    batch = await _offer(dp, held, "batch-key", 10)
    std = await _offer(dp, held, "", 10)
    # sheddable's bound is a third of 12 (4), standard's two thirds (8): counted over the
    # model's requests of its class and the classes above it
    assert _outcomes(batch) == {"admitted": 4, "overloaded": 6}
    assert _outcomes(std) == {"admitted": 8, "overloaded": 2}
    # critical counts only critical requests: the 12 lower ones hold no room of its own
    pay = await _offer(dp, held, "pay-key", 14)
    assert _outcomes(pay) == {"admitted": 12, "overloaded": 2}
    err = pay[-1].exception()
    assert isinstance(err, Overloaded) and err.message == (
        "overloaded: model 'm' has 13 requests in the gateway (limit 12)")
    held.release.set()
    await asyncio.gather(*_admitted(batch + std + pay))


async def test_a_tenancy_refusal_waits_its_delay_on_its_own_and_counts_nowhere() -> None:
    dp, held = _dataplane(delay_ms=40), Held()
    loop = asyncio.get_running_loop()
    batch = await _offer(dp, held, "batch-key", 4)  # sheddable: the pool's capacity
    began = loop.time()
    refused = await _offer(dp, held, "batch-key", 1)
    assert not refused[0].done()  # waiting for its answer, in flight nowhere
    assert dp.ledger.pools["p"] == 4 and dp.ledger.totals["batch"] == 4
    pay = await _offer(dp, held, "pay-key", 5)  # others are decided meanwhile
    assert _outcomes(pay) == {"admitted": 5}
    # pay's limit (5) counts its requests in flight, not its refusals waiting: each of
    # two refused at once says 6, itself counted
    limited = await _offer(dp, held, "pay-key", 2)
    await asyncio.wait(refused + limited)
    assert loop.time() - began >= 0.04 * 0.99
    assert _outcomes(refused) == {"saturated": 1} and _outcomes(limited) == {"tenant_limit": 2}
    assert {t.exception().message for t in limited} == {  # type: ignore[union-attr]
        "tenant 'pay' has 6 requests in flight (its limit 5)"}
    # a deadline with no room for the delay within 9/10 of it: answered at once
    short = await _offer(dp, held, "batch-key", 1, deadline_s=0.044)
    assert _outcomes(short) == {"saturated": 1}
    held.release.set()
    assert set(await asyncio.gather(*batch, *pay)) == {"ok"}



def test_a_tenant_with_many_refusals_waiting_waits_longer_for_each() -> None:
    """The delay grows with the tenant's refusals waiting (``tenancy.refusal_delay_ms``):
    eleven refused at once at 100 a second wait the delay (40 ms) up to the fourth, then
    10 ms for each refusal waiting, itself counted, rounded up to a step of 50 ms (so
    that HAProxy has a tarpit for each); another tenant refused meanwhile
    waits the delay alone; once they are answered the next refusal waits the delay
    again. In virtual time: exact."""
    async def run() -> tuple[list[int], ...]:
        loop = asyncio.get_running_loop()
        dp, held = _dataplane(delay_ms=40), Held()
        admitted = await _offer(dp, held, "batch-key", 4)  # sheddable: the pool's capacity

        async def refused(key: str, n: int) -> list[int]:
            """Milliseconds until each of ``n`` refusals offered at once is answered."""
            began, ends = loop.time(), []
            tasks = await _offer(dp, held, key, n)
            for task in tasks:
                task.add_done_callback(lambda _: ends.append(round(1000 * (loop.time() - began))))
            await asyncio.wait(tasks)
            assert _outcomes(tasks) == {"saturated": n}
            return ends

        flood = asyncio.create_task(refused("batch-key", 11))
        await asyncio.sleep(0)  # (offered first)
        other = await refused("other-key", 1)  # the default tenant, sheddable too
        answers = (await flood, other, await refused("batch-key", 1))
        held.release.set()
        assert set(await asyncio.gather(*admitted)) == {"ok"}
        return answers

    flood, other, later = run_virtual(run())
    assert flood == [40, 40, 40, 40, 50, 100, 100, 100, 100, 100, 150]
    assert other == [40]
    assert later == [40]
