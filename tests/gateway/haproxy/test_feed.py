"""The snapshot feed's replicas: remembered across a restart of the control plane (so
the first settle of a restarted process waits for each of them), live while they hold a
long poll, and the answer's ``now`` (the control plane's clock, for leases)."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from gateway.auth import TokenTable
from gateway.config import GatewayConfig
from gateway.config.lifecycle import LifecycleSpec
from gateway.config.pools import MemberSpec, PoolSpec
from gateway.core import Core
from gateway.haproxy import feed as feed_module
from gateway.haproxy.feed import (
    AGENTS_FILE,
    LIVE_AGENT_S,
    MAX_WAIT_S,
    SAVE_EVERY_S,
    SnapshotFeed,
    feed_router,
)
from gateway.haproxy.snapshot import (
    Snapshot,
    snapshot_from_dict,
    snapshot_to_dict,
    snapshot_version,
)
from gateway.policy.rollout import Split

POOLS = (PoolSpec(name="p", members=(MemberSpec(),), models=("m",)),)


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _feed(path: Path | None, mono: Clock | None = None, wall: Clock | None = None,
          core: Core | None = None) -> SnapshotFeed:
    return SnapshotFeed(core or Core.for_config(GatewayConfig(pools=POOLS)), TokenTable(),
                        clock=mono or Clock(100.0), wall_clock=wall or Clock(1e9),
                        agents_path=path)


def _saved(path: Path) -> dict[str, float]:
    return dict(json.loads(path.read_text())["agents"])


def test_restarted_feed_settles_once_each_known_replica_applied_it(tmp_path: Path) -> None:
    path = tmp_path / AGENTS_FILE
    before = _feed(path)
    before.saw("a", "v0")
    before.saw("b", "v0")  # then the process dies

    async def scenario() -> None:
        core = Core.for_config(GatewayConfig(pools=POOLS))
        core.state.set_split("m", Split(1, 2, 0))  # recover(): pinned to stable
        after = _feed(path, core=core)
        version, _ = after.current()
        assert sorted(after.behind()) == ["a", "b"]  # expected back, version unknown
        settling = asyncio.create_task(after.settle())
        await asyncio.sleep(0.3)
        assert not settling.done()
        after.saw("a", "v0")  # polls with the old split: still behind
        after.saw("b", version)
        await asyncio.sleep(0.3)
        assert not settling.done() and after.behind() == ["a"]
        after.saw("a", version)  # applied the stable-only split
        await asyncio.wait_for(settling, 1.0)

    asyncio.run(scenario())


def test_feed_with_no_replica_known_settles_at_once_when_started(tmp_path: Path) -> None:
    feed = _feed(tmp_path / AGENTS_FILE)  # no file: a single node, never had replicas
    assert feed.agents == {}
    asyncio.run(asyncio.wait_for(feed.settle(), 0.05))


def test_restored_replica_no_longer_awaited_when_silent_past_live_bound(
    tmp_path: Path
) -> None:
    path = tmp_path / AGENTS_FILE
    _feed(path).saw("gone", "v0")
    mono = Clock(500.0)
    after = _feed(path, mono)
    assert after.behind() == ["gone"]
    mono.t += LIVE_AGENT_S + 0.1  # scaled away while the control plane was down
    assert after.behind() == []


def test_replicas_last_heard_long_before_the_others_are_not_expected(tmp_path: Path) -> None:
    path = tmp_path / AGENTS_FILE
    path.write_text(json.dumps({"agents": {
        "live": 5000.0, "polling": 5000.0 - LIVE_AGENT_S - MAX_WAIT_S,
        "old": 5000.0 - LIVE_AGENT_S - MAX_WAIT_S - 1}}))
    assert sorted(_feed(path).agents) == ["live", "polling"]


def test_unreadable_agents_file_expects_no_replica_when_restarted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / AGENTS_FILE
    path.write_text("{not json")
    with caplog.at_level(logging.WARNING):
        assert _feed(path).agents == {}
    assert "unreadable" in caplog.text


def test_replica_in_a_long_poll_stays_live_when_past_live_bound(tmp_path: Path) -> None:
    mono = Clock(100.0)
    feed = _feed(None, mono)
    with feed.polling("a", "old"):
        mono.t += LIVE_AGENT_S + 5  # a 20 s long poll, nothing changed meanwhile
        assert feed.behind() == ["a"]
    assert feed.agents["a"] == ("old", mono.t)  # heard of again as the poll ends
    mono.t += LIVE_AGENT_S + 1
    assert feed.behind() == []


def test_agents_file_written_when_replica_new_and_at_most_every_save_interval(
    tmp_path: Path
) -> None:
    path = tmp_path / "state" / AGENTS_FILE
    wall = Clock(1000.0)
    feed = _feed(path, wall=wall)
    feed.saw("a", "v")
    assert _saved(path) == {"a": 1000.0}
    wall.t += 1
    feed.saw("a", "v")
    assert _saved(path) == {"a": 1000.0}  # not rewritten at every poll
    feed.saw("b", "v")  # a new replica: written at once
    assert _saved(path) == {"a": 1001.0, "b": 1001.0}
    wall.t += SAVE_EVERY_S
    feed.saw("a", "v")
    assert _saved(path) == {"a": 1006.0, "b": 1001.0}
    assert [p.name for p in path.parent.iterdir()] == [AGENTS_FILE]  # no temporary left


def test_feed_keeps_its_replicas_in_the_lifecycle_state_folder_when_one_exists(
    tmp_path: Path
) -> None:
    config = GatewayConfig(pools=POOLS, lifecycle=LifecycleSpec(
        repository=tmp_path / "repo", state_dir=tmp_path / "state"))
    feed = SnapshotFeed(Core.for_config(config), TokenTable())
    assert feed.agents_path == tmp_path / "state" / AGENTS_FILE
    assert SnapshotFeed(Core.for_config(GatewayConfig(pools=POOLS)),
                        TokenTable()).agents_path is None


def test_settle_names_replicas_still_behind_when_it_gives_up(
    caplog: pytest.LogCaptureFixture
) -> None:
    feed = _feed(None)
    feed.settle_timeout_s = 0.0
    feed.saw("slow", "v0")
    with caplog.at_level(logging.WARNING):
        asyncio.run(feed.settle())
    assert "slow" in caplog.text and "going on" in caplog.text


def test_answer_carries_control_plane_now_outside_the_snapshot_when_sent() -> None:
    feed = _feed(None, wall=Clock(1_700_000_123.5))
    app = FastAPI()
    app.include_router(feed_router(feed, TokenTable()))

    async def scenario() -> dict[str, object]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://cp") as client:
            answer = await client.get("/v1/dataplane/snapshot",
                                      params={"agent": "a", "have": "x"})
            assert answer.status_code == 200
            return dict(answer.json())

    body = asyncio.run(scenario())
    assert body["now"] == 1_700_000_123.5
    assert body["version"] == snapshot_version(snapshot_from_dict(body["snapshot"]))
    assert feed.agents["a"][0] == "x"


def test_restored_replica_stays_on_file_until_silent_when_outage_was_long(
    tmp_path: Path
) -> None:
    path = tmp_path / AGENTS_FILE
    path.write_text(json.dumps({"agents": {"a": 1000.0}}))
    wall = Clock(5000.0)  # an hour's outage
    feed = _feed(path, wall=wall)
    feed.saw("b", "v")  # a crash now must still expect a
    assert _saved(path) == {"a": 5000.0, "b": 5000.0}
    wall.t += LIVE_AGENT_S + MAX_WAIT_S + 1
    feed.saw("b", "v")  # a never came back: forgotten
    assert _saved(path) == {"b": wall.t}


def test_settle_ends_when_replica_applied_that_snapshot_or_a_later_one_while_it_moves(
) -> None:
    """While the residency moves models the snapshot changes every few tens of ms: a
    replica that applies each new one at once is always one behind the newest, and a
    settle waiting for "the current one" waited its whole bound every time."""
    mono = Clock(100.0)
    core = Core.for_config(GatewayConfig(pools=POOLS))
    feed = _feed(None, mono, core=core)

    async def scenario() -> tuple[bool, bool]:
        first, _ = feed.current()
        feed.saw("r", first)
        core.state.mark_not_ready("m", "loading")  # a change to settle
        settling = asyncio.ensure_future(feed.settle())
        await asyncio.sleep(0)
        target, _ = feed.current()
        core.state.mark_ready("m")  # and another at once: the newest moves on
        core.state.mark_not_ready("m", "warming")
        await asyncio.sleep(0)
        waiting = not settling.done()
        feed.saw("r", target)  # the replica applied the one settle started with
        await asyncio.wait_for(settling, 1.0)
        newest, _ = feed.current()
        return waiting, feed.behind() == ["r"] and newest != target

    waited, still_behind_the_newest = asyncio.run(scenario())
    assert waited and still_behind_the_newest


def test_a_version_is_hashed_once_per_snapshot_content_however_often_read(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every replica's poll reads the current snapshot; its version (a canonical JSON
    text's hash) is computed again only when the content changed, and an equal content
    later has its own version again."""
    hashed: list[str] = []

    def counted(snapshot: Snapshot, wire: dict[str, object] | None = None) -> str:
        version = snapshot_version(snapshot, wire)
        assert version == snapshot_version(snapshot)  # the wire form given changes nothing
        hashed.append(version)
        return version

    monkeypatch.setattr(feed_module, "snapshot_version", counted)
    core = Core.for_config(GatewayConfig(pools=POOLS))
    feed = _feed(None, core=core)
    first = [feed.current()[0] for _ in range(5)]
    core.state.mark_not_ready("m", "loading")
    changed = [feed.current()[0] for _ in range(3)]
    core.state.mark_ready("m")
    back = feed.current()[0]
    assert len(set(first)) == 1 and len(set(changed)) == 1 and first[0] != changed[0]
    assert back == first[0] == snapshot_version(feed.current()[1])
    assert hashed == [first[0], changed[0], back]
    # each poll's answer carries the wire form made once for that content
    reads = [feed.current()[1] for _ in range(3)]
    assert feed.wire(reads[0]) is feed.wire(reads[2]) == snapshot_to_dict(reads[1])
    assert feed.wire(snapshot_from_dict(snapshot_to_dict(reads[0]))) == feed.wire(reads[0])


