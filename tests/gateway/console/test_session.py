"""Console sessions: random ids, idle expiry, and the form checks (CSRF, origin)."""

from __future__ import annotations

import pytest

from gateway.auth import Principal, Scope
from gateway.console.session import Sessions, check_form
from gateway.errors import Forbidden

OWNER = Principal("owner", frozenset({Scope.UPLOAD}))


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def test_sessions_are_random_and_end_when_idle_or_closed() -> None:
    clock = Clock()
    sessions = Sessions(idle_s=60, clock=clock)
    a, b = sessions.open(OWNER), sessions.open(OWNER)
    assert a.id != b.id and a.csrf != b.csrf and len(a.id) >= 43
    assert sessions.find(a.id) is a
    assert sessions.find("forged") is None and sessions.find(None) is None
    assert a.can_upload and not a.is_admin
    clock.now = 59
    assert sessions.find(a.id) is a  # seen: its idle clock starts again
    clock.now = 100
    assert sessions.find(a.id) is a and sessions.find(b.id) is None
    sessions.close(a.id)
    assert sessions.find(a.id) is None


@pytest.mark.parametrize(("csrf", "origin", "message"), [
    (None, None, "CSRF token is missing"),
    ("wrong", "http://console:8000", "CSRF token is missing or stale"),
    ("GOOD", "http://evil.example", "not from this console"),
    ("GOOD", "null", "not from this console"),
    ("GOOD", "http://console:8001", "not from this console"),
])
def test_form_refused_unless_its_token_and_origin_are_the_sessions(
    csrf: str | None, origin: str | None, message: str
) -> None:
    session = Sessions().open(OWNER)
    presented = session.csrf if csrf == "GOOD" else csrf
    with pytest.raises(Forbidden, match=message):
        check_form(session, presented, origin, "console:8000")


def test_form_accepted_with_its_token_from_this_host_or_without_origin() -> None:
    session = Sessions().open(OWNER)
    check_form(session, session.csrf, "http://console:8000", "console:8000")
    check_form(session, session.csrf, None, "console:8000")
