"""The pools page with residency (issue 29): for a pool whose members hold only some
models, which models live on which member (state, for how long, why, footprint) and a
bar per member of its memory in use against what is usable and its budget. Rendered from
a report of the shape ``GET /v1/residency`` serves (Residency.report), over a real Core
of the configured pools; a pool without residency shows none of it.

Since issue 34 each holding is a state machine (queued, loading, warming, resident,
draining, unloading, failed) and requests wait for loads: the pools page shows each
holding's state and the requests waiting for it, the pool's waiting requests and the
models it may hold; the models pages say where each model is held. Reports of the older
shape (no ``holdings``, no pool ``waiting``) still read."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient

from gateway.auth import Principal, Scope, TokenTable
from gateway.config import GatewayConfig
from gateway.config.pools import MemberSpec, PoolSpec
from gateway.config.residency import ResidencySpec
from gateway.console.charts import memory_bar
from gateway.console.pages import (
    TEMPLATES,
    Console,
    create_console_router,
    model_residency,
    model_row,
    pool_rows,
)
from gateway.console.session import COOKIE, Sessions
from gateway.console.traffic import TrafficHistory
from gateway.core import Core
from tests.gateway.console.conftest import residency_report

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
        scheduler=None, tenants=None)


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


def test_a_model_the_fill_loaded_says_it_goes_first_until_it_is_used() -> None:
    report = _report()
    held = report["pools"][0]["members"][0]["models"]
    held[1].update(reason="fill", lent=True)  # "hot": loaded into free room, unused
    on_a = _section(_page(report), "cpu").split(f"<h4>{B}")[0]
    assert "fill <span class=\"note\">(not used yet: evicted first)</span>" in on_a
    held[1]["lent"] = False  # asked for since: an ordinary model
    assert "not used yet" not in _section(_page(report), "cpu")


def test_a_member_with_a_placement_margin_says_what_it_leaves_free() -> None:
    report = _report()
    report["pools"][0]["members"][0]["margin_bytes"] = 440 * 1024
    cpu = _section(_page(report), "cpu")
    on_a, on_b = cpu.split(f"<h4>{B}")
    assert "places leaving 440.0 KiB free" in on_a
    assert "places leaving" not in on_b  # none measured: it packs to the byte


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


# -- issue 34: holdings as state machines, requests waiting for loads ------------------------
def _rows(section: str) -> list[tuple[str, str, str]]:
    """(model, state, waiting) of each row of a member's table."""
    return re.findall(r'<tr><td>(\w+)</td><td><span class="state state-(\w+)">\w+</span></td>'
                      r".*?<td>([^<]*)</td></tr>", section, re.S)


def test_member_table_shows_each_holdings_state_and_waiting_when_the_report_is_new() -> None:
    cpu = _section(_page(residency_report(failure=f"out of memory {HOSTILE}")), "cpu")
    on_a = cpu[cpu.index(f"<h4>{A}"):cpu.index(f"<h4>{B}")]
    on_b = cpu[cpu.index(f"<h4>{B}"):]
    # resident first, then arriving (warming, loading, queued), leaving, failed
    assert _rows(on_a) == [("hot", "resident", "–"), ("warm", "loading", "3"),
                           ("next", "queued", "5")]
    assert _rows(on_b) == [("hot", "warming", "–"), ("old", "draining", "–"),
                           ("gone", "unloading", "–"), ("bad", "failed", "–")]
    assert "loads 1 model at a time" in on_a and "loads 2 models at a time" in on_b
    assert "miss: no load slot free" in on_a and "room for warm" in on_b
    assert HOSTILE not in cpu and "out of memory &lt;script&gt;" in on_b


def test_pool_shows_waiting_requests_and_the_models_it_may_hold_when_it_serves_any_model(
) -> None:
    page = _page(residency_report())
    cpu = _section(page, "cpu")
    assert "Models: none" not in cpu  # the pool serves "*": it names none itself
    assert "Models: bad, cold, gone, hot, next, old, warm." in cpu
    assert re.search(r'<strong id="waiting-1" class="waiting">8 waiting for a model to '
                     r"load</strong>", cpu)
    plain = _section(page, "plain")  # '*' too, without residency: any model it has
    assert "waiting for a model" not in plain
    assert "Models: any its members' repository has (it serves <code>*</code>)." in plain


