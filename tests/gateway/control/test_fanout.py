"""How fanned-out settings answers settle into one (pure, no sockets)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.config.pools import MemberSpec
from gateway.control.fanout import MemberAnswer, fan_out, settle
from gateway.errors import Unavailable
from gateway.pools import PoolMember

A, B, C = (PoolMember("p", MemberSpec(grpc_port=port)) for port in (1001, 1002, 1003))


def _refused(answer: tuple[int, str]) -> str | None:
    return answer[1] if answer[0] >= 400 else None


class Relayed(Exception):
    def __init__(self, details: str) -> None:
        super().__init__(details)
        self.details = details


def test_settle_answers_first_member_when_all_agree() -> None:
    answers = [MemberAnswer(A, (200, "a")), MemberAnswer(B, (200, "b"))]
    assert settle(answers, _refused) == (200, "a")


def test_settle_relays_triton_refusal_when_every_member_refuses() -> None:
    answers = [MemberAnswer(A, (400, "bad setting")), MemberAnswer(B, (400, "bad setting"))]
    assert settle(answers, _refused) == (400, "bad setting")


def test_settle_reraises_relayed_error_when_every_member_refuses_over_grpc() -> None:
    first = Relayed("bad setting")
    answers: list[MemberAnswer[str]] = [MemberAnswer(A, error=first),
                                        MemberAnswer(B, error=Relayed("bad setting"))]
    with pytest.raises(Relayed) as caught:
        settle(answers, lambda _: None)
    assert caught.value is first


def test_settle_names_failed_members_when_some_fail() -> None:
    answers = [MemberAnswer(A, (200, "ok")), MemberAnswer(B, (400, "unknown model")),
               MemberAnswer(C, error=Unavailable("member unreachable: refused"))]
    with pytest.raises(Unavailable) as caught:
        settle(answers, _refused)
    message = caught.value.message
    assert message.startswith("applied on 1 of 3 members")
    assert f"{B.key}: unknown model" in message
    assert f"{C.key}: member unreachable: refused" in message
    assert A.key not in message


def test_fan_out_calls_every_member_when_some_raise() -> None:
    called = []

    async def call(member: PoolMember) -> str:
        called.append(member.key)
        if member is B:
            raise Unavailable("down")
        return member.key

    answers = asyncio.run(fan_out([A, B, C], call))
    assert sorted(called) == sorted(m.key for m in (A, B, C))
    assert [a.answer for a in answers] == [A.key, None, C.key]
    assert isinstance(answers[1].error, Unavailable)
