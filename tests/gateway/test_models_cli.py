"""``infergate models`` against a stand-in gateway (httpx's mock transport): what it sends
through the lifecycle client, and how it says a refusal. The commands against a real
gateway: tests/gateway/lifecycle (test_deploy, test_rollout, test_conversion)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from gateway import models_cli
from gateway.lifecycle.client import LifecycleClient

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


def test_upload_sends_each_file_by_name_with_the_token_then_follows_the_job(
    gateway: Callable[[Handler], list[httpx.Request]], tmp_path: Path,
) -> None:
    job = {"id": "j1", "model": "tiny", "state": "succeeded", "version": 3, "steps": []}
    seen = gateway(lambda request: httpx.Response(
        202 if request.method == "POST" else 200, json=job))
    (tmp_path / "tiny.pt2").write_bytes(b"exported")
    (tmp_path / "spec.json").write_text(json.dumps({"inputs": []}))
    (tmp_path / "eval.npz").write_bytes(b"samples")
    exit_code, output = invoke("upload", "tiny", "--model", str(tmp_path / "tiny.pt2"),
                               "--spec", str(tmp_path / "spec.json"),
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
RESIDENCY = {
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
def test_status_says_where_every_model_lives_and_each_members_memory(
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
    line_of("cold", "nowhere (loads on a miss)", "512.0 MiB", "2.5 h ago")
    line_of("pinned")  # warm: not on demand
    line_of("cpu", "10.0.0.1:8001", "3.0 GiB (86%)", "3.5 GiB", "4.0 GiB")
    line_of("10.0.0.2:8001 (unavailable)", "2.0 GiB (57%)")


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
