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
