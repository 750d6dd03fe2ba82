"""The data-plane agent's report to the control plane (gateway/agent.py): what its
replica served since the last one, from its own counters and tallies; no processes."""

from __future__ import annotations

from pathlib import Path

from gateway.agent import Agent, AgentSettings


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
