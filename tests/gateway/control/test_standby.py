"""Two control-plane replicas over one PostgreSQL (gateway/control/standby.py): one
leads, the other is a standby whose readiness is false and whose every call is a 503
saying another replica leads; the leader killed (SIGKILL), the standby takes the lock
(term 2), recovers and serves. Real processes: Triton, PostgreSQL, two gateways."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import pytest

from infergate.postgres import LocalPostgres
from infergate.triton.local import LocalTriton
from tests.gateway.lifecycle.conftest import lifecycle_config, spawn_gateway
from tests.procs import run_gateway, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TAKEOVER_S = 10.0  # the bound: a new leader acts within it


def test_a_standby_leads_and_serves_within_seconds_when_the_leader_is_killed(
        triton: LocalTriton, postgres: LocalPostgres, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert triton.endpoints is not None
    monkeypatch.setenv("INFERGATE_DATABASE_URL", postgres.create_database("standby"))
    repo = tmp_path / "repo"
    repo.mkdir()
    config = lifecycle_config(tmp_path / "gateway.yaml", {"local": [triton.endpoints]},
                              repo, tokens=False)
    with run_gateway(config, tmp_path, data_plane="none") as leader, \
            spawn_gateway(config, tmp_path, "--data-plane", "none") as standby:
        base = f"http://{standby.http_url}"
        assert httpx.get(f"http://{leader.http_url}/v1/models").status_code == 200
        refused = httpx.get(f"{base}/v1/models")
        assert refused.status_code == 503 and "standby" in refused.json()["error"]
        assert refused.headers["retry-after"] == "2"
        assert httpx.get(f"{base}/v2/health/ready").status_code == 503
        standing = httpx.get(f"{base}/v1/leader")  # the readiness a Service routes by
        assert standing.status_code == 503 and standing.json()["state"] == "follower"
        assert httpx.get(f"http://{leader.http_url}/v1/leader").json()["state"] == "leader"

        leader.proc.send_signal(signal.SIGKILL)
        leader.proc.wait(10)
        killed = time.monotonic()

        def serving() -> bool:
            try:
                return httpx.get(f"{base}/v1/models", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        assert wait_until(serving, TAKEOVER_S, 0.05), standby.log.read_text()[-2000:]
        took = time.monotonic() - killed
        print(f"\nthe standby served the lifecycle API {took:.1f} s after the leader died")
        assert "leads, term 2" in standby.log.read_text()
        assert httpx.get(f"{base}/v1/leader").json() == {
            "holder": httpx.get(f"{base}/v1/leader").json()["holder"], "state": "leader",
            "term": 2}
