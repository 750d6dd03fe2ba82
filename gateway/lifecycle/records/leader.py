"""One leader among the control-plane replicas: :class:`Leadership`, a PostgreSQL
advisory lock held on a connection of its own, and a term that fences every write.

Why an advisory lock, not a Kubernetes ``Lease``: the records the leader writes are in
PostgreSQL already, so the lock and the data share one failure domain and one
transaction. The term is bumped in the same database the writes go to, and a write's
check of it (:class:`~.postgres.PostgresStore`) is in the write's own transaction:
there is no window in which a deposed leader's write lands after its successor's first
one. A ``Lease`` lives in the API server: its holder learns it lost it only at its next
renewal, the fencing token would still have to be checked against the database, and
the election would work only in Kubernetes, not in ``make run`` or the tests. (The
Python Kubernetes client has had a ``LeaseLock`` only since August 2026; its older
election uses a ConfigMap.) The cost: the lock belongs to the session that took it, so
it needs a direct connection (no PgBouncer in transaction mode, no pool), and the
database's availability is the election's.

The states (one record: :meth:`Leadership.poll` moves it, and
:meth:`Leadership.fence_term` when the grace has run out)::

    follower --(pg_try_advisory_lock won; term + 1)--> leader
    leader   --(connection lost, term moved, or not confirmed for ``grace_s``)--> lost
    leader   --(resign)--> lost
    lost     --(rejoin: the caller has stopped everything leader-only)--> follower

A leader whose connection dies has lost the lock with it (the server releases a
session's advisory locks when the session ends), so another replica may already lead:
from then on it must not act. It learns so at its next poll; until then the term check
in every fenced write refuses what it tries. The server ends a session whose client
vanished without a word (a node lost) by TCP keepalives, set on the session here: the
lock is free again within ``keepalive_s`` + a few probes.

The leader writes where it is reached (:class:`Advertised`: its HTTP and gRPC
addresses) into the row, with its term, in the statement that bumps it; a follower reads
the row at each poll it loses (:attr:`Leadership.leader`, a :class:`LeaderSeen`), so a
standby knows where to pass what it cannot serve itself, at most one poll late.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

import psycopg

from gateway.errors import Unavailable
from gateway.lifecycle.records.postgres import Connection, connect
from gateway.lifecycle.records.store import StaleTerm

log = logging.getLogger(__name__)


class LeaderState(enum.StrEnum):
    FOLLOWER = "follower"
    LEADER = "leader"
    LOST = "lost"


TRANSITIONS = {
    LeaderState.FOLLOWER: {LeaderState.LEADER},
    LeaderState.LEADER: {LeaderState.LOST},
    LeaderState.LOST: {LeaderState.FOLLOWER},
}


@dataclass(frozen=True)
class Advertised:
    """Where the other replicas reach this one when it leads (``host:port`` each)."""

    http: str
    grpc: str


@dataclass(frozen=True)
class LeaderSeen:
    """The leadership's row as this replica last read it: who leads, in which term, and
    where (None: a leader that advertises no address, an older gateway)."""

    term: int
    holder: str
    http: str | None
    grpc: str | None


def lock_key(name: str) -> int:
    """The advisory lock's 64-bit key for a leadership's name (stable across processes)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big",
                          signed=True)


