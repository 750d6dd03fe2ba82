"""The console over plain HTTP, against a real gateway (HAProxy in front), Triton and
scheduler: sign-in and its cookie, CSRF and scope refusals, bad uploads through the form
(the API's own errors, nothing kept), HTML in names escaped, live traffic figures, and
the scheduler's plan picture."""

from __future__ import annotations

import hashlib
import html
import io
import json
import re
from pathlib import Path

import httpx
import numpy as np
import pytest

from converters.tiny import TINY_MODEL_NAME
from infergate.processes import wait_until
from tests.gateway.console.conftest import (
    MAX_MODEL_BYTES,
    ConsoleStack,
    console_stack,
    csrf_of,
    signed_in,
)
from tests.gateway.lifecycle.conftest import TOKENS, infer_body

pytestmark = pytest.mark.integration
TINY = TINY_MODEL_NAME
HOSTILE = '<img src=x onerror="alert(1)">'


def _tree(repo: Path) -> dict[str, str]:
    return {str(p.relative_to(repo)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(repo.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def _serving(stack: ConsoleStack) -> int:
    answer = httpx.get(f"{stack.url}/v1/models/{TINY}",
                       headers={"authorization": f"Bearer {TOKENS['upload']}"})
    return int(answer.json()["serving_version"])


def test_signin_sets_a_strict_httponly_cookie_only_for_a_good_token(stack: ConsoleStack) -> None:
    with httpx.Client(base_url=stack.url, trust_env=False) as client:
        page = client.get("/ui/models")
        assert page.status_code == 303
        assert page.headers["location"] == "/ui/signin?next=%2Fui%2Fmodels"
        form = client.get("/ui/signin").text
        assert 'method="post"' in form and '<label for="token">Token</label>' in form

        wrong = client.post("/ui/signin", data={"token": "not-a-token-at-all"})
        assert wrong.status_code == 401 and "unknown API token" in wrong.text
        assert "set-cookie" not in wrong.headers
        predict = client.post("/ui/signin", data={"token": TOKENS["predict"]})
        assert predict.status_code == 403 and "predict scope only" in predict.text
        assert "set-cookie" not in predict.headers

        good = client.post("/ui/signin", data={"token": TOKENS["admin"],
                                               "next": "//evil.example/ui/x"})
        assert good.status_code == 303 and good.headers["location"] == "/ui/models"
        cookie = good.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/ui" in cookie
        assert "expires" not in cookie.lower() and "max-age" not in cookie.lower()
        assert TOKENS["admin"] not in cookie and TOKENS["admin"] not in good.headers["location"]
        models = client.get("/ui/models")
        assert models.status_code == 200 and TINY in models.text
        assert "frame-ancestors 'none'" in models.headers["content-security-policy"]


def test_signin_from_another_origin_or_oversized_is_refused(stack: ConsoleStack) -> None:
    answer = httpx.post(f"{stack.url}/ui/signin", data={"token": TOKENS["admin"]},
                        headers={"origin": "http://evil.example"})
    assert answer.status_code == 403 and "set-cookie" not in answer.headers
    big = httpx.post(f"{stack.url}/ui/signin",
                     data={"token": TOKENS["admin"], "next": "/ui/" + "x" * 70_000})
    assert big.status_code == 413 and "at most 65536 bytes" in big.text
    assert "set-cookie" not in big.headers


def test_admin_posts_need_the_session_csrf_token_and_this_origin(stack: ConsoleStack) -> None:
    serving = _serving(stack)
    with signed_in(stack.url, "admin") as admin:
        token = csrf_of(admin, f"/ui/models/{TINY}")
        no_token = admin.post(f"/ui/models/{TINY}/rollback", data={})
        stale = admin.post(f"/ui/models/{TINY}/rollback", data={"csrf": "x" * 43})
        foreign = admin.post(f"/ui/models/{TINY}/rollback", data={"csrf": token},
                             headers={"origin": "http://evil.example"})
        null = admin.post(f"/ui/models/{TINY}/rollback", data={"csrf": token},
                          headers={"origin": "null"})
    for answer in (no_token, stale):
        assert answer.status_code == 403 and "CSRF token" in answer.text
    for answer in (foreign, null):
        assert answer.status_code == 403 and "not from this console" in answer.text
    assert _serving(stack) == serving


def test_upload_scope_sees_no_admin_buttons_and_is_refused_when_it_posts(
    stack: ConsoleStack
) -> None:
    serving = _serving(stack)
    with signed_in(stack.url, "upload") as owner:
        page = owner.get(f"/ui/models/{TINY}").text
        token = csrf_of(owner, f"/ui/models/{TINY}")
        refused = [owner.post(path, data={"csrf": token}) for path in (
            f"/ui/models/{TINY}/rollback", f"/ui/models/{TINY}/versions/1/delete",
            f"/ui/models/{TINY}/rollout/abort")]
    assert "/rollback" not in page and "/delete" not in page and "Upload a new version" in page
    for answer in refused:
        assert answer.status_code == 403
        assert "token 'upload' lacks the 'admin' scope" in html.unescape(answer.text)
    assert _serving(stack) == serving


def _form(csrf: str, name: str, spec: str, model: bytes) -> dict[str, tuple[str | None, bytes]]:
    samples = io.BytesIO()
    np.savez(samples, x=np.zeros((4, 16), np.float32))
    return {"csrf": (None, csrf.encode()), "name": (None, name.encode()),
            "spec": (None, spec.encode()), "model": ("m.onnx", model),
            "evaluation": ("e.npz", samples.getvalue())}


def test_bad_uploads_through_the_form_show_the_api_error_and_keep_nothing(
    stack: ConsoleStack
) -> None:
    before = _tree(stack.repo)
    spec = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": ["batch", 16]}]})
    model = (stack.repo / TINY / "1" / "model.onnx").read_bytes()
    with signed_in(stack.url, "upload") as owner:
        token = csrf_of(owner, "/ui/upload")
        cases = {
            "oversized": owner.post("/ui/upload", files=_form(
                token, "big", spec, b"x" * (MAX_MODEL_BYTES + 1))),
            "spec not JSON": owner.post("/ui/upload", files=_form(token, "m", "{inputs: [",
                                                                  model)),
            "html name": owner.post("/ui/upload", files=_form(token, HOSTILE, spec, model)),
            "no csrf": owner.post("/ui/upload", files=_form("", "m", spec, model)),
            "int8 without data": owner.post("/ui/upload", files=_form(token, "m", json.dumps(
                {**json.loads(spec), "precisions": ["int8"],
                 "accuracy_budget": {"min_cosine": 0.99}}), model)),
        }
    expected = {"oversized": (413, "exceeds its limit"), "spec not JSON": (400, "not valid JSON"),
                "html name": (400, "invalid model name"), "no csrf": (403, "CSRF token"),
                "int8 without data": (400, "calibration")}
    for case, (status, message) in expected.items():
        answer = cases[case]
        assert answer.status_code == status, (case, answer.text[-800:])
        assert message in answer.text, (case, re.findall(r"class=\"error\"[^<]*", answer.text))
        assert 'enctype="multipart/form-data"' in answer.text  # the form again
    assert HOSTILE not in cases["html name"].text
    assert "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;" in cases["html name"].text
    assert _tree(stack.repo) == before
    assert not list((stack.log_dir / "state" / "jobs").glob("incoming-*"))


def test_html_in_a_model_name_is_escaped_on_every_page(stack: ConsoleStack) -> None:
    with signed_in(stack.url, "admin") as admin:
        shown = admin.get(f"/ui/models/{HOSTILE}")
        report = admin.get(f"/ui/models/{HOSTILE}/versions/1/files/latency.png")
        upload = admin.get("/ui/upload", params={"model": HOSTILE})
    for answer in (shown, report, upload):
        assert HOSTILE not in answer.text and "onerror=&#34;" in answer.text, answer.text[-500:]
    assert shown.status_code == 400 and "invalid model name" in shown.text


def test_models_page_shows_live_traffic_from_the_data_plane(stack: ConsoleStack) -> None:
    with httpx.Client(base_url=stack.url, trust_env=False) as client:
        for _ in range(40):
            assert client.post(f"/v2/models/{TINY}/infer", json=infer_body()).status_code == 200
    rate = re.compile(r'aria-label="tiny requests per second: req/s now ([0-9.]+)/s')
    with signed_in(stack.url, "upload") as owner:
        def counted() -> bool:
            found = rate.search(owner.get("/ui/models").text)
            return bool(found and float(found.group(1)) > 0)

        assert wait_until(counted, 20, 0.5), owner.get("/ui/models").text[-3000:]
        page = owner.get("/ui/models").text
    assert re.search(r"p99 now [0-9.]+ ms", page), page[-3000:]


def test_pools_page_shows_members_and_the_schedulers_plan(stack: ConsoleStack) -> None:
    with signed_in(stack.url, "upload") as owner:
        page = owner.get("/ui/pools").text
        svg = owner.get(f"/ui/placement/{stack.plan_id}.svg")
        missing = owner.get("/ui/placement/no-such-plan.svg")
    assert "Pool local" in page and "healthy" in page and stack.plan_id in page
    assert f'src="/ui/placement/{stack.plan_id}.svg"' in page
    assert svg.status_code == 200 and svg.headers["content-type"] == "image/svg+xml"
    assert svg.content.lstrip().startswith(b"<svg") or b"<svg" in svg.content[:200]
    assert "default-src 'none'" in svg.headers["content-security-policy"]
    assert missing.status_code == 502 and "answered 404" in missing.text
    anonymous = httpx.get(f"{stack.url}/ui/placement/{stack.plan_id}.svg")
    assert anonymous.status_code == 303


def test_pools_page_shows_each_tenants_rate_and_queue_wait_while_tenancy_is_on(
        stack: ConsoleStack) -> None:
    """Issue 36: the queue wait per tenant and class, in the console. Tenancy turned on
    live (``PUT /v1/tenants``), the tenant's requests counted from HAProxy's log; off
    again, the section goes."""
    admin = {"authorization": f"Bearer {TOKENS['admin']}"}
    predict = {"authorization": f"Bearer {TOKENS['predict']}"}
    tenancy = {"tenants": [{"name": "apps", "priority": "critical",
                            "keys": [TOKENS["predict"]]}]}
    row = re.compile(r"<tr><td>apps</td><td>critical</td><td>([0-9.]+)</td><td>\d+</td>\s*"
                     r"<td>([0-9.]+ ms|–)</td>")
    with signed_in(stack.url, "upload") as owner:
        assert "Tenants</h2>" not in owner.get("/ui/pools").text
        answer = httpx.put(f"{stack.url}/v1/tenants", json=tenancy, headers=admin, timeout=60)
        assert answer.status_code == 200, answer.text
        try:
            def counted() -> bool:
                for _ in range(5):
                    httpx.post(f"{stack.url}/v2/models/{TINY}/infer", json=infer_body(),
                               headers=predict, timeout=30).raise_for_status()
                found = row.search(owner.get("/ui/pools").text)
                return bool(found and float(found.group(1)) > 0)

            assert wait_until(counted, 60, 0.5), owner.get("/ui/pools").text[-3000:]
            page = owner.get("/ui/pools").text
        finally:
            assert httpx.delete(f"{stack.url}/v1/tenants", headers=admin,
                                timeout=60).status_code == 200
        off = owner.get("/ui/pools").text
    found = row.search(page)
    assert found and found.group(2).endswith(" ms"), page[-3000:]  # its admitted requests' wait
    assert "Tenants</h2>" in page and "Queue wait p99" in page
    assert "Tenants</h2>" not in off


def test_pages_show_no_residency_when_no_pool_has_a_memory_budget(stack: ConsoleStack) -> None:
    """Residency's parts (tests/gateway/console/test_residency.py) appear only with it:
    this gateway's pool loads every model on every member."""
    with signed_in(stack.url, "upload") as owner:
        models = owner.get("/ui/models").text
        pools = owner.get("/ui/pools").text
        model = owner.get(f"/ui/models/{TINY}").text
    assert TINY in models and "Held on" not in models and "held nowhere" not in models
    assert "Held on" not in model and "<dt>Pools</dt>" in model
    assert "Pool local" in pools and "(it serves <code>*</code>)." in pools
    assert "waiting for a model to load" not in pools and "Models by member" not in pools


def test_the_python_data_plane_feeds_the_same_pages(tmp_path: Path) -> None:
    """Parity: with the Python plane carrying inference, sign-in, the traffic figures
    (counted by the forwarder, not by HAProxy's log) and the form checks are the same."""
    with console_stack(tmp_path, data_plane="python") as python_stack:
        test_models_page_shows_live_traffic_from_the_data_plane(python_stack)
        test_admin_posts_need_the_session_csrf_token_and_this_origin(python_stack)
        test_upload_scope_sees_no_admin_buttons_and_is_refused_when_it_posts(python_stack)
