"""Probes read each member's Triton version every healthy round, and the data plane's
snapshot carries it to HAProxy's rendering: a member restarted on another release
changes its gRPC connection mode within one round. The member here is a real HTTP
server on loopback answering as Triton's HTTP frontend does (live, server metadata,
metrics), so that versions no installable Triton reports can be served."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.auth import TokenTable
from gateway.config import GatewayConfig
from gateway.config.pools import MemberSpec, PoolSpec
from gateway.control.probes import (
    pending_requests,
    probe_member,
    probe_round,
    read_version,
    service_counters,
)
from gateway.core import Core
from gateway.haproxy.changes import runtime_commands
from gateway.haproxy.controller import snapshot_of
from gateway.haproxy.render import render
from gateway.haproxy.snapshot import Layout
from gateway.pools import PoolMember
from infergate.triton.local import free_port


@dataclass
class Answers:
    metadata: bytes | None = b'{"name": "triton", "version": "2.51.0"}'  # None: HTTP 500
    live: int = 200
    asked: list[str] = field(default_factory=list)  # the paths asked, in order
    metrics: bytes = b'nv_inference_pending_request_count{model="m",version="1"} 3\n'
    configs: dict[str, bytes] = field(default_factory=dict)  # model -> its config JSON


class FakeTritonHTTP(BaseHTTPRequestHandler):
    answers: Answers

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.answers.asked.append(self.path)
        if self.path == "/v2/health/live":
            self._send(self.answers.live, b"")
        elif self.path == "/v2":
            body = self.answers.metadata
            self._send(500, b'{"error": "boom"}') if body is None else self._send(200, body)
        elif self.path == "/metrics":
            self._send(200, self.answers.metrics)
        elif self.path.endswith("/config") and self.path.split("/")[3] in self.answers.configs:
            self._send(200, self.answers.configs[self.path.split("/")[3]])
        else:
            self._send(404, b"")

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def member_server() -> Iterator[tuple[int, Answers]]:
    answers = Answers()
    handler = type("Handler", (FakeTritonHTTP,), {"answers": answers})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], answers
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _probe(dataplane: Core, member: PoolMember) -> None:
    """One probe round of ``member``."""
    async def probe() -> None:
        async with httpx.AsyncClient(timeout=5, trust_env=False) as client:
            await probe_member(client, dataplane, member)

    asyncio.run(probe())


def _one_member(port: int, tmp_path: Path) -> tuple[Core, PoolMember, Layout]:
    spec = MemberSpec(host="127.0.0.1", http_port=port, grpc_port=port, metrics_port=port)
    dataplane = Core.for_config(GatewayConfig(pools=(PoolSpec(name="p", members=(spec,)),)))
    layout = Layout("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4", tmp_path,
                    "127.0.0.1:5")
    return dataplane, dataplane.state.members()[0], layout


def _grpc_server_line(config: str) -> str:
    return next(line for line in config.splitlines()
                if line.strip().startswith("server ") and " proto h2 " in line)


@pytest.mark.parametrize(("metadata", "version", "shared"), [
    (b'{"name": "triton", "version": "2.51.0"}', "2.51.0", False),
    (b'{"name": "triton", "version": "2.57.0"}', "2.57.0", True),
    (b'{"name": "triton", "version": "tip-of-main"}', "tip-of-main", False),
    (b'{"name": "triton"}', None, False),
    (b"<html>not json</html>", None, False),
    (None, None, False),  # the metadata call fails (HTTP 500)
])
def test_probe_reads_the_version_and_the_render_follows_when_members_report(
        member_server: tuple[int, Answers], tmp_path: Path, metadata: bytes | None,
        version: str | None, shared: bool) -> None:
    port, answers = member_server
    answers.metadata = metadata
    dataplane, member, layout = _one_member(port, tmp_path)

    _probe(dataplane, member)
    assert member.version_probed and member.triton_version == version
    assert member.upstream_queue == 3  # the queue scrape still happens beside it
    snapshot = snapshot_of(dataplane.state, TokenTable(), dataplane.clock())
    line = _grpc_server_line(render(snapshot, layout).config)
    assert ("max-reuse 0" not in line) is shared


def test_probe_reads_each_listed_models_priority_levels_once_a_minute(
        member_server: tuple[int, Answers], tmp_path: Path) -> None:
    port, answers = member_server
    answers.metrics = b"".join(
        f'nv_inference_request_success{{model="{m}",version="1"}} 5\n'.encode()
        for m in ("leveled", "plain", "gone"))
    answers.configs = {
        "leveled": b'{"name": "leveled", "dynamic_batching": {"priority_levels": "3"}}',
        "plain": b'{"name": "plain", "dynamic_batching": {}}'}  # "gone": 404
    spec = MemberSpec(host="127.0.0.1", http_port=port, grpc_port=port, metrics_port=port)
    dataplane = Core.for_config(GatewayConfig(pools=(
        PoolSpec(name="p", members=(spec,), models=("leveled", "plain")),)))
    member = dataplane.state.members()[0]

    _probe(dataplane, member)
    assert {m: n for m, (_, n) in member.priority_levels.items()} == {
        "leveled": 3, "plain": 0, "gone": 0}
    assert dataplane.state.priority_levels("leveled") == 3
    assert dataplane.state.priority_levels("unknown") == 0
    assert snapshot_of(dataplane.state, TokenTable(), dataplane.clock()).levels == (
        ("leveled", 3),)
    configs = [p for p in answers.asked if p.endswith("/config")]
    _probe(dataplane, member)  # within LEVELS_TTL_S: not asked again
    assert [p for p in answers.asked if p.endswith("/config")] == configs
    assert sorted(configs) == [f"/v2/models/{m}/config" for m in ("gone", "leveled", "plain")]


def test_member_that_fails_live_is_not_scraped_so_the_next_probe_comes_a_timeout_sooner(
        member_server: tuple[int, Answers], tmp_path: Path) -> None:
    port, answers = member_server
    dataplane, member, _ = _one_member(port, tmp_path)

    answers.live = 503
    _probe(dataplane, member)
    assert member.healthy  # one failed probe of HEALTH_FALL (2): still routed
    assert answers.asked == ["/v2/health/live"]  # neither metrics nor metadata waited for
    _probe(dataplane, member)
    assert not member.healthy and answers.asked == ["/v2/health/live"] * 2
    answers.live = 200
    _probe(dataplane, member)
    assert member.healthy and {"/metrics", "/v2"} <= set(answers.asked[2:])
    assert member.upstream_queue == 3


def test_member_restarted_on_a_fixed_release_shares_after_one_round(
        member_server: tuple[int, Answers], tmp_path: Path) -> None:
    port, answers = member_server
    dataplane, member, layout = _one_member(port, tmp_path)

    def round_() -> str:
        _probe(dataplane, member)
        return _grpc_server_line(render(snapshot_of(dataplane.state, TokenTable(), 0.0),
                                        layout).config)

    before = snapshot_of(dataplane.state, TokenTable(), 0.0)
    assert "max-reuse 0" in round_()
    old = snapshot_of(dataplane.state, TokenTable(), 0.0)
    answers.metadata = json.dumps({"name": "triton", "version": "2.58.0"}).encode()
    assert "max-reuse 0" not in round_()
    new = snapshot_of(dataplane.state, TokenTable(), 0.0)
    assert runtime_commands(old, new, layout) is None  # a reload moves HAProxy
    assert before.pools[0].members[0].triton_version is None  # never probed: not assumed


def test_read_version_is_none_when_nothing_listens() -> None:
    async def read() -> str | None:
        async with httpx.AsyncClient(timeout=2, trust_env=False) as client:
            return await read_version(client, MemberSpec(host="127.0.0.1", http_port=1))
    assert asyncio.run(read()) is None


def test_pending_requests_sums_the_family_and_nothing_else_when_read_off_the_text() -> None:
    text = (
        "# HELP nv_inference_pending_request_count Instantaneous number of pending requests\n"
        "# TYPE nv_inference_pending_request_count gauge\n"
        'nv_inference_pending_request_count{model="a",version="1"} 2\n'
        'nv_inference_pending_request_count{model="b }",version="1"} 3 1700000000000\n'
        "nv_inference_pending_request_count 1\n"
        'nv_inference_pending_request_count_extra{model="a"} 100\n'
        'nv_inference_count{model="a",version="1"} 90\n'
        'nv_inference_pending_request_count{model="c"} NaN-ish\n'
    )
    assert pending_requests(text) == 6
    assert pending_requests("") == 0


TRITON_PAGE = """\
# HELP nv_inference_request_success Number of successful inference requests
nv_inference_request_success{model="slow",version="1"} 10
nv_inference_request_success{model="slow",version="2"} 2
nv_inference_request_success{model="tiny",version="1"} 4
nv_inference_request_failure{model="slow",reason="REJECTED",version="1"} 7
nv_inference_compute_input_duration_us{model="slow",version="1"} 1000
nv_inference_compute_infer_duration_us{model="slow",version="1"} 200000
nv_inference_compute_infer_duration_us{model="slow",version="2"} 38000
nv_inference_compute_output_duration_us{model="slow",version="1"} 1000
nv_inference_compute_infer_duration_us{model="tiny",version="1"} 400
nv_inference_queue_duration_us{model="slow",version="1"} 999999
nv_inference_request_success 5
"""


def test_service_counters_sum_each_models_answers_and_compute_time() -> None:
    assert service_counters(TRITON_PAGE) == {"slow": (12, 240_000), "tiny": (4, 400)}
    assert service_counters("") == {}


def test_a_member_measures_service_time_and_answers_per_second_per_model() -> None:
    member = PoolMember("p", MemberSpec(grpc_port=1))
    member.served({"slow": (12, 240_000), "idle": (0, 0)}, now=1.0)
    # the mean so far, at the first probe; no rate yet (no interval)
    assert member.service_time_us("slow", 1.0, 5.0) == 20_000
    assert member.service_time_us("idle", 1.0, 5.0) is None
    assert member.peak_answer_rate("slow", 1.0, 60.0) == 0.0
    member.served({"slow": (14, 300_000), "idle": (0, 0)}, now=2.0)
    assert member.service_time_us("slow", 2.0, 5.0) == 30_000  # the two since: 60 ms
    member.served({"slow": (54, 1_100_000)}, now=2.5)
    assert member.peak_answer_rate("slow", 2.5, 60.0) == 80.0  # 40 in half a second
    member.served({"slow": (54, 1_100_000)}, now=3.0)  # no answers this round
    assert member.service_time_us("slow", 3.0, 5.0) == 20_000  # kept while fresh
    assert member.service_time_us("slow", 7.6, 5.0) is None  # then it ages out
    assert member.peak_answer_rate("slow", 3.0, 60.0) == 80.0
    assert member.peak_answer_rate("slow", 70.0, 60.0) == 0.0
    member.served({"slow": (2, 10_000)}, now=8.0)  # counters went back: restarted
    assert member.service_time_us("slow", 8.0, 5.0) == 5_000


def test_member_is_down_after_two_failed_probes_but_at_once_when_refused(
        member_server: tuple[int, Answers], tmp_path: Path) -> None:
    """HEALTH_FALL, as HAProxy's ``fall``: one bad /live (a busy machine) keeps the
    member; two in a row take it out; nothing listening takes it out at once."""
    port, answers = member_server
    dataplane, member, _ = _one_member(port, tmp_path)

    async def probe(target: PoolMember) -> bool:
        async with httpx.AsyncClient(timeout=5, trust_env=False) as client:
            await probe_member(client, dataplane, target)
        return target.healthy

    answers.live = 500
    assert asyncio.run(probe(member)) is True
    assert asyncio.run(probe(member)) is False
    answers.live = 200
    assert asyncio.run(probe(member)) is True and member.failed_probes == 0
    gone, _, _ = _one_member(free_port(), tmp_path)
    assert asyncio.run(probe(gone.state.members()[0])) is False


def test_a_member_whose_probe_fails_unexpectedly_leaves_the_others_probed(
        member_server: tuple[int, Answers], caplog: pytest.LogCaptureFixture) -> None:
    """An exception no probe catches (it was httpx refusing the unbracketed URL of an IPv6
    member found by DNS, before gateway/netaddr.py) ended the round's gather, and with it
    the probing of every member, for good and without a log line."""
    port, answers = member_server
    good = MemberSpec(host="127.0.0.1", http_port=port, grpc_port=port, metrics_port=port)
    odd = MemberSpec(host="10.255.255.1", http_port=8000, grpc_port=8001, metrics_port=8002)
    core = Core.for_config(GatewayConfig(pools=(PoolSpec(name="p", members=(odd, good)),)))

    class Refusing(httpx.AsyncClient):
        async def get(self, url: Any, **kwargs: Any) -> httpx.Response:
            if "10.255.255.1" in str(url):
                raise RuntimeError("unexpected")
            return await super().get(url, **kwargs)

    async def one_round() -> None:
        async with Refusing(timeout=5, trust_env=False) as client:
            await probe_round(client, core)

    with caplog.at_level(logging.ERROR, logger="gateway.control.probes"):
        asyncio.run(one_round())
    probed = {m.key: m.version_probed for m in core.state.members()}
    assert probed == {"10.255.255.1:8001": False, f"127.0.0.1:{port}": True}, probed
    assert "/v2/health/live" in answers.asked
    assert any("probing 10.255.255.1:8001" in r.getMessage() and r.exc_info
               for r in caplog.records)