def default_holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Leadership:
    """This replica's part in the election of ``name``'s leader over ``url`` (the
    records' database, migrated). Call :meth:`poll` every ``poll_interval_s``; a
    :class:`~.postgres.PostgresStore` built with it as its fence refuses writes unless
    it leads (:meth:`fence_term`)."""

    def __init__(self, url: str, name: str = "control-plane", holder: str | None = None,
                 clock: Callable[[], float] = time.monotonic, poll_interval_s: float = 1.0,
                 grace_s: float = 5.0, keepalive_s: int = 5,
                 advertised: Advertised | None = None) -> None:
        self.url = url
        self._name = name
        self.holder = holder or default_holder()
        self.clock = clock
        self.poll_interval_s = poll_interval_s
        self.grace_s = grace_s  # a leader not confirmed for this long stops acting
        self.keepalive_s = keepalive_s
        self.key = lock_key(name)
        self.state = LeaderState.FOLLOWER
        self.term: int | None = None  # while leader
        self.confirmed_at: float | None = None  # the leader's last confirmed poll
        self.reason = ""  # why the last transition happened
        self.advertised = advertised  # written with the term when this replica wins
        self.leader: LeaderSeen | None = None  # who leads, as of the last poll
        self.answered_at: float | None = None  # the database's last answer to a poll
        self._conn: Connection | None = None

    @property
    def name(self) -> str:
        return self._name

    @property
    def backend_pid(self) -> int | None:
        """The database session holding (or trying for) the lock."""
        return self._conn.info.backend_pid if self._conn is not None else None

    def poll(self) -> LeaderState:
        """One step: a follower tries for the lock, a leader confirms it still holds
        it. Never raises for a database that cannot be reached: a follower stays one,
        a leader is lost."""
        if self.state is LeaderState.FOLLOWER:
            self._try_to_lead()
        elif self.state is LeaderState.LEADER:
            self._confirm()
        return self.state

    def answered_within(self, seconds: float) -> bool:
        """The database answered one of this replica's polls in the last ``seconds``."""
        return self.answered_at is not None and self.clock() - self.answered_at <= seconds

    def fence_term(self) -> int:
        """The term a write carries; StaleTerm unless this replica leads and confirmed
        it within ``grace_s`` (a poll loop that stalled must not act on old news)."""
        if self.state is LeaderState.LEADER and self.term is not None:
            assert self.confirmed_at is not None
            if self.clock() - self.confirmed_at <= self.grace_s:
                return self.term
            self._lose(f"leadership not confirmed for more than {self.grace_s:g} s")
        raise StaleTerm(f"this replica ({self.holder}) does not lead {self.name!r}: "
                        f"{self.state.value}{', ' + self.reason if self.reason else ''}")

    def resign(self) -> None:
        """Give leadership up at once (the lock is released with the session)."""
        if self.state is LeaderState.LEADER:
            self._lose("resigned")

    def rejoin(self) -> None:
        """After a loss, stand again (call once everything leader-only has stopped)."""
        self._move(LeaderState.FOLLOWER, "rejoined")

    def close(self) -> None:
        if self.state is LeaderState.LEADER:
            self._lose("closed")
        self._disconnect()

    # -- the steps -------------------------------------------------------------------------
    def _try_to_lead(self) -> None:
        try:
            conn = self._connection()
            row = conn.execute("SELECT pg_try_advisory_lock(%s) AS won", (self.key,)).fetchone()
            self.answered_at = self.clock()
            if row is None or not row["won"]:
                self.leader = self._read_leader(conn)  # another holds the lock: its row
                return
            http, grpc = (self.advertised.http, self.advertised.grpc) \
                if self.advertised is not None else (None, None)
            with conn.transaction():
                term_row = conn.execute(
                    "INSERT INTO leadership AS l (name, term, holder, acquired_at, "
                    "http_address, grpc_address) VALUES (%s, 1, %s, extract(epoch from "
                    "now()), %s, %s) ON CONFLICT (name) DO UPDATE SET term = l.term + 1, "
                    "holder = excluded.holder, acquired_at = excluded.acquired_at, "
                    "http_address = excluded.http_address, grpc_address = "
                    "excluded.grpc_address RETURNING term",
                    (self.name, self.holder, http, grpc)).fetchone()
        except (psycopg.Error, Unavailable) as exc:
            log.warning("leadership %r: cannot stand: %s", self.name, exc)
            self._disconnect()  # a lock won without its term bump goes with the session
            return
        assert term_row is not None
        self.term = int(term_row["term"])
        self.leader = LeaderSeen(self.term, self.holder, http, grpc)
        self.confirmed_at = self.clock()
        self._move(LeaderState.LEADER, f"won the lock, term {self.term}")
        log.warning("leadership %r: %s leads, term %d", self.name, self.holder, self.term)

    def _confirm(self) -> None:
        """The session is alive (so its lock is held) and the term is still ours."""
        try:
            assert self._conn is not None
            row = self._conn.execute("SELECT term FROM leadership WHERE name = %s",
                                     (self.name,)).fetchone()
        except psycopg.Error as exc:
            self._lose(f"connection to the database lost: {exc}")
            return
        if row is None or row["term"] != self.term:
            self._lose(f"the term moved to {row['term'] if row else None}")
            return
        self.confirmed_at = self.answered_at = self.clock()

    def _read_leader(self, conn: Connection) -> LeaderSeen | None:
        row = conn.execute("SELECT term, holder, http_address, grpc_address FROM leadership "
                           "WHERE name = %s", (self.name,)).fetchone()
        return None if row is None else LeaderSeen(int(row["term"]), row["holder"],
                                                   row["http_address"], row["grpc_address"])

    def _lose(self, reason: str) -> None:
        log.warning("leadership %r: %s lost term %s: %s", self.name, self.holder,
                    self.term, reason)
        self._disconnect()  # whatever the session still holds goes with it
        self.term = None
        self.confirmed_at = None
        self.leader = None
        self._move(LeaderState.LOST, reason)

    def _move(self, to: LeaderState, reason: str) -> None:
        if to not in TRANSITIONS[self.state]:
            raise RuntimeError(f"leadership: no transition {self.state.value} -> {to.value}")
        self.state = to
        self.reason = reason

    def _connection(self) -> Connection:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._disconnect()
            # the server ends this session (and frees the lock) when the client vanishes
            options = (f"-c tcp_keepalives_idle={self.keepalive_s} "
                       "-c tcp_keepalives_interval=1 -c tcp_keepalives_count=3")
            # and this side gives a poll up when the server stops answering mid-request
            self._conn = connect(self.url, application_name=f"infergate-leader {self.holder}"
                                 [:63], options=options, keepalives=1,
                                 keepalives_idle=self.keepalive_s,
                                 keepalives_interval=1, keepalives_count=3,
                                 tcp_user_timeout=(self.keepalive_s + 3) * 1000)
        return self._conn

    def _disconnect(self) -> None:
        if self._conn is not None:
            if not (self._conn.closed or self._conn.broken):
                # let go now: a closed session's locks go only once the server has seen
                # it end, and a successor should not have to wait for that
                with contextlib.suppress(psycopg.Error):
                    self._conn.execute("SELECT pg_advisory_unlock_all()")
            self._conn.close()
            self._conn = None