def test_pool_lists_the_models_waiting_for_room_in_the_order_room_goes_to_them() -> None:
    room = [{"model": "cold", "waiting": 2, "for_s": 11.4, "urgent": True},
            {"model": HOSTILE, "waiting": 1, "for_s": 0.3, "urgent": False}]
    cpu = _section(_page(residency_report(room=room)), "cpu")
    assert "11 waiting for a model to load" in cpu
    listed = cpu[cpu.index('<ol class="room"'):cpu.index("</ol>")]
    items = re.findall(r"<li>(.*?)</li>", listed, re.S)
    assert len(items) == 2
    assert items[0].startswith("cold: 2 requests, for 11 s") and "urgent" in items[0]
    assert "1 request, for 0 s" in items[1] and "urgent" not in items[1]
    assert HOSTILE not in cpu and "&lt;script&gt;" in items[1]
    assert "Waiting for room" not in _section(_page(residency_report()), "cpu")


def test_pool_counts_its_models_waiting_when_an_old_report_has_no_pool_waiting() -> None:
    old = _report()
    old["models"] = {"hot": {"pool": "cpu", "waiting": 2, "members": [A]},
                     "bad": {"pool": "cpu", "waiting": 3, "members": []}}
    cpu = _section(_page(old), "cpu")
    assert "5 waiting for a model to load" in cpu and "Models: bad, hot." in cpu
    idle = _section(_page(_report()), "cpu")
    assert ">0 waiting for a model to load</strong>" in idle and 'class="waiting"' not in idle


