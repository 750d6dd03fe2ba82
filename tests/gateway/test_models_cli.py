"""``infergate models`` against a stand-in gateway (httpx's mock transport): what it sends
through the lifecycle client, and how it says a refusal. The commands against a real
gateway: tests/gateway/lifecycle (test_deploy, test_rollout, test_conversion)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from gateway import models_cli
from gateway.lifecycle.client import LifecycleClient, model_as_one_file
from tests.gateway.console.conftest import residency_report
from tests.gateway.lifecycle.test_client import published_model

Handler = Callable[[httpx.Request], httpx.Response]


@pytest.fixture
def gateway(monkeypatch: pytest.MonkeyPatch) -> Callable[[Handler], list[httpx.Request]]:
    """Route the CLI's calls to ``handler``; the requests it made, in order."""
    def serve(handler: Handler) -> list[httpx.Request]:
        seen: list[httpx.Request] = []

        def record(request: httpx.Request) -> httpx.Response:
            seen.append(request)
            return handler(request)

        monkeypatch.setattr(models_cli, "LifecycleClient", lambda url, token: LifecycleClient(
            url, token, transport=httpx.MockTransport(record)))
        return seen

    return serve


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(models_cli.app, [*args, "--url", "http://gw:8000/",
                                                 "--token", "secret"])
    return result.exit_code, result.output


@pytest.mark.parametrize(("status", "body", "code", "said"), [
    (403, {"error": "token lacks the admin scope"}, 2, "error 403: token lacks the admin scope"),
    (503, "upstream down", 1, "error 503: upstream down"),  # not JSON: its text
])
def test_a_refusal_prints_the_gateways_error_and_exits_by_its_class(
    gateway: Callable[[Handler], list[httpx.Request]], status: int, body: object, code: int,
    said: str,
) -> None:
    gateway(lambda _: httpx.Response(status, json=body) if isinstance(body, dict)
            else httpx.Response(status, text=str(body)))
    exit_code, output = invoke("rollout", "abort", "tiny")
    assert exit_code == code and said in output


def taking_uploads(gateway: Callable[[Handler], list[httpx.Request]], model: str,
                   version: int) -> list[httpx.Request]:
    """The gateway takes an upload of ``model`` (202) and says its job made ``version``."""
    job = {"id": "j1", "model": model, "state": "succeeded", "version": version, "steps": []}
    return gateway(lambda request: httpx.Response(
        202 if request.method == "POST" else 200, json=job))


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    (tmp_path / "spec.json").write_text(json.dumps({"inputs": []}))
    return tmp_path / "spec.json"


def test_upload_sends_each_file_by_name_with_the_token_then_follows_the_job(
    gateway: Callable[[Handler], list[httpx.Request]], tmp_path: Path, spec: Path,
) -> None:
    seen = taking_uploads(gateway, "tiny", 3)
    (tmp_path / "tiny.pt2").write_bytes(b"exported")
    (tmp_path / "eval.npz").write_bytes(b"samples")
    exit_code, output = invoke("upload", "tiny", "--model", str(tmp_path / "tiny.pt2"),
                               "--spec", str(spec),
                               "--evaluation", str(tmp_path / "eval.npz"))
    assert exit_code == 0, output
    assert "tiny version 3 is serving" in output
    sent, followed = seen
    assert (sent.method, sent.url.path) == ("POST", "/v1/models/tiny/versions")
    assert sent.headers["authorization"] == "Bearer secret"
    body = sent.read()
    for part in (b'name="model"; filename="tiny.pt2"', b"exported",
                 b'name="spec"; filename="spec.json"', b'{"inputs": []}',
                 b'name="evaluation"; filename="eval.npz"', b"samples"):
        assert part in body
    assert b'name="calibration"' not in body
    assert (followed.method, followed.url.path) == ("GET", "/v1/jobs/j1")


def test_upload_sends_a_model_published_with_its_weights_beside_it_as_one_file(
    gateway: Callable[[Handler], list[httpx.Request]], tmp_path: Path, spec: Path,
) -> None:
    seen = taking_uploads(gateway, "big", 1)
    model = published_model(tmp_path)
    exit_code, output = invoke("upload", "big", "--model", str(model), "--spec", str(spec),
                               "--no-follow")
    assert exit_code == 0, output
    body = seen[0].read()
    assert body.count(b'name="model"; filename="model.onnx"') == 1
    inlined = model_as_one_file(model)
    assert inlined is not None and inlined in body  # its 4 MiB of weights inlined


