"""The data-plane agent's report to the control plane (gateway/agent.py): what its
replica served since the last one, from its own counters and tallies, and its requests
at holdings it no longer routes; no processes."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from gateway.agent import Agent, AgentSettings
from gateway.config import GatewayConfig
from gateway.config.pools import MemberSpec, PoolSpec
from gateway.config.residency import ResidencySpec
from gateway.haproxy.snapshot import RouteState, Snapshot, server_name
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
