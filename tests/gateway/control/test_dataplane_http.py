"""What the control plane tells data-plane replicas and hears from them
(gateway/control/dataplane_http.py): its configuration, and their reports of what they
served, which the residency's demand and the rollouts' verdicts count."""

from __future__ import annotations

import asyncio
import time

import httpx
from fastapi import FastAPI, Request, Response
from fastapi.testclient import TestClient

from gateway.auth import TokenEntry, TokenTable
from gateway.config import GatewayConfig
from gateway.config.pools import MemberSpec, PoolSpec
from gateway.control.dataplane_http import create_dataplane_router
from gateway.core import Core
from gateway.errors import GatewayError, error_answer
from gateway.policy.rollout import Shadow

CONFIG = GatewayConfig(pools=(PoolSpec(name="p", members=(MemberSpec(),), models=("m",)),))


def _client(core: Core, auth: TokenTable | None = None) -> TestClient:
    app = FastAPI()
    app.include_router(create_dataplane_router(core, auth or TokenTable()))

    @app.exception_handler(GatewayError)  # as the control plane's app answers them
    async def _answer(_: Request, error: GatewayError) -> Response:
        status, body, _headers = error_answer(error)
        return Response(body, status_code=status)

    return TestClient(app)


def test_the_configuration_a_replica_builds_its_forwarder_from() -> None:
    core = Core.for_config(CONFIG)
    answer = _client(core).get("/v1/dataplane/config")
    assert GatewayConfig.model_validate(answer.json()["config"]) == CONFIG


def test_a_report_counts_into_demand_use_and_the_watched_rollouts() -> None:
    core = Core.for_config(CONFIG)
    core.state.tally.watch("m")
    client = _client(core)
    answer = client.post("/v1/dataplane/report", json={
        "served": {"m": 7, "nobody-serves-this": 3},
        "answers": {"m": {"1": [[True, 0.01], [True, 0.02]], "2": [[False, 0.5]]},
                    "unwatched": {"1": [[True, 0.01]]}}})
    assert answer.status_code == 204
    samples = {s.labels["model"]: s.value for f in core.metrics.replica_requests.collect()
               for s in f.samples if s.name.endswith("_total")}
    assert samples == {"m": 7.0}  # a model no pool serves makes no label
    assert "m" in core.state.last_used()
    assert core.state.tally.window("m", 1, since=0.0).requests == 2
    assert core.state.tally.window("m", 2, since=0.0).errors == 1
    assert client.post("/v1/dataplane/report", json={"served": {"m": "x"}}).status_code == 422


def test_a_reports_shadow_pairs_join_the_running_shadow_step_only() -> None:
    core = Core.for_config(CONFIG)
    core.state.set_shadow("m", Shadow(stable=1, candidate=2, percent=20))
    client = _client(core)
    pair = [True, 0.01, True, 0.02, 0.99]
    answer = client.post("/v1/dataplane/report", json={"shadows": {
        "m": {"stable": 1, "candidate": 2, "pairs": [pair, pair], "skipped": 3},
        "other": {"stable": 1, "candidate": 2, "pairs": [pair]}}})
    assert answer.status_code == 204
    shadow = core.state.shadow_of("m")
    assert shadow is not None and len(shadow.tally.pairs) == 2 and shadow.tally.skipped == 3
    stable, candidate, agreement = shadow.tally.windows()
    assert (stable.requests, candidate.requests, agreement) == (2, 2, 0.99)
    # a step that has moved on meanwhile (another candidate): its pairs are not taken
    client.post("/v1/dataplane/report", json={"shadows": {
        "m": {"stable": 1, "candidate": 3, "pairs": [pair]}}})
    assert len(shadow.tally.pairs) == 2


def test_the_replicas_calls_need_an_admin_token_when_auth_is_on() -> None:
    auth = TokenTable([TokenEntry(name="ops", token="s3cret-admin-token", scopes=("admin",)),
                       TokenEntry(name="app", token="s3cret-app-token", scopes=("predict",))])
    client = _client(Core.for_config(CONFIG), auth)
    assert client.post("/v1/dataplane/report", json={}).status_code == 401
    app = {"Authorization": "Bearer s3cret-app-token"}
    assert client.post("/v1/dataplane/report", json={}, headers=app).status_code == 403
    admin = {"Authorization": "Bearer s3cret-admin-token"}
    assert client.post("/v1/dataplane/report", json={}, headers=admin).status_code == 204
    assert client.get("/v1/dataplane/config", headers=admin).status_code == 200


async def test_a_miss_is_answered_within_its_wait_when_a_replica_lags_behind() -> None:
    """The model is served, but a replica never applies the snapshot (its follower never
    returns): the miss is answered within the last share of what the request may wait
    (2.85 s of 3), for the replica to answer its client before the client's deadline;
    without the bound it waited for the replicas alone."""
    core = Core.for_config(CONFIG)
    never = asyncio.Event()
    core.state.follow(never.wait)
    app = FastAPI()
    app.include_router(create_dataplane_router(core, TokenTable()))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://control") as client:
        started = time.monotonic()
        answer = await asyncio.wait_for(
            client.post("/v1/dataplane/misses/m", params={"wait": "3.0"}), 10.0)
        assert time.monotonic() - started < 3.0
    assert answer.status_code == 200 and answer.json()["model"] == "m"

