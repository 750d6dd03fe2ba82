"""The data-plane agent's report to the control plane (gateway/agent.py): what its
replica served since the last one, from its own counters and tallies, and its requests
at holdings it no longer routes; no processes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import stat
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from gateway.agent import Agent, AgentSettings, run_until_stopped
from gateway.config import GatewayConfig
from gateway.config.pools import MemberSpec, PoolSpec
from gateway.config.residency import ResidencySpec
from gateway.haproxy import snapshot as snapshot_module
from gateway.haproxy.snapshot import (
    MAX_SOCKET_PATH,
    RouteState,
    Snapshot,
    server_name,
    snapshot_version,
    sockets_fit,
)
from gateway.replica import ReplicaForwarder, ReplicaSettings


def test_report_carries_what_was_served_since_the_last_one(tmp_path: Path) -> None:
    agent = Agent(AgentSettings("127.0.0.1:1", "127.0.0.1:2", tmp_path))
    assert agent.report() is None  # nothing served yet
    requests = agent.metrics.requests
    requests.labels("m", "p", "http", "success", "user").inc(3)
    requests.labels("m", "p", "grpc", "rejected", "user").inc(2)
    requests.labels("m", "p", "http", "success", "warmup").inc(50)  # not a user's
    agent.tally.watch("m")  # under rollout: its answers per version go too
    agent.tally.record("m", 2, True, 0.004, at=1.0)
    assert agent.report() == {"served": {"m": 5}, "answers": {"m": {2: [(True, 0.004)]}},
                              "shadows": {}}
    assert agent.report() is None  # each request reported once
    requests.labels("n", "p", "http", "success", "user").inc(1)
    assert agent.report() == {"served": {"n": 1}, "answers": {}, "shadows": {}}


def test_replica_says_its_requests_at_a_holding_it_left_until_they_end(
    tmp_path: Path
) -> None:
    """The forwarder's request at a member (a miss it served) outlives the snapshot that
    took the holding out of routing: the agent's polls say it until it ends."""
    config = GatewayConfig(pools=(PoolSpec(
        name="p", members=(MemberSpec(host="127.0.0.1", http_port=8000, grpc_port=8001),),
        models=("*",), residency=ResidencySpec(memory_budget_bytes=1 << 30)),))

    async def scenario() -> list[dict[tuple[str, str, str], int]]:
        agent = Agent(AgentSettings("127.0.0.1:1", "127.0.0.1:2", tmp_path, haproxy=False))
        agent.replica = ReplicaForwarder(config, ReplicaSettings("127.0.0.1:1"))
        member = agent.replica.core.state.members()[0]
        name = server_name(member.key)
        held = Snapshot(pools=(), routes=(RouteState(
            model="m", pools=(("p", 1.0),), max_in_system=10, holders=(("p", (name,)),)),))
        seen = []
        try:
            await agent._apply(held)
            member.request_started("m")  # the forwarder sent one there
            seen.append(await agent.busy())  # still routed: the control plane counts it
            await agent._apply(replace(held, routes=(replace(
                held.routes[0], holders=(("p", ()),)),)))
            seen.append(await agent.busy())
            member.request_ended("m")
            seen.append(await agent.busy())
        finally:
            await agent.replica.client.aclose()
        return seen

    pair = ("m", "p", server_name("127.0.0.1:8001"))
    assert asyncio.run(scenario()) == [{}, {pair: 1}, {}]


def _agent_with_replica(tmp_path: Path) -> tuple[Agent, Snapshot]:
    config = GatewayConfig(pools=(PoolSpec(
        name="p", members=(MemberSpec(host="127.0.0.1", http_port=8000, grpc_port=8001),),
        models=("*",), residency=ResidencySpec(memory_budget_bytes=1 << 30)),))
    agent = Agent(AgentSettings("127.0.0.1:1", "127.0.0.1:2", tmp_path, haproxy=False,
                                retry_s=0.01))
    agent.replica = ReplicaForwarder(config, ReplicaSettings("127.0.0.1:1"))
    name = server_name(agent.replica.core.state.members()[0].key)
    held = Snapshot(pools=(), routes=(RouteState(
        model="m", pools=(("p", 1.0),), max_in_system=10, holders=(("p", (name,)),)),))
    return agent, held


def test_a_snapshot_applied_while_an_older_ones_apply_waits_is_the_one_routed(
        tmp_path: Path) -> None:
    """The follower, the leases' watch and the tenants' observer all apply snapshots:
    an older one's apply held at its save (as a slow disk would) must not end after a
    newer one's and leave the replica routing by the older one."""
    agent, held = _agent_with_replica(tmp_path)
    assert agent.replica is not None
    gone = replace(held, routes=(replace(held.routes[0], holders=(("p", ()),)),))
    saving, release = threading.Event(), threading.Event()
    saves: list[Snapshot] = []
    calls = iter(range(100))
    original = agent._save

    def slow_save(snapshot: Snapshot) -> None:
        if next(calls) == 0:  # the first save waits until the newer one could go
            saving.set()
            release.wait(5)
        saves.append(snapshot)
        original(snapshot)

    agent._save = slow_save  # type: ignore[method-assign]

    async def scenario() -> None:
        older = asyncio.ensure_future(agent._apply(held))
        await asyncio.to_thread(saving.wait, 5)
        newer = asyncio.ensure_future(agent._apply(gone))
        await asyncio.sleep(0.05)  # (the newer one runs as far as it may)
        release.set()
        await asyncio.gather(older, newer)
        assert agent.replica is not None
        await agent.replica.client.aclose()

    asyncio.run(scenario())
    assert saves == [held, gone]
    assert agent.version == snapshot_version(gone)
    assert agent.replica.core.state.holders("m") == frozenset()  # routed by the newer one
    assert agent._saved() == gone


