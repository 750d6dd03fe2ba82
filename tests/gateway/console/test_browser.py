"""The console in a real browser: Debian's chromium driven by Playwright, against a real
gateway (HAProxy in front), Triton and scheduler.

One owner's afternoon, in order: sign in (a wrong token first), upload the example model
through the form and watch its job reach serving, see the models list with live traffic,
open a report and see its plots load, roll a model back, and look at pools and the MIG
plan. Then an upload-scope token: no admin buttons, and a forged admin post refused.
Screenshots of each page are saved under ``results/console/`` (the test's artifacts).

The pools and models pages with residency (issue 34) are measured as drawn, against a
console in this process fed a residency report of the current shape: a bar's fill and
usable mark are fractions of the bar as a person sees it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from converters.tiny import TINY_MODEL_NAME
from gateway.auth import Principal, Scope, TokenTable
from gateway.config import GatewayConfig
from gateway.config.pools import MemberSpec, PoolSpec
from gateway.config.residency import ResidencySpec
from gateway.console.pages import Console, create_console_router
from gateway.console.session import COOKIE, Sessions
from gateway.console.traffic import TrafficHistory
from gateway.core import Core
from infergate.owner import example_upload
from infergate.processes import ROOT, wait_until
from infergate.triton.local import free_port
from tests.gateway.console.conftest import (
    GIB,
    MAX_MODEL_BYTES,
    MEMBER_A,
    MEMBER_B,
    ConsoleStack,
    console_stack,
    residency_report,
)
from tests.gateway.lifecycle.conftest import TOKENS, add_version, infer_body

pytestmark = pytest.mark.integration
playwright_api = pytest.importorskip("playwright.sync_api")
SHOTS = Path(os.environ.get("INFERGATE_ARTIFACTS", ROOT / "results")) / "console"
VIEWPORT = {"width": 1280, "height": 800}
HOSTILE = '<img src=x onerror="window.hacked=1">'


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("chromium is not installed: `make test` installs Debian's (system-deps)")
    return found


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleStack]:
    """The tiny model with two versions on disk (v2 serves): something to roll back."""
    tmp = tmp_path_factory.mktemp("console-browser")

    def two_versions(repo: Path) -> None:
        add_version(repo, TINY_MODEL_NAME, 2, 3.0)

    with console_stack(tmp, prepare=two_versions) as running:
        yield running


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with playwright_api.sync_playwright() as p:
        args = ["--no-sandbox"] if os.geteuid() == 0 else []  # root: no user namespaces
        launched = p.chromium.launch(executable_path=chromium(), args=args)
        try:
            yield launched
        finally:
            launched.close()


def shot(page: Any, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=name != "models")
    return path


def images_loaded(page: Any, selector: str) -> list[int]:
    """The natural width of each image matching ``selector`` (0: not loaded)."""
    return page.eval_on_selector_all(
        selector, "imgs => imgs.map(i => i.complete ? i.naturalWidth : 0)")


def sign_in(page: Any, url: str, token: str) -> None:
    """By keyboard, as a person would: the token field takes the focus (autofocus,
    which the browser applies once the page has loaded: waited for, not assumed)."""
    page.goto(f"{url}/ui/models")
    assert "/ui/signin" in page.url
    page.wait_for_function("() => document.activeElement?.id === 'token'", timeout=10_000)
    page.keyboard.type(token)
    page.keyboard.press("Enter")
    page.wait_for_url("**/ui/models")


class Traffic:
    """Requests to a model from a thread until stopped (the models page's sparklines)."""

    def __init__(self, url: str, model: str) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(url, model), daemon=True)
        self._thread.start()

    def _run(self, url: str, model: str) -> None:
        with httpx.Client(base_url=url, trust_env=False, timeout=30) as client:
            while not self._stop.is_set():
                client.post(f"/v2/models/{model}/infer", json=infer_body())
                self._stop.wait(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def test_an_owner_uploads_watches_reads_the_report_and_rolls_back(
    stack: ConsoleStack, browser: Any, tmp_path: Path
) -> None:
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    dialogs: list[str] = []

    def dialog(opened: Any) -> None:  # an alert() would be a script of ours running
        dialogs.append(opened.message)
        opened.dismiss()

    page.on("dialog", dialog)

    # a wrong token: a clear message, no cookie
    page.goto(f"{stack.url}/ui/signin")
    page.get_by_label("Token").fill("not-a-token-0123456789")
    with page.expect_navigation():  # a form post: the answer is a new page
        page.get_by_role("button", name="Sign in").click()
    assert "unknown API token" in page.locator("#signin-error").inner_text()
    assert context.cookies() == []
    sign_in(page, stack.url, TOKENS["admin"])
    cookie = next(c for c in context.cookies() if c["name"] == "infergate_console")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"

    # upload the example model through the form; the job page follows it to serving
    example = example_upload(tmp_path / "example")
    page.get_by_role("link", name="Upload").click()
    page.get_by_label("Model name").fill("example")
    page.get_by_label("Model file").set_input_files(str(example.model))
    page.get_by_label("Spec (JSON)").fill(example.spec.read_text())
    page.get_by_label("Evaluation samples (optional)").set_input_files(str(example.evaluation))
    page.get_by_role("button", name="Upload").click()
    page.wait_for_url("**/ui/jobs/job-*")
    page.wait_for_function(
        "() => document.querySelector('#job-state')?.textContent.trim() === 'succeeded'"
        " || document.querySelector('#job-state')?.textContent.trim() === 'failed'",
        timeout=240_000)
    assert page.locator("#job-state").inner_text() == "succeeded", page.inner_text("#job")
    assert page.locator("#model-state").inner_text() == "serving"
    shot(page, "job")

    # the models list, with the traffic of the last minutes
    traffic = Traffic(stack.url, "example")
    try:
        page.goto(f"{stack.url}/ui/models")
        page.wait_for_function(  # console.js refreshes the table every 5 s
            "() => /example requests per second: req\\/s now [1-9]/.test("
            "document.querySelector('#models').innerHTML)", timeout=30_000)
    finally:
        traffic.stop()
    row = page.get_by_role("row").filter(has_text="example")
    assert "serving" in row.inner_text() and "fp32" in row.inner_text()
    shot(page, "models")

    # the report: the variants table and both plots, loaded
    page.get_by_role("link", name="example", exact=True).click()
    page.wait_for_url("**/ui/models/example")
    report = page.locator("section.report")
    assert "Variants" in report.inner_text() and "chosen" in report.inner_text()
    page.wait_for_function("() => [...document.querySelectorAll('section.report img')]"
                           ".every(i => i.complete && i.naturalWidth > 0)", timeout=20_000)
    assert len(images_loaded(page, "section.report img")) == 2
    shot(page, "model-report")

    # roll the tiny model back from v2 to v1
    page.goto(f"{stack.url}/ui/models/{TINY_MODEL_NAME}")
    with page.expect_navigation():  # back to this same address once it has rolled back
        page.get_by_role("button", name="Serve v1").click()
    page.wait_for_url(f"**/ui/models/{TINY_MODEL_NAME}")
    facts = page.locator("dl.facts").inner_text()
    assert "v1" in facts.split("Serving", 1)[1].split("Previous", 1)[0], facts
    answer = httpx.post(f"{stack.url}/v2/models/{TINY_MODEL_NAME}/infer", json=infer_body())
    assert answer.json()["outputs"][0]["data"][0] == 3.0  # v1: 2x + 1 at x = 1

    # pools and the scheduler's plan, as a picture
    page.get_by_role("link", name="Pools & placement").click()
    page.wait_for_function("() => { const i = document.querySelector('#plan-picture');"
                           " return i && i.complete && i.naturalWidth > 0; }", timeout=20_000)
    assert stack.plan_id in page.inner_text("main")
    shot(page, "placement")

    # a name with HTML in it comes back as text, and nothing runs
    page.goto(f"{stack.url}/ui/upload")
    page.get_by_label("Model name").fill(HOSTILE)
    page.get_by_label("Model file").set_input_files(str(example.model))
    with page.expect_navigation():
        page.get_by_role("button", name="Upload").click()
    error = page.locator("#upload-error")
    assert "invalid model name" in error.inner_text() and HOSTILE in error.inner_text()
    assert page.evaluate("() => window.hacked") is None and dialogs == []

    # an oversized model: the browser gets the API's 413 message on the page
    page.get_by_label("Model name").fill("big")
    page.get_by_label("Model file").set_input_files(
        {"name": "big.onnx", "mimeType": "application/octet-stream",
         "buffer": b"x" * (MAX_MODEL_BYTES * 3)})
    with page.expect_navigation():  # the last page had an error too: wait for the new one
        page.get_by_role("button", name="Upload").click()
    assert "exceeds its limit" in page.locator("#upload-error").inner_text()
    context.close()


def test_an_upload_token_sees_no_admin_buttons_and_its_forged_post_is_refused(
    stack: ConsoleStack, browser: Any
) -> None:
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    sign_in(page, stack.url, TOKENS["upload"])
    page.goto(f"{stack.url}/ui/models/{TINY_MODEL_NAME}")
    buttons = page.get_by_role("button").all_inner_texts()
    assert buttons == ["Sign out"], buttons
    # the model's state and versions (its live traffic figures below them may move)
    serving = page.locator("dl.facts").inner_text().split("Requests/s")[0]
    # what a crafted form would do: the session's own CSRF token, the admin route
    status, text = page.evaluate("""async (model) => {
        const form = new FormData();
        form.append('csrf', document.querySelector('input[name=csrf]').value);
        const answer = await fetch('/ui/models/' + model + '/rollback',
                                   {method: 'POST', body: new URLSearchParams(form)});
        return [answer.status, await answer.text()];
    }""", TINY_MODEL_NAME)
    assert status == 403 and "lacks the &#39;admin&#39; scope" in text
    page.reload()
    assert page.locator("dl.facts").inner_text().split("Requests/s")[0] == serving
    shot(page, "upload-scope-model")
    context.close()


# -- residency (issue 34): a console in this process, fed a report ---------------------------
class _Reported:
    """Stands for the residency: the pages ask only for its report."""

    def __init__(self, report: dict[str, Any]) -> None:
        self.answer = report

    def report(self) -> dict[str, Any]:
        return self.answer


@contextlib.contextmanager
def residency_console(report: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """A console over pool ``cpu`` (two members, a memory budget) whose residency
    reports ``report``, served by uvicorn on a thread: its address and a session id."""
    def member(host: str) -> MemberSpec:
        return MemberSpec(host=host, http_port=8000, grpc_port=8001, metrics_port=8002)

    core = Core.for_config(GatewayConfig(pools=(PoolSpec(
        name="cpu", members=(member("10.0.0.1"), member("10.0.0.2")),
        residency=ResidencySpec(memory_budget_bytes=4 * GIB, headroom_bytes=GIB // 2)),)))
    sessions = Sessions()
    app = FastAPI()
    app.include_router(create_console_router(Console(
        core, TokenTable(), TrafficHistory(core.metrics.registry), sessions,
        residency=_Reported(report))))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        assert wait_until(lambda: server.started, 30, 0.02), "the console did not start"
        session = sessions.open(Principal("owner", frozenset({Scope.UPLOAD})))
        yield f"http://127.0.0.1:{port}", session.id
    finally:
        server.should_exit = True
        thread.join(30)


def bar_geometry(page: Any, member: str) -> dict[str, float]:
    """Where the member's memory bar's parts are drawn, as fractions of the bar's width
    on the screen (the whole picture, its frame included)."""
    svg = page.locator(f'.membar svg[aria-label^="memory of {member}:"]')
    whole, used = svg.bounding_box(), svg.locator(".used").bounding_box()
    mark, frame = svg.locator(".usable").bounding_box(), svg.locator(".frame").bounding_box()
    return {"fill": used["width"] / whole["width"],
            "fill_start": (used["x"] - whole["x"]) / whole["width"],
            "mark": (mark["x"] + mark["width"] / 2 - whole["x"]) / whole["width"],
            "frame": frame["width"] / whole["width"]}


def test_pools_page_draws_bar_fill_and_usable_mark_exactly_when_a_member_is_98_percent_full(
    browser: Any
) -> None:
    report = residency_report(used_a=int(0.98 * 4 * GIB))
    with residency_console(report) as (url, session):
        context = browser.new_context(viewport=VIEWPORT)
        context.add_cookies([{"name": COOKIE, "value": session, "url": f"{url}/ui"}])
        page = context.new_page()
        page.goto(f"{url}/ui/pools")
        full, half = bar_geometry(page, MEMBER_A), bar_geometry(page, MEMBER_B)
        on_a = page.get_by_role("table", name=f"models on {MEMBER_A}").inner_text()
        on_b = page.get_by_role("table", name=f"models on {MEMBER_B}").inner_text()
        pool = page.locator("section").filter(has_text="Pool cpu").first.inner_text()
        shot(page, "pools-residency")
        page.goto(f"{url}/ui/models")
        cold = page.get_by_role("row").filter(has_text="cold").inner_text()
        hot = page.get_by_role("row").filter(has_text="hot").inner_text()
        context.close()
    # a CSS border around the picture once drew this bar 84 % full, the mark at 82 %
    assert full["fill"] == pytest.approx(0.98, abs=0.01), full
    assert full["fill_start"] == pytest.approx(0.0, abs=0.005), full
    assert half["fill"] == pytest.approx(3.25 / 4, abs=0.01), half
    for bar in (full, half):
        assert bar["mark"] == pytest.approx(3.5 / 4, abs=0.01), bar  # usable / budget
        assert bar["frame"] == pytest.approx(1.0, abs=0.01), bar
    assert "8 waiting for a model to load" in pool
    assert "Models: bad, cold, gone, hot, next, old, warm." in pool
    assert [line.split("\t")[:2] for line in on_a.splitlines()[1:]] == [
        ["hot", "resident"], ["warm", "loading"], ["next", "queued"]]
    assert [line.split("\t")[:2] for line in on_b.splitlines()[1:]] == [
        ["hot", "warming"], ["old", "draining"], ["gone", "unloading"], ["bad", "failed"]]
    assert "out of memory: CUDA error" in on_b
    assert on_a.splitlines()[3].split("\t")[-1] == "5"  # requests waiting for next's load
    assert "held nowhere (loads on its next request)" in cold
    assert f"resident on {MEMBER_A}" in hot and f"warming on {MEMBER_B}" in hot


def test_pools_page_lists_the_models_waiting_for_room_in_order_with_the_urgent_marked(
    browser: Any
) -> None:
    report = residency_report(room=[
        {"model": "cold", "waiting": 2, "for_s": 11.4, "urgent": True},
        {"model": "next2", "waiting": 1, "for_s": 0.3, "urgent": False}])
    with residency_console(report) as (url, session):
        context = browser.new_context(viewport=VIEWPORT)
        context.add_cookies([{"name": COOKIE, "value": session, "url": f"{url}/ui"}])
        page = context.new_page()
        page.goto(f"{url}/ui/pools")
        room = page.get_by_role("list", name="Waiting for room")
        items = room.get_by_role("listitem").all_inner_texts()
        urgent = room.locator(".state-failed").all_inner_texts()
        room.scroll_into_view_if_needed()
        shot(page, "pools-room")
        context.close()
    assert [i.split(":")[0] for i in items] == ["cold", "next2"]
    assert "2 requests, for 11 s" in items[0] and "urgent" in items[0]
    assert "1 request, for 0 s" in items[1] and "urgent" not in items[1]
    assert urgent == ["urgent"]
