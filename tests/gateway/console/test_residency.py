"""The pools page with residency (issue 29): for a pool whose members hold only some
models, which models live on which member (state, for how long, why, footprint) and a
bar per member of its memory in use against what is usable and its budget. Rendered from
a report of the shape ``GET /v1/residency`` serves (Residency.report), over a real Core
of the configured pools; a pool without residency shows none of it."""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient

from gateway.auth import Principal, Scope, TokenTable
from gateway.config import GatewayConfig
from gateway.config.pools import MemberSpec, PoolSpec
from gateway.config.residency import ResidencySpec
from gateway.console.charts import memory_bar
from gateway.console.pages import TEMPLATES, Console, create_console_router, pool_rows
from gateway.console.session import COOKIE, Sessions
from gateway.console.traffic import TrafficHistory
from gateway.core import Core

GIB = 1024**3
HOSTILE = "<script>alert(1)</script>"
A, B = "10.0.0.1:8001", "10.0.0.2:8001"


def _core() -> Core:
    def member(host: str) -> MemberSpec:
        return MemberSpec(host=host, http_port=8000, grpc_port=8001, metrics_port=8002)

    residency = ResidencySpec(memory_budget_bytes=4 * GIB, headroom_bytes=GIB // 2)
    return Core.for_config(GatewayConfig(pools=(
        PoolSpec(name="cpu", members=(member("10.0.0.1"), member("10.0.0.2")),
                 residency=residency),
        PoolSpec(name="plain", members=(member("10.0.0.3"),)))))


def _report(used_b: int = 2 * GIB) -> dict[str, Any]:
    def member(key: str, used: int, models: list[dict[str, Any]]) -> dict[str, Any]:
        return {"key": key, "available": key == A, "budget_bytes": 4 * GIB,
                "usable_bytes": 4 * GIB - GIB // 2, "used_bytes": used, "models": models}

    return {"pools": [{"name": "cpu", "budget_bytes": 4 * GIB, "headroom_bytes": GIB // 2,
                       "members": [
        member(A, 3 * GIB, [
            {"model": "warm", "state": "evicting", "for_s": 0.4, "reason": "room",
             "footprint_bytes": GIB},
            {"model": "hot", "state": "resident", "for_s": 185.0, "reason": "demand",
             "footprint_bytes": 2 * GIB}]),
        member(B, used_b, [
            {"model": "hot", "state": "loading", "for_s": 3.2, "reason": "miss",
             "footprint_bytes": 2 * GIB},
            {"model": "bad", "state": "failed", "for_s": 7300.0,
             "reason": f"out of memory {HOSTILE}", "footprint_bytes": 512 * 1024**2}])]}],
        "models": {}}


def _page(report: dict[str, Any] | None) -> str:
    session = Sessions().open(Principal("owner", frozenset({Scope.UPLOAD})))
    return TEMPLATES.get_template("pools.html").render(
        session=session, pools=pool_rows(_core(), report), plan=None, problem=None,
        scheduler=None)


def _section(page: str, pool: str) -> str:
    start = page.index(f"Pool {pool}</h2>")
    end = page.find("</section>", start)
    return page[start:end]


def test_each_member_shows_its_models_with_state_age_and_reason() -> None:
    cpu = _section(_page(_report()), "cpu")
    assert "Models by member" in cpu and "budget of 4.0 GiB" in cpu and "512.0 MiB" in cpu
    on_a = cpu[cpu.index(f"<h4>{A}"):cpu.index(f"<h4>{B}")]
    on_b = cpu[cpu.index(f"<h4>{B}"):]
    rows_a = re.findall(r"<tr><td>(\w+)</td><td><span class=\"state state-(\w+)\">", on_a)
    assert rows_a == [("hot", "resident"), ("warm", "evicting")]  # resident ones first
    assert "3 min 5 s" in on_a and "demand" in on_a and "2.0 GiB" in on_a
    assert ">0 s<" in on_a and "room" in on_a
    assert "unavailable" not in on_a and "unavailable" in on_b
    assert "state-loading" in on_b and ">3 s<" in on_b and "miss" in on_b
    assert "state-failed\">failed" in on_b and "2 h 1 min" in on_b
    assert HOSTILE not in cpu and "out of memory &lt;script&gt;" in cpu


def test_a_bar_per_member_shows_used_against_usable_and_budget() -> None:
    page = _page(_report(used_b=4 * GIB))
    cpu = _section(page, "cpu")
    bars = re.findall(r'<svg role="img" width="200"[^>]*aria-label="([^"]+)"', cpu)
    assert bars == [
        f"memory of {A}: 3.0 GiB used of 3.5 GiB usable (86%), budget 4.0 GiB",
        f"memory of {B}: 4.0 GiB used of 3.5 GiB usable (114%), budget 4.0 GiB"]
    # the usable mark at 3.5 of 4 GiB; A's use 3/4 of the bar, B's red past the mark
    assert cpu.count('x1="175.0"') == 2
    assert 'class="used" x="0" y="0" width="150.0"' in cpu
    assert 'width="200.0" height="14" fill="#c62828"' in cpu
    assert 'class="membar-value over"' in cpu and cpu.count("membar-value over") == 1


def test_a_pool_without_residency_and_a_gateway_without_it_show_no_bars() -> None:
    page = _page(_report())
    assert "Models by member" not in _section(page, "plain")
    assert "membar" not in _section(page, "plain")
    without = _page(None)
    assert "Pool cpu" in without and "Models by member" not in without
    assert "membar" not in without


def test_memory_bar_with_nothing_used_or_no_headroom() -> None:
    empty = memory_bar(0, GIB, GIB, "m")
    assert 'class="used" x="0" y="0" width="0.0"' in empty
    assert 'class="headroom" x="200.0" y="0" width="0.0"' in empty
    assert "0 B used of 1.0 GiB usable (0%), budget 1.0 GiB" in empty


class _Reporting:
    """Stands for the residency: the pools page asks only for its report."""

    def __init__(self, report: dict[str, Any]) -> None:
        self.answer, self.asked = report, 0

    def report(self) -> dict[str, Any]:
        self.asked += 1
        return self.answer


def test_the_pools_page_reads_the_residency_each_time_it_is_shown() -> None:
    core = _core()
    residency = _Reporting(_report())
    sessions = Sessions()
    console = Console(core, TokenTable(), TrafficHistory(core.metrics.registry), sessions,
                      residency=residency)
    app = FastAPI()
    app.include_router(create_console_router(console))
    session = sessions.open(Principal("owner", frozenset({Scope.UPLOAD})))
    with TestClient(app) as client:
        assert client.get("/ui/pools", follow_redirects=False).status_code == 303
        client.cookies.set(COOKIE, session.id, path="/ui")
        first = client.get("/ui/pools")
        residency.answer = _report(used_b=0)
        second = client.get("/ui/pools")
    assert first.status_code == 200 and second.status_code == 200
    assert residency.asked == 2
    assert f"memory of {B}: 2.0 GiB used" in first.text
    assert f"memory of {B}: 0 B used" in second.text