def test_upload_of_a_model_whose_weights_file_is_missing_says_so_and_sends_nothing(
    gateway: Callable[[Handler], list[httpx.Request]], tmp_path: Path, spec: Path,
) -> None:
    seen = taking_uploads(gateway, "big", 1)
    model = published_model(tmp_path)
    (tmp_path / "1" / "model.onnx.data").unlink()
    exit_code, output = invoke("upload", "big", "--model", str(model), "--spec", str(spec))
    assert exit_code == 2 and "cannot be sent as one file" in output
    assert seen == []


def test_rollback_asks_for_the_previous_version_unless_given_one(
    gateway: Callable[[Handler], list[httpx.Request]],
) -> None:
    seen = gateway(lambda _: httpx.Response(200, json={"serving_version": 1,
                                                       "previous_version": 2}))
    assert invoke("rollback", "tiny")[0] == 0
    assert invoke("rollback", "tiny", "--version", "4")[0] == 0
    assert [json.loads(r.read()) for r in seen] == [{"version": None}, {"version": 4}]
    assert {r.url.path for r in seen} == {"/v1/models/tiny/rollback"}


GIB = 1024**3
RESIDENCY: dict[str, Any] = {
    "enabled": True,
    "pools": [{"name": "cpu", "budget_bytes": 4 * GIB, "headroom_bytes": GIB // 2, "members": [
        {"key": "10.0.0.1:8001", "available": True, "budget_bytes": 4 * GIB,
         "usable_bytes": 4 * GIB - GIB // 2, "used_bytes": 3 * GIB, "models": [
             {"model": "hot", "state": "resident", "for_s": 42.0, "reason": "demand",
              "footprint_bytes": 2 * GIB},
             {"model": "warm", "state": "evicting", "for_s": 0.5, "reason": "room",
              "footprint_bytes": GIB}]},
        {"key": "10.0.0.2:8001", "available": False, "budget_bytes": 4 * GIB,
         "usable_bytes": 4 * GIB - GIB // 2, "used_bytes": 2 * GIB, "models": [
             {"model": "hot", "state": "loading", "for_s": 3.0, "reason": "miss",
              "footprint_bytes": 2 * GIB},
             {"model": "bad", "state": "failed", "for_s": 9.0,
              "reason": "out of memory", "footprint_bytes": GIB}]}]}],
    "models": {
        "hot": {"pool": "cpu", "on_demand": True, "min_replicas": 0,
                "footprint_bytes": 2 * GIB, "footprint_source": "measured",
                "demand_rps": 12.5, "last_used_s_ago": 0.3, "members": ["10.0.0.1:8001"],
                "waiting": 3},
        "warm": {"pool": "cpu", "on_demand": False, "min_replicas": 2,
                 "footprint_bytes": GIB, "footprint_source": "converter", "demand_rps": 0.0,
                 "last_used_s_ago": 600.0, "members": ["10.0.0.1:8001"], "waiting": 0},
        "bad": {"pool": "cpu", "on_demand": True, "min_replicas": 0, "footprint_bytes": GIB,
                "footprint_source": "config", "demand_rps": 0.0, "last_used_s_ago": None,
                "members": [], "waiting": 0},
        "cold": {"pool": "cpu", "on_demand": True, "min_replicas": 0,
                 "footprint_bytes": 512 * 1024**2, "footprint_source": "converter",
                 "demand_rps": 0.0, "last_used_s_ago": 9000.0, "members": [], "waiting": 0},
    },
}


def _residency(request: httpx.Request) -> httpx.Response:
    model = request.url.path.removeprefix("/v1/residency").strip("/")
    if not model:
        return httpx.Response(200, json=RESIDENCY)
    if model not in RESIDENCY["models"]:
        return httpx.Response(404, json={"error": f"model '{model}' is in no pool with "
                                                  "residency"})
    return httpx.Response(200, json={"model": model, **RESIDENCY["models"][model]})


@pytest.fixture
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's tables at 200 columns: every cell on its lines, as a wide terminal."""
    from rich.console import Console
    monkeypatch.setattr(models_cli, "console", Console(width=200))


@pytest.mark.usefixtures("wide")
def test_status_says_a_model_the_fill_loaded_is_not_used_yet(
    gateway: Callable[[Handler], list[httpx.Request]],
) -> None:
    report = residency_report()
    for holding in report["models"]["hot"]["holdings"]:
        holding.update(reason="fill", lent=holding["state"] == "resident")
    gateway(lambda _: httpx.Response(200, json=report))
    exit_code, output = invoke("status")
    assert exit_code == 0, output
    _line_of(output, "hot", "10.0.0.1:8001 resident 3 min (fill, not used yet)")
    _line_of(output, "10.0.0.2:8001 warming 2 s (fill)")


