"""Server settings fanned out to pool members: Triton's trace and log settings.

A gateway in front of pools answers for all of them, so a settings call goes to every
member concerned (global trace and log settings: every member of every pool; a model's
trace settings: every member of the pools serving it), and the answers are settled into
one: every member agreed -> the first member's answer; every member refused in Triton's
own words -> the first refusal, relayed; anything else (some applied it, some could not
be reached or refused) -> :class:`Unavailable` naming each member that failed, so a
client never mistakes a partial change for a whole one.

Transport-free: the adapters supply the per-member call and say which answers are
Triton's refusals.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from gateway.control.model_control import ModelControl
from gateway.errors import GatewayError, Unavailable
from gateway.pools import PoolMember

T = TypeVar("T")


@dataclass(frozen=True)
class MemberAnswer(Generic[T]):
    member: PoolMember
    answer: T | None = None  # the member's answer (success or Triton's refusal)
    error: BaseException | None = None  # the call itself failed (unreachable, ...)


def settings_members(control: ModelControl, model: str | None = None) -> list[PoolMember]:
    """Every member a settings call concerns (each once)."""
    if model is not None:
        members = control.owners(model)
    else:
        members = [m for p in control.core.state.pools for m in p.members]
    unique = {m.key: m for m in members}
    if not unique:
        raise Unavailable("no Triton member to apply the setting on")
    return list(unique.values())


async def fan_out(members: Sequence[PoolMember],
                  call: Callable[[PoolMember], Awaitable[T]]) -> list[MemberAnswer[T]]:
    results = await asyncio.gather(*(call(m) for m in members), return_exceptions=True)
    answers: list[MemberAnswer[T]] = []
    for member, result in zip(members, results, strict=True):
        if isinstance(result, BaseException):
            if not isinstance(result, Exception):
                raise result  # cancellation and the like are not a member's answer
            answers.append(MemberAnswer(member, error=result))
        else:
            answers.append(MemberAnswer(member, answer=result))
    return answers


def settle(answers: Sequence[MemberAnswer[T]], refused: Callable[[T], str | None],
           relay_refusal: Callable[[T], T] | None = None) -> T:
    """One answer for the client. ``refused(answer)``: Triton's message when the answer
    is a refusal, else None. Errors raised by a call (:class:`GatewayError`, or an
    adapter's relayed Triton error carrying ``details``) count as failures."""
    ok = [a.answer for a in answers if a.error is None and a.answer is not None
          and refused(a.answer) is None]
    failures = [(a.member.key, _message(a, refused)) for a in answers
                if a.error is not None or a.answer is None or refused(a.answer) is not None]
    if not failures and ok:
        return ok[0]
    refusals = [a for a in answers if a.error is None and a.answer is not None
                and refused(a.answer) is not None]
    if not ok and len(refusals) == len(answers):
        first = refusals[0].answer
        assert first is not None
        return relay_refusal(first) if relay_refusal else first
    relayed = [a.error for a in answers if a.error is not None
               and not isinstance(a.error, GatewayError)]
    if not ok and len(relayed) == len(answers):
        raise relayed[0]  # every member refused (gRPC: Triton's status), relay the first
    detail = "; ".join(f"{key}: {message}" for key, message in failures)
    raise Unavailable(f"applied on {len(ok)} of {len(answers)} members; failed: {detail}")


def _message(answer: MemberAnswer[T], refused: Callable[[T], str | None]) -> str:
    if answer.error is not None:
        error = answer.error
        return str(getattr(error, "message", None) or getattr(error, "details", None)
                   or error)
    return (refused(answer.answer) if answer.answer is not None else None) or "no answer"
