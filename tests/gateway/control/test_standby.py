"""Two control-plane replicas over one PostgreSQL (gateway/control/standby.py): one
leads, the other is a standby that serves the lifecycle's reads from the records and
passes the rest to the leader; the leader killed (SIGKILL), the standby takes the lock
(term 2), recovers and serves, and the reads sent to it meanwhile all answered. Real
processes: Triton, PostgreSQL, two gateways."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from infergate.postgres import LocalPostgres
from infergate.processes import STARTED_LINE
from infergate.triton.local import LocalTriton
from tests.gateway.lifecycle.conftest import lifecycle_config, spawn_gateway
from tests.procs import run_gateway, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TAKEOVER_S = 10.0  # the bound: a new leader acts within it


class Reads(threading.Thread):
    """GET ``url`` back to back on one keep-alive connection until stopped."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.ok = 0
        self.failed: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=10) as client:
            while not self.stop.is_set():
                try:
                    answer = client.get(self.url)
                    if answer.status_code == 200:
                        self.ok += 1
                    else:
                        self.failed.append(f"{answer.status_code} {answer.text[:100]}")
                except httpx.HTTPError as exc:
                    self.failed.append(repr(exc))
                time.sleep(0.02)


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
        assert wait_until(lambda: httpx.get(f"{base}/v1/replica").status_code == 200, 10, 0.05)
        assert httpx.get(f"{base}/v1/models").json() == {"models": []}  # from the records
        standing = httpx.get(f"{base}/v1/leader")  # who leads: not this one
        assert standing.status_code == 503 and standing.json()["state"] == "follower"
        assert httpx.get(f"http://{leader.http_url}/v1/leader").json()["state"] == "leader"
        passed = httpx.post(f"{base}/v1/models/nope/rollback", json={})  # the leader's answer
        assert passed.status_code == 404 and "nope" in passed.json()["error"], passed.text

        reads = Reads(f"{base}/v1/models")
        reads.start()
        time.sleep(0.5)
        leader.proc.send_signal(signal.SIGKILL)
        leader.proc.wait(10)
        killed = time.monotonic()
        assert wait_until(lambda: httpx.get(f"{base}/v1/leader").status_code == 200,
                          TAKEOVER_S, 0.05), standby.log.read_text()[-2000:]
        took = time.monotonic() - killed
        # and on, once its own API has taken the port over (the same connection)
        assert wait_until(lambda: STARTED_LINE in standby.log.read_text(), TAKEOVER_S, 0.05)
        time.sleep(1.0)
        reads.stop.set()
        reads.join(10)
        print(f"\nthe standby led {took:.1f} s after the leader died; reads through it: "
              f"{reads.ok} ok, {len(reads.failed)} failed")
        assert reads.failed == [] and reads.ok > 20
        assert "leads, term 2" in standby.log.read_text()
        assert httpx.get(f"{base}/v1/leader").json() == {
            "holder": httpx.get(f"{base}/v1/leader").json()["holder"], "state": "leader",
            "term": 2}
