"""The Python forwarder's misses (gateway/python/forwarder.py): a request for a model no
member holds waits for the state's miss handler, then goes to the members the state
names, or, while it names none, to those the handler's answer named (a data-plane
replica whose snapshot lags the control plane's answer). Fake calls, no sockets."""

from __future__ import annotations

import pytest

from gateway.errors import Unavailable
from gateway.python.forwarder import Forwarder, RequestOptions
from gateway.state import PoolMember
from tests.gateway.residency.fakes import MB, A, B, config


class Calls:
    """An upstream call that answers which member it reached."""

    def __init__(self, failing: frozenset[str] = frozenset()) -> None:
        self.reached: list[str] = []
        self.failing = failing

    async def __call__(self, member: PoolMember) -> str:
        self.reached.append(member.key)
        if member.key in self.failing:
            raise Unavailable(f"{member.key} cannot be reached")
        return "ok"


def _forwarder(named: frozenset[str] | None, holders: tuple[str, ...] = ()) -> Forwarder:
    """A forwarder whose misses are answered ``named``, the state set to ``holders``."""
    dp = Forwarder.for_config(config({"m": 30 * MB}, budget=100 * MB))

    async def miss(model: str, deadline_s: float | None) -> frozenset[str] | None:
        if holders:
            dp.state.set_holders(model, holders)
        return named

    dp.state.on_miss(miss)
    return dp


async def test_a_miss_goes_to_the_member_its_answer_names_while_the_state_names_none(
        ) -> None:
    dp, calls = _forwarder(frozenset({B})), Calls()
    for _ in range(3):  # least loaded would pick A as often as B
        assert await dp.forward("m", calls, protocol="grpc",
                                options=RequestOptions(deadline_s=5.0)) == "ok"
    assert calls.reached == [B, B, B]


async def test_a_miss_goes_where_the_state_says_once_it_names_holders() -> None:
    dp, calls = _forwarder(None, holders=(A,)), Calls()
    assert await dp.forward("m", calls, protocol="http") == "ok"
    assert calls.reached == [A]


async def test_a_named_member_that_fails_is_not_retried_on_one_that_holds_nothing() -> None:
    dp, calls = _forwarder(frozenset({B})), Calls(failing=frozenset({B}))
    with pytest.raises(Unavailable, match="all members serving 'm' failed"):
        await dp.forward("m", calls, protocol="http")
    assert calls.reached == [B]