def test_a_snapshots_version_is_hashed_once_however_often_it_is_asked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Receiving, applying and the leases' watch each ask a snapshot's version (a
    canonical JSON text's hash); it is computed once per snapshot received, and an equal
    snapshot received again (another object) is hashed again, to the same version."""
    agent, held = _agent_with_replica(tmp_path)
    hashed: list[Snapshot] = []

    def counted(snapshot: Snapshot, wire: dict[str, object] | None = None) -> str:
        hashed.append(snapshot)
        return snapshot_version(snapshot, wire)

    monkeypatch.setattr(snapshot_module, "snapshot_version", counted)
    gone = replace(held, routes=(replace(held.routes[0], holders=(("p", ()),)),))

    async def scenario() -> None:
        for snapshot in (held, gone):
            await agent._apply(snapshot)
            await agent._apply(snapshot)  # (as the leases' watch does, nothing changed)
        assert agent.replica is not None
        await agent.replica.client.aclose()

    asyncio.run(scenario())
    assert hashed == [held, gone] and agent.version == snapshot_version(gone)
    again = replace(held)
    assert again is not held and agent._version(again) == snapshot_version(held)
    assert hashed == [held, gone, again]


def test_a_loop_of_the_agent_that_fails_is_logged_and_started_again(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    agent = Agent(AgentSettings("127.0.0.1:1", "127.0.0.1:2", tmp_path, retry_s=0.01))
    runs: list[int] = []

    async def loop() -> None:
        runs.append(len(runs))
        if len(runs) == 1:
            raise FileNotFoundError("snapshot.tmp")  # as a failed save once ended it
        await asyncio.Event().wait()  # then runs for good

    async def scenario() -> None:
        task = asyncio.ensure_future(agent._supervised("follow", loop))
        while len(runs) < 2:
            await asyncio.sleep(0.01)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    with caplog.at_level(logging.ERROR, logger="gateway.agent"):
        asyncio.run(asyncio.wait_for(scenario(), 5))
    assert runs == [0, 1]
    failed = [r for r in caplog.records if "follow loop failed" in r.getMessage()]
    assert len(failed) == 1 and failed[0].exc_info is not None


def test_an_agent_still_waiting_for_its_control_plane_stops_at_once(tmp_path: Path) -> None:
    """No configuration kept and no control plane answering: it waits for one, and a
    stop (SIGTERM) ends it at once (it used to wait for good: a replica whose control
    plane failed to start outlived it)."""
    agent = Agent(AgentSettings("127.0.0.1:1", "127.0.0.1:2", tmp_path, haproxy=False,
                                retry_s=0.05))

    async def scenario() -> None:
        stop = asyncio.Event()
        running = asyncio.ensure_future(run_until_stopped(agent, stop))
        await asyncio.sleep(0.3)  # (some rounds of asking the control plane)
        assert not running.done() and not agent.serving
        stop.set()
        await asyncio.wait_for(running, 5)

    asyncio.run(scenario())


@pytest.mark.parametrize("extra", [0, 1])
def test_haproxy_files_move_to_a_short_folder_when_a_socket_path_would_be_too_long(
        tmp_path: Path, extra: int) -> None:
    """HAProxy takes unix socket paths of at most 97 bytes: a state folder whose master
    socket (the longer name) would be exactly that long keeps HAProxy's files; one byte
    more and they move to a private temporary folder named after the state folder, the
    same at the next start (the agent once checked 100 bytes, and its HAProxy refused
    "admin.sock too long (max 97)" under a state folder one level deeper; it made a new
    folder at each start, and left them all behind)."""
    run = "/haproxy/master.sock"
    state = tmp_path / ("s" * (MAX_SOCKET_PATH - len(str(tmp_path)) - 1 - len(run) + extra))
    agent = Agent(AgentSettings("127.0.0.1:1", "127.0.0.1:2", state))
    moved = agent.layout.run_dir
    try:
        assert len(str(state / "haproxy" / "master.sock")) == MAX_SOCKET_PATH + extra
        assert (moved == state / "haproxy") == (extra == 0)
        assert sockets_fit(moved) and len(str(agent.layout.master_socket)) <= MAX_SOCKET_PATH
        assert Agent(AgentSettings("127.0.0.1:1", "127.0.0.1:2", state)).layout.run_dir == moved
        if extra:
            assert stat.S_IMODE(moved.stat().st_mode) == 0o700
    finally:
        if moved != state / "haproxy":
            shutil.rmtree(moved)
    # a replica without HAProxy of its own (gateway serve's, on one node) makes no folder
    alone = Agent(AgentSettings("127.0.0.1:1", "127.0.0.1:2", state, haproxy=False))
    assert alone.layout.run_dir == state / "haproxy" and not moved.exists()