@pytest.mark.usefixtures("wide")
def test_status_says_where_every_model_lives_and_each_members_memory(  # the older report

    gateway: Callable[[Handler], list[httpx.Request]],
) -> None:
    seen = gateway(_residency)
    exit_code, output = invoke("status")
    assert exit_code == 0, output
    assert [(r.method, r.url.path) for r in seen] == [("GET", "/v1/residency")]
    assert seen[0].headers["authorization"] == "Bearer secret"
    lines = output.splitlines()

    def line_of(*words: str) -> str:
        found = [line for line in lines if all(w in line for w in words)]
        assert found, f"no line with {words} in:\n{output}"
        return found[0]

    hot = line_of("hot", "cpu", "10.0.0.1:8001 resident 42 s (demand)")
    assert "2.0 GiB" in hot and "12.50 req/s" in hot and "0 s ago" in hot
    assert hot.strip("│ ").split()[-1] == "3"  # waiting
    line_of("10.0.0.2:8001 loading 3 s (miss)", "measured")
    line_of("warm", "10.0.0.1:8001 evicting 0 s (room)", "1.0 GiB", "10 min ago")
    line_of("bad", "10.0.0.2:8001 failed 9 s (out of memory)", "never")
    line_of("cold", "held nowhere (loads on its next request)", "512.0 MiB", "2.5 h ago")
    line_of("pinned")  # warm: not on demand
    line_of("cpu", "10.0.0.1:8001", "3.0 GiB (86%)", "3.5 GiB", "4.0 GiB",
            "1 resident, 1 evicting")
    line_of("10.0.0.2:8001 (unavailable)", "2.0 GiB (57%)", "1 loading, 1 failed")


@pytest.mark.usefixtures("wide")
def test_status_of_one_model_asks_for_its_entry_and_json_prints_the_gateways_answer(
    gateway: Callable[[Handler], list[httpx.Request]],
) -> None:
    seen = gateway(_residency)
    exit_code, output = invoke("status", "hot")
    assert exit_code == 0, output
    assert [r.url.path for r in seen] == ["/v1/residency/hot", "/v1/residency"]
    assert "10.0.0.1:8001 resident" in output and "10.0.0.2:8001 loading" in output
    assert "warm" not in output and "cold" not in output
    seen.clear()
    exit_code, output = invoke("status", "hot", "--json")
    assert exit_code == 0 and json.loads(output) == {"model": "hot", **RESIDENCY["models"]["hot"]}
    assert [r.url.path for r in seen] == ["/v1/residency/hot"]
    seen.clear()
    exit_code, output = invoke("status", "--json")
    assert exit_code == 0 and json.loads(output) == RESIDENCY


def test_status_of_a_model_in_no_residency_pool_or_without_residency(
    gateway: Callable[[Handler], list[httpx.Request]],
) -> None:
    gateway(_residency)
    exit_code, output = invoke("status", "nope")
    assert exit_code == 2 and "error 404: model 'nope' is in no pool with residency" in output
    gateway(lambda _: httpx.Response(200, json={"enabled": False, "pools": [], "models": {}}))
    exit_code, output = invoke("status")
    assert exit_code == 0 and "no pool of this gateway has residency" in output


def _lines(output: str) -> list[str]:
    return [line.strip("│ ") for line in output.splitlines()]


def _line_of(output: str, *words: str) -> str:
    found = [line for line in _lines(output) if all(w in line for w in words)]
    assert found, f"no line with {words} in:\n{output}"
    return found[0]