def test_long_poll_ends_when_its_poller_left_or_the_feed_closes_not_at_its_wait() -> None:
    """A replica that stops lets its poll go, and the control plane's poll ends with it;
    one still open when the server closes is answered at once (uvicorn would cancel it,
    and log that as the application's exception)."""
    feed = _feed(None, mono=Clock(100.0))  # (the clock stands still: no wait ever ends)
    have, _ = feed.current()

    async def scenario() -> tuple[object, object, object]:
        asked = 0

        async def gone() -> bool:
            nonlocal asked
            asked += 1
            return asked >= 3  # the poller's connection closed after two looks

        left = await asyncio.wait_for(feed.next_after(have, MAX_WAIT_S, gone), 5)
        parked = asyncio.ensure_future(feed.next_after(have, MAX_WAIT_S))
        await asyncio.sleep(3 * feed_module.POLL_S)
        assert not parked.done()  # nothing ends it but the close
        feed.close()
        closed = await asyncio.wait_for(parked, 5)
        later = await asyncio.wait_for(feed.next_after(have, MAX_WAIT_S), 5)
        return left, closed, later

    assert asyncio.run(scenario()) == (None, None, None)
    # a changed snapshot is still given to a poll that finds one, closed or not
    assert asyncio.run(feed.next_after("another", MAX_WAIT_S)) is not None
