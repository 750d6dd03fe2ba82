"""One leader, on a real PostgreSQL: two contenders, one wins; the winner's session
killed, the other leads at its next poll, with the next term; a write carrying the old
term refused in its own transaction, nothing written; a leader that stopped confirming
stops acting; the states and their transitions."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from gateway.lifecycle.records.leader import Advertised, LeaderSeen, Leadership, LeaderState
from gateway.lifecycle.records.postgres import PostgresStore, connect
from gateway.lifecycle.records.store import ModelRecord, StaleTerm
from infergate.triton.local import free_port

pytestmark = pytest.mark.integration  # a real PostgreSQL: make test installs it

POLL_S = 0.2


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def contenders(pg_url: str, clock: FakeClock) -> Iterator[tuple[Leadership, Leadership]]:
    a = Leadership(pg_url, holder="a", clock=clock, poll_interval_s=POLL_S, grace_s=3.0)
    b = Leadership(pg_url, holder="b", clock=clock, poll_interval_s=POLL_S, grace_s=3.0)
    yield a, b
    a.close()
    b.close()


def kill_session(url: str, pid: int | None) -> None:
    """What a crashed node does to the leader's session, as the server sees it."""
    assert pid is not None
    with connect(url) as admin:
        admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))


def test_leadership_goes_to_one_when_two_contend(
        contenders: tuple[Leadership, Leadership]) -> None:
    a, b = contenders
    assert (a.poll(), b.poll()) == (LeaderState.LEADER, LeaderState.FOLLOWER)
    assert (a.poll(), b.poll()) == (LeaderState.LEADER, LeaderState.FOLLOWER)  # and stays
    assert a.term == 1 and a.fence_term() == 1 and b.term is None
    with pytest.raises(StaleTerm, match="does not lead"):
        b.fence_term()


def test_other_leads_within_poll_interval_when_leader_session_killed(
        pg_url: str, contenders: tuple[Leadership, Leadership]) -> None:
    a, b = contenders
    a.poll()
    b.poll()
    kill_session(pg_url, a.backend_pid)  # returns once the session is gone
    polls = 1
    while b.poll() is not LeaderState.LEADER and polls < 10:
        time.sleep(POLL_S)
        polls += 1
    assert b.state is LeaderState.LEADER and b.term == 2  # the next term
    assert polls == 1  # its first poll after the loss won: within one poll interval
    assert a.poll() is LeaderState.LOST  # the old leader learns at its next poll
    assert "connection to the database lost" in a.reason
    with pytest.raises(StaleTerm):
        a.fence_term()


def test_write_refused_when_it_carries_a_stale_term(
        pg_url: str, contenders: tuple[Leadership, Leadership]) -> None:
    a, b = contenders
    a.poll()
    old_leader = PostgresStore(pg_url, fence=a)
    old_leader.put_model(ModelRecord("m", "serving", 0.0, serving_version=1))
    kill_session(pg_url, a.backend_pid)
    b.poll()
    assert a.state is LeaderState.LEADER  # a has not polled since: it still believes
    with pytest.raises(StaleTerm, match="term 1 of 'control-plane', the current term is 2"):
        old_leader.put_model(ModelRecord("m", "serving", 0.0, serving_version=7))
    with pytest.raises(StaleTerm):
        old_leader.issue_version("m")
    new_leader = PostgresStore(pg_url, fence=b)
    model = new_leader.model("m")  # nothing of the refused writes landed
    assert model is not None and model.serving_version == 1
    assert new_leader.highest_version("m") == 0
    new_leader.put_model(ModelRecord("m", "serving", 0.0, serving_version=2))
    assert new_leader.issue_version("m") == 1
    old_leader.close()
    new_leader.close()


def test_demand_and_tenancy_writes_refused_when_they_carry_a_stale_term(
        pg_url: str, contenders: tuple[Leadership, Leadership]) -> None:
    a, b = contenders
    a.poll()
    old_leader = PostgresStore(pg_url, fence=a)
    old_leader.record_demand({"m": 4.0})
    old_leader.set_tenancy_override({"tenants": []})
    kill_session(pg_url, a.backend_pid)
    b.poll()
    with pytest.raises(StaleTerm, match="the current term is 2"):
        old_leader.record_demand({"m": 99.0})
    with pytest.raises(StaleTerm):
        old_leader.set_tenancy_override(None)
    new_leader = PostgresStore(pg_url, fence=b)
    demand, tenancy = new_leader.recorded_demand(), new_leader.tenancy_override()
    assert demand is not None and demand.rates == {"m": 4.0}  # nothing refused landed
    assert tenancy is not None and tenancy.document == {"tenants": []}
    assert new_leader.set_tenancy_override(None).deleted
    old_leader.close()
    new_leader.close()


def test_leader_stops_acting_when_not_confirmed_within_grace(
        contenders: tuple[Leadership, Leadership], clock: FakeClock) -> None:
    a, b = contenders
    a.poll()
    clock.now += 2.9
    assert a.fence_term() == 1
    clock.now += 0.2  # 3.1 s since its last confirmed poll: its loop stalled
    with pytest.raises(StaleTerm, match="not confirmed for more than 3 s"):
        a.fence_term()
    assert a.state is LeaderState.LOST and a.backend_pid is None  # its lock let go
    assert b.poll() is LeaderState.LEADER and b.term == 2


def test_leadership_moves_through_its_states_when_resigned_and_rejoined(
        contenders: tuple[Leadership, Leadership]) -> None:
    a, b = contenders
    with pytest.raises(RuntimeError, match="no transition follower -> follower"):
        a.rejoin()
    a.poll()
    a.resign()
    assert (a.state, a.reason, a.term) == (LeaderState.LOST, "resigned", None)
    assert a.poll() is LeaderState.LOST  # lost stays lost until the caller rejoins
    assert b.poll() is LeaderState.LEADER and b.term == 2
    a.rejoin()
    assert a.poll() is LeaderState.FOLLOWER
    b.close()
    assert a.poll() is LeaderState.LEADER and a.term == 3


def test_leadership_stays_follower_when_database_cannot_be_reached(clock: FakeClock) -> None:
    lonely = Leadership(f"postgresql://test@127.0.0.1:{free_port()}/records", clock=clock)
    assert lonely.poll() is LeaderState.FOLLOWER
    assert lonely.leader is None and not lonely.answered_within(60)  # not ready to serve
    with pytest.raises(StaleTerm):
        lonely.fence_term()
    lonely.close()


def test_follower_sees_where_the_leader_is_reached_when_it_polls(
        pg_url: str, clock: FakeClock) -> None:
    a = Leadership(pg_url, holder="a", clock=clock, advertised=Advertised("10.0.0.1:8000",
                                                                          "10.0.0.1:8001"))
    b = Leadership(pg_url, holder="b", clock=clock, advertised=Advertised("10.0.0.2:8000",
                                                                          "10.0.0.2:8001"))
    try:
        a.poll()
        assert b.poll() is LeaderState.FOLLOWER and b.answered_within(0)
        assert b.leader == LeaderSeen(1, "a", "10.0.0.1:8000", "10.0.0.1:8001")
        kill_session(pg_url, a.backend_pid)
        assert b.poll() is LeaderState.LEADER  # the address is written with the term
        c = Leadership(pg_url, holder="c", clock=clock)
        assert c.poll() is LeaderState.FOLLOWER
        assert c.leader == LeaderSeen(2, "b", "10.0.0.2:8000", "10.0.0.2:8001")
        c.close()
    finally:
        a.close()
        b.close()