@pytest.mark.usefixtures("wide")
def test_status_shows_each_models_state_per_member_and_its_waiting_when_holdings_are_given(
    gateway: Callable[[Handler], list[httpx.Request]],
) -> None:
    """The report of issue 34 (a state machine per holding): every state by its name,
    a failure with its reason, the requests waiting for each load."""
    report = residency_report()
    gateway(lambda _: httpx.Response(200, json=report))
    exit_code, output = invoke("status")
    assert exit_code == 0, output
    _line_of(output, "hot", "10.0.0.1:8001 resident 3 min (demand)", "1.50 req/s")
    _line_of(output, "10.0.0.2:8001 warming 2 s (demand)")  # hot's second line
    _line_of(output, "next", "10.0.0.1:8001 queued 2 s (miss: no load slot free), 5 waiting")
    _line_of(output, "warm", "10.0.0.1:8001 loading 4 s (miss), 3 waiting")
    _line_of(output, "old", "10.0.0.2:8001 draining 20 s (room for warm)")
    _line_of(output, "gone", "10.0.0.2:8001 unloading 0 s (idle)")
    _line_of(output, "bad", "10.0.0.2:8001 failed 2.0 h (out of memory: CUDA error)")
    _line_of(output, "cold", "held nowhere (loads on its next request)")
    assert _line_of(output, "next", "queued").split()[-1] == "5"  # the model's waiting
    _line_of(output, "10.0.0.1:8001", "3.9 GiB (112%)", "1", "1 resident, 1 loading, 1 queued "
             "(8 waiting)")
    _line_of(output, "10.0.0.2:8001", "2", "1 warming, 1 draining, 1 unloading, 1 failed")
    _line_of(output, "pool cpu: 8 requests waiting for loads")


@pytest.mark.usefixtures("wide")
def test_status_lists_the_models_waiting_for_room_in_the_order_room_goes_to_them(
    gateway: Callable[[Handler], list[httpx.Request]],
) -> None:
    report = residency_report(room=[
        {"model": "cold", "waiting": 2, "for_s": 11.4, "urgent": True},
        {"model": "old", "waiting": 1, "for_s": 0.3, "urgent": False}])
    gateway(lambda _: httpx.Response(200, json=report))
    exit_code, output = invoke("status")
    assert exit_code == 0, output
    caption = " ".join(_lines(output)[-3:])
    assert "pool cpu: 11 requests waiting for loads" in caption
    assert ("waiting for room, in the order room goes to them: cold (2 waiting, 11 s, "
            "urgent), old (1 waiting, 0 s)") in caption


@pytest.mark.usefixtures("wide")
def test_status_of_one_model_reads_its_entrys_holdings_when_the_report_is_new(
    gateway: Callable[[Handler], list[httpx.Request]],
) -> None:
    report = residency_report()
    entry = {"model": "hot", **report["models"]["hot"]}
    # the entry is what the model's line shows, even a moment newer than the report
    entry["holdings"] = [{**entry["holdings"][1], "state": "resident", "for_s": 0.2}]
    seen = gateway(lambda request: httpx.Response(
        200, json=entry if request.url.path.endswith("/hot") else report))
    exit_code, output = invoke("status", "hot")
    assert exit_code == 0, output
    assert [r.url.path for r in seen] == ["/v1/residency/hot", "/v1/residency"]
    _line_of(output, "hot", "10.0.0.2:8001 resident 0 s (demand)")
    assert "10.0.0.1:8001 resident 3 min" not in output
    assert "10.0.0.2:8001 warming" not in output


def test_holdings_are_the_entrys_when_given_else_the_members_in_state_order() -> None:
    new = residency_report()
    assert [(h["member"], h["state"]) for h in models_cli.holdings(new, "hot")] == [
        ("10.0.0.1:8001", "resident"), ("10.0.0.2:8001", "warming")]
    new["models"]["hot"]["holdings"] = []
    assert models_cli.holdings(new, "hot") == []  # the entry's word, not the members'
    old = RESIDENCY
    assert [(h["member"], h["state"], h["reason"]) for h in models_cli.holdings(old, "hot")] \
        == [("10.0.0.1:8001", "resident", "demand"), ("10.0.0.2:8001", "loading", "miss")]
    assert models_cli.holdings(old, "cold") == []


@pytest.mark.usefixtures("wide")
def test_status_says_how_long_loads_and_evictions_take_once_measured(
    gateway: Callable[[Handler], list[httpx.Request]],
) -> None:
    report = residency_report()
    report["models"]["hot"]["load_s"] = 0.861
    report["timings"] = {"load_s": 0.86, "loads_measured": 12, "eviction_s": 1.352,
                         "evictions_measured": 40}
    gateway(lambda _: httpx.Response(200, json=report))
    exit_code, output = invoke("status")
    assert exit_code == 0, output
    _line_of(output, "measured, loads in 0.86 s")
    caption = " ".join(_lines(output)[-4:])
    assert ("a load takes 0.86 s (the median of 12 models' last); an eviction 1.35 s from "
            "out of routing to its room free (the median of the last 40)") in caption
    report["timings"] = {"load_s": None, "loads_measured": 0, "eviction_s": None,
                         "evictions_measured": 0}
    exit_code, output = invoke("status")
    assert exit_code == 0 and "a load takes" not in output and "an eviction" not in output
