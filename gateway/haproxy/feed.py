"""The control plane's feed of data-plane snapshots, for data-plane replicas that run
elsewhere (Kubernetes: the data-plane Deployment, each pod HAProxy + an agent).

Replicas long-poll ``GET /v1/dataplane/snapshot?have=<version>&agent=<id>``: the answer
comes as soon as the snapshot differs from ``have`` (or after ``wait`` seconds with
304). Each poll also says which version that replica has applied, so a lifecycle step
can wait (bounded) until every live replica routes by what it just changed, and
(``busy``) its requests still in flight at holdings that version no longer routes, which
an eviction waits for before it unloads (``gateway/haproxy/drain.py``).

The answer (200) is ``{"version", "snapshot", "now"}``: ``now`` is the control plane's
clock when it answered, epoch seconds, the clock a rollout's lease is written in
(:attr:`RouteState.verdict_at`). A replica judges a lease's age in that clock
(:func:`gateway.haproxy.snapshot.fail_safe`): ``now`` plus what its own monotonic clock
counted since, never its own wall clock, so clock skew between the machines does not
count. ``now`` is not part of the snapshot or its version.

The replicas the feed knows outlive a restart of the control plane: their ids and when
each last polled are kept in the lifecycle's state folder (``dataplane-agents.json``).
A restarted control plane must not decide too early that no replica exists: the first
thing it settles is an interrupted rollout's split back to stable, before the candidate
is unloaded, and a replica not waited for would send its share to a version gone. Why a
file rather than waiting one poll interval for replicas to check in: the file says
*which* replicas to wait for, so :meth:`SnapshotFeed.settle` waits until each of them
has the new snapshot, not only the first to poll, and a control plane that never had
replicas (a single node) waits for nobody at start.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse

from gateway.auth import Scope, TokenTable
from gateway.control.lifecycle_http import requires
from gateway.core import Core
from gateway.errors import InvalidInput
from gateway.files import write_atomically
from gateway.haproxy.controller import snapshot_of
from gateway.haproxy.drain import Pair, decode_busy, held_pairs
from gateway.haproxy.snapshot import (
    Snapshot,
    server_name,
    snapshot_to_dict,
    snapshot_version,
)
from gateway.pools import PoolMember

log = logging.getLogger(__name__)
POLL_S = 0.1
MAX_WAIT_S = 30.0  # the longest long-poll the feed holds
LIVE_AGENT_S = 10.0  # a replica that polled within this long (or polls now) counts as live
AGENTS_FILE = "dataplane-agents.json"  # in the lifecycle's state folder
SAVE_EVERY_S = 5.0  # the replicas' last polls are written at most this often (and new ones)
MAX_AGENTS = 1000
VERSIONS_KEPT = 256  # the versions seen last: their order, their holdings (``busy``)


@dataclass
class SnapshotFeed:
    core: Core
    auth: TokenTable
    settle_timeout_s: float = 5.0
    clock: Callable[[], float] = time.monotonic
    agents: dict[str, tuple[str, float]] = field(default_factory=dict)  # id -> (have, seen)
    wall_clock: Callable[[], float] = time.time  # ``now`` in answers; the file's times
    # where the known replicas are kept (None: the lifecycle's state folder, when the
    # gateway has a lifecycle; else nowhere)
    agents_path: Path | None = None
    _polling: dict[str, int] = field(default_factory=dict, init=False)  # open long polls
    _polled: dict[str, float] = field(default_factory=dict, init=False)  # id -> wall time
    _written: float = field(default=float("-inf"), init=False)
    # id -> its requests at holdings its version no longer routes, as it last said
    _busy: dict[str, dict[Pair, int]] = field(default_factory=dict, init=False)
    # version -> the holdings it routes, for the versions served last
    _held: OrderedDict[str, frozenset[Pair]] = field(default_factory=OrderedDict, init=False)
    # version -> its number, in the order first seen, for the versions seen last
    _order: OrderedDict[str, int] = field(default_factory=OrderedDict, init=False)
    _seen_versions: int = field(default=0, init=False)
    # the last snapshot read and its version: a version is a canonical JSON text's hash
    # (7 % of the control plane's Python time under bench_residency, read at every poll
    # of every replica), and the snapshot changes far less often than it is read
    # (with its wire form, which every poll's answer carries)
    _last: tuple[Snapshot, str, dict[str, object]] | None = field(default=None, init=False)
    # the server is closing: a long poll answers at once (uvicorn cancels one still open
    # when it closes, and logs that as the application's exception)
    _closed: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        lifecycle = self.core.state.config.lifecycle
        if self.agents_path is None and lifecycle is not None:
            self.agents_path = lifecycle.state_dir / AGENTS_FILE
        self._restore()

    def current(self) -> tuple[str, Snapshot]:
        snapshot = snapshot_of(self.core.state, self.auth, self.core.clock())
        if self._last is None or self._last[0] != snapshot:
            wire = snapshot_to_dict(snapshot)
            self._last = (snapshot, snapshot_version(snapshot, wire), wire)
        snapshot, version = self._last[0], self._last[1]
        self._number(version)
        return version, snapshot

    def wire(self, snapshot: Snapshot) -> dict[str, object]:
        """``snapshot``'s wire form (:func:`snapshot_to_dict`): made once per content for
        the snapshot :meth:`current` gives, which every replica's poll is answered with."""
        if self._last is not None and self._last[0] is snapshot:
            return self._last[2]
        return snapshot_to_dict(snapshot)

    def _number(self, version: str) -> int:
        """The order in which this process first saw ``version`` (a content hash: a
        later snapshot may even have an earlier one's content, and gets a new number)."""
        if version not in self._order or next(reversed(self._order)) != version:
            self._order.pop(version, None)
            self._order[version] = self._seen_versions
            self._seen_versions += 1
            while len(self._order) > VERSIONS_KEPT:
                self._order.popitem(last=False)
        return self._order[version]

    def saw(self, agent: str, have: str, busy: dict[Pair, int] | None = None) -> None:
        """``agent`` polled, having applied version ``have`` (``busy``: its requests at
        holdings ``have`` does not route; None: as it said last)."""
        new = agent not in self.agents
        self.agents[agent] = (have, self.clock())
        if busy is not None:
            if busy:
                self._busy[agent] = busy
            else:
                self._busy.pop(agent, None)
        self._polled[agent] = now = self.wall_clock()
        if len(self.agents) > MAX_AGENTS:  # bounded: forget the longest silent
            oldest = min(self.agents, key=lambda a: self.agents[a][1])
            del self.agents[oldest]
            self._polled.pop(oldest, None)
            self._busy.pop(oldest, None)
        if new or now - self._written >= SAVE_EVERY_S:
            self._save(now)

    def forget(self, agent: str) -> None:
        """``agent`` stopped for good (a graceful stop): not waited for, nor expected back
        by the next start."""
        self.agents.pop(agent, None)
        self._polled.pop(agent, None)
        self._busy.pop(agent, None)
        self._save(self.wall_clock())

    @contextlib.contextmanager
    def polling(self, agent: str, have: str,
                busy: dict[Pair, int] | None = None) -> Iterator[None]:
        """One long poll of ``agent``: seen at its start and at its end, and live all
        along (a replica waits up to MAX_WAIT_S in a poll, longer than LIVE_AGENT_S)."""
        self.saw(agent, have, busy)
        self._polling[agent] = self._polling.get(agent, 0) + 1
        try:
            yield
        finally:
            if self._polling[agent] <= 1:
                del self._polling[agent]
            else:
                self._polling[agent] -= 1
            if agent in self.agents:
                self.saw(agent, self.agents[agent][0])

    async def next_after(self, have: str, wait_s: float,
                         gone: Callable[[], Awaitable[bool]] | None = None
                         ) -> tuple[str, Snapshot] | None:
        """The snapshot once it differs from ``have``; None after ``wait_s``, once the
        poller is ``gone`` (its connection closed: a replica stopping lets its poll go)
        or once the feed is closed."""
        deadline = self.clock() + wait_s
        while True:
            version, snapshot = self.current()
            if version != have:
                self._served(version, snapshot)
                return version, snapshot
            if self._closed or self.clock() >= deadline or (
                    gone is not None and await gone()):
                return None
            await asyncio.sleep(POLL_S)

    def close(self) -> None:
        """The server closes: the long polls still open are answered now (304), and
        any later one at once."""
        self._closed = True

    async def settle(self) -> None:
        """Until every live replica has applied the current snapshot or a later one
        (bounded; the replicas still behind then are named in the log). A later one
        counts: while the residency moves models the snapshot changes every few tens of
        milliseconds, and a replica that applies each new one at once is always one
        behind the newest."""
        deadline = self.clock() + self.settle_timeout_s
        target = self._number(self.current()[0])
        while True:
            behind = self.behind(target)
            if not behind:
                return
            if self.clock() >= deadline:
                log.warning("data-plane replicas %s have not applied the current snapshot "
                            "after %.0f s: going on", ", ".join(sorted(behind)),
                            self.settle_timeout_s)
                return
            await asyncio.sleep(POLL_S)

    def _served(self, version: str, snapshot: Snapshot) -> None:
        self._held[version] = held_pairs(snapshot)
        self._held.move_to_end(version)
        while len(self._held) > VERSIONS_KEPT:
            self._held.popitem(last=False)

    async def in_flight_at(self, model: str, member: PoolMember) -> int:
        """Requests of ``model`` the live replicas may have at ``member``: what each
        said (``busy``) once the version it applied no longer routes the holding; 1 for
        a replica that still routes it, or whose version is not known here (it has not
        applied the change yet: its count is not known)."""
        pair = (model, member.pool, server_name(member.key))
        now, total = self.clock(), 0
        for agent, (have, seen) in self.agents.items():
            if agent not in self._polling and now - seen > LIVE_AGENT_S:
                continue  # gone: its requests went with it
            held = self._held.get(have)
            if held is None or pair in held:
                total += 1
            else:
                total += self._busy.get(agent, {}).get(pair, 0)
        return total

    def behind(self, target: int | None = None) -> list[str]:
        """The live replicas that have applied neither the snapshot numbered ``target``
        (default: the current one) nor a later one."""
        if target is None:
            target = self._number(self.current()[0])
        now = self.clock()
        return [a for a, (have, seen) in self.agents.items()
                if self._order.get(have, -1) < target
                and (a in self._polling or now - seen <= LIVE_AGENT_S)]

    # -- the known replicas, across restarts ------------------------------------------------
    def _restore(self) -> None:
        """The replicas the previous process knew and heard of last (within
        LIVE_AGENT_S + MAX_WAIT_S of the last poll it wrote: one in a long poll was last
        written at its start): each is expected back, as if it had polled just now with
        no version, so :meth:`settle` waits for it until it polls with the current
        one, or LIVE_AGENT_S passes without a poll (a replica gone meanwhile costs the
        first settles one bounded wait)."""
        if self.agents_path is None:
            return
        try:
            saved = json.loads(self.agents_path.read_text())["agents"]
            polled = {str(a): float(t) for a, t in saved.items()}
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("%s: unreadable (%r): no data-plane replica is expected",
                        self.agents_path, exc)
            return
        last = max(polled.values(), default=0.0)
        expected = sorted(a for a, t in polled.items()
                          if last - t <= LIVE_AGENT_S + MAX_WAIT_S)[:MAX_AGENTS]
        now, wall = self.clock(), self.wall_clock()
        for agent in expected:  # on file until silent for as long as any other
            self.agents.setdefault(agent, ("", now))
            self._polled[agent] = wall
        if expected:
            log.warning("expecting %d data-plane replica(s) known before the restart: %s",
                        len(expected), ", ".join(expected))

    def _save(self, now: float) -> None:
        """The replicas heard of lately, written whole and atomically (a rename): a few
        hundred bytes, when a replica first polls, else at most once per SAVE_EVERY_S."""
        self._written = now
        if self.agents_path is None:
            return
        recent = {a: t for a, t in self._polled.items()
                  if now - t <= LIVE_AGENT_S + MAX_WAIT_S or a in self._polling}
        try:
            write_atomically(self.agents_path, json.dumps({"agents": recent}, sort_keys=True))
        except OSError as exc:  # the feed serves on; only a restart's wait is at stake
            log.warning("%s: not written: %r", self.agents_path, exc)


def feed_router(feed: SnapshotFeed, auth: TokenTable) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/dataplane/snapshot", dependencies=[Depends(requires(auth, Scope.ADMIN))])
    async def snapshot(request: Request, have: str = "", agent: str = "",
                       wait: float = Query(0.0, ge=0.0, le=MAX_WAIT_S),
                       busy: str = Query("", max_length=64 * 1024)) -> Response:
        """The data-plane snapshot (versioned by content); long-polls up to ``wait``
        seconds for one newer than ``have``. ``busy``: the replica's requests still in
        flight at holdings ``have`` no longer routes (``gateway/haproxy/drain.py``).
        ``now``: the control plane's clock when it answered (epoch seconds), for the
        replica to age rollout leases in."""
        try:
            said = decode_busy(busy)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        with feed.polling(agent[:128], have, said) if agent else contextlib.nullcontext():
            found = await feed.next_after(have, wait, request.is_disconnected)
        if found is None:
            return Response(status_code=304)
        version, current = found
        return JSONResponse({"version": version, "snapshot": feed.wire(current),
                             "now": feed.wall_clock()},
                            headers={"ETag": f'"{version}"'})

    return router