def test_memory_bar_fill_and_mark_are_fractions_of_its_width_when_98_percent_used() -> None:
    bar = memory_bar(int(0.98 * 4 * GIB), 4 * GIB - GIB // 2, 4 * GIB, "m")
    assert 'preserveAspectRatio="none"' in bar  # stretched, never letterboxed
    assert 'class="used" x="0" y="0" width="196.0"' in bar
    assert 'class="usable" x1="175.0"' in bar
    assert 'class="frame" x="0.5" y="0.5" width="199" height="13"' in bar


def test_model_residency_lists_resident_members_then_other_holdings_when_holdings_are_given(
) -> None:
    report = residency_report()
    hot = model_residency(report, "hot")
    assert hot is not None and hot["resident"] == [A] and hot["waiting"] == 0
    assert [(h["member"], h["state"]) for h in hot["others"]] == [(B, "warming")]
    cold = model_residency(report, "cold")
    assert cold == {"pool": "cpu", "waiting": 0, "load_s": None, "resident": [], "others": []}
    assert model_residency(report, "elsewhere") is None and model_residency(None, "hot") is None
    # the entry's holdings are what counts, not the members' lists
    report["models"]["next"]["holdings"][0]["state"] = "loading"
    loading = model_residency(report, "next")
    assert loading is not None and loading["others"][0]["state"] == "loading"


def test_model_residency_derives_holdings_from_the_members_when_an_old_report_has_none(
) -> None:
    old = _report()
    old["models"] = {"hot": {"pool": "cpu", "waiting": 3, "members": [A]}}
    hot = model_residency(old, "hot")
    assert hot is not None and hot["resident"] == [A] and hot["waiting"] == 3
    assert [(h["member"], h["state"], h["reason"], h["waiting"]) for h in hot["others"]] == [
        (B, "loading", "miss", 0)]


def _model_cells(page: str) -> dict[str, str]:
    """model -> its row on the models page."""
    return {m.group(1): m.group(0) for m in re.finditer(
        r'<th scope="row">(\w+)</th>.*?</tr>', page, re.S)}


def _console(core: Core, residency: Any) -> tuple[TestClient, Any]:
    sessions = Sessions()
    console = Console(core, TokenTable(), TrafficHistory(core.metrics.registry), sessions,
                      residency=residency)
    app = FastAPI()
    app.include_router(create_console_router(console))
    client = TestClient(app)
    session = sessions.open(Principal("owner", frozenset({Scope.UPLOAD})))
    client.cookies.set(COOKIE, session.id, path="/ui")
    return client, console


def test_models_page_says_where_each_model_is_held_when_its_pool_has_residency() -> None:
    with _console(_core(), _Reporting(residency_report()))[0] as client:
        page = client.get("/ui/models")
    assert page.status_code == 200 and '<th scope="col">Held on</th>' in page.text
    rows = _model_cells(page.text)
    # the residency's models are listed though the gateway has no other word of them
    assert sorted(rows) == ["bad", "cold", "gone", "hot", "next", "old", "warm"]
    assert "held nowhere (loads on its next request)" in rows["cold"]
    assert "held nowhere" not in rows["hot"]
    assert f'state-resident">resident</span> on {A}</li>' in rows["hot"]
    assert f'state-warming">warming</span> on {B} for 1 s' in rows["hot"]
    assert f'state-queued">queued</span> on {A} for 2 s, 5 waiting' in rows["next"]
    assert "waiting for it" not in rows["next"]  # its one load says it already
    assert f'state-failed">failed</span> on {B} for 2 h 1 min' in rows["bad"]
    assert "(out of memory: CUDA error)" in rows["bad"]
    assert "state-resident" not in rows["bad"] and "state-draining" in rows["old"]


def test_models_page_has_no_residency_column_when_the_gateway_has_no_residency() -> None:
    with _console(_core(), None)[0] as client:
        page = client.get("/ui/models")
    assert page.status_code == 200 and "Held on" not in page.text


def test_model_page_says_where_it_is_held_when_its_pool_has_residency() -> None:
    core = _core()
    _, console = _console(core, _Reporting(residency_report()))
    session = Sessions().open(Principal("owner", frozenset({Scope.UPLOAD})))

    def shown(name: str, report: dict[str, Any] | None = None) -> str:
        model = SimpleNamespace(name=name, state="serving", detail="", serving_version=1,
                                previous_version=None, pools=["cpu"])
        row = model_row(console, name, report or residency_report())
        page = TEMPLATES.get_template("model.html").render(
            session=session, model=model, versions=[], shown=None, report=None,
            rollout=None, jobs=[], row=row, busy=False)
        return page[page.index('<dl class="facts">'):page.index("</dl>")]

    assert "<dt>Held on</dt>" in shown("next") and "queued</span> on " + A in shown("next")
    assert "held nowhere (loads on its next request)" in shown("cold")
    assert "Held on" not in shown("elsewhere")  # in no pool with residency
    old = _report()  # no holdings, no waiting per load: the model's own count
    old["models"] = {"hot": {"pool": "cpu", "waiting": 3, "members": [A]}}
    hot = shown("hot", old)
    assert f"resident</span> on {A}</li>" in hot and f"loading</span> on {B} for 3 s" in hot
    assert "3 requests waiting for it" in hot


def test_the_pool_says_how_long_loads_and_evictions_take_and_a_model_its_last_load() -> None:
    report = residency_report()
    assert "A load takes" not in _section(_page(report), "cpu")  # none measured yet
    report["timings"] = {"load_s": 0.861, "loads_measured": 12, "eviction_s": 1.352,
                         "evictions_measured": 40}
    cpu = _section(_page(report), "cpu")
    assert ("A load takes 0.86 s here (the median of 12 models' last), an eviction 1.35 s "
            "from out of routing to its room free (of the last 40)") in cpu
    report["models"]["hot"]["load_s"] = 0.861
    assert "its last load took 0.86 s" in (model_residency_html(report, "hot"))
    assert "its last load took" not in model_residency_html(report, "cold")


def model_residency_html(report: dict[str, Any], name: str) -> str:
    macro = TEMPLATES.get_template("residency.html").module.held  # type: ignore[attr-defined]
    return str(macro(model_residency(report, name)))
