"""The console's routes: ``/ui`` pages rendered on the server from the gateway's own
state, behind the API's tokens and scopes.

| page | scope | what it shows |
|---|---|---|
| ``/ui/signin`` | none | a token field; a session cookie once the token is good |
| ``/ui/models`` | upload | every model: versions, state, precision, accuracy, pools, traffic; |
| | | with residency, where each is held (resident, its other holdings' states) or nowhere |
| ``/ui/models/{name}`` | upload | versions, a report, rollout, jobs, where it is held; admin: |
| | | rollback, delete |
| ``/ui/upload`` | upload | the upload form; ``/ui/jobs/{id}`` then follows the job live |
| ``/ui/pools`` | upload | members with health, queue and saturation; with residency, the |
| | | models each member holds (state, for how long, why, requests waiting for the load), |
| | | its memory against its budget, the requests waiting for loads and the models |
| | | waiting for room, in the order room goes to them; the MIG plan |

Pages read the same objects the API reads (the lifecycle's catalog and job store, the
gateway's state and telemetry, the traffic history) and act through the same calls
(:class:`~gateway.lifecycle.service.ModelLifecycle`), so the console can do nothing the
API would refuse, and refuses it with the API's own message. Forms work without
JavaScript; ``static/console.js`` only refreshes the live parts of a page.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

from fastapi import APIRouter, Request, Response
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse
from fastapi.routing import APIRoute
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup

from gateway.auth import Scope, TokenTable
from gateway.console.charts import BLUE, ORANGE, Series, memory_bar, size_text, sparkline
from gateway.console.placement import PlacementUnavailable, SchedulerPlans
from gateway.console.report import report_file, report_html
from gateway.console.session import COOKIE, Session, Sessions, check_form, check_origin
from gateway.console.traffic import TenantWindow, TrafficHistory
from gateway.core import Core
from gateway.errors import (
    Forbidden,
    GatewayError,
    InvalidInput,
    PayloadTooLarge,
    Unsupported,
    http_status,
)
from gateway.lifecycle.records.jobs import TERMINAL_JOB_STATES, JobRecord
from gateway.lifecycle.service import ModelLifecycle
from gateway.policy import access

HERE = Path(__file__).parent
STATIC_FILES = {"console.css": "text/css", "console.js": "text/javascript"}
FORM_FIELDS = ("csrf", "name")  # the upload form's fields beside the API's parts
FORM_LIMIT_BYTES = 64 * 1024  # any other form: sign-in, rollback, delete, rollout
# what the page may load and where its forms may go: this console only
SECURITY_HEADERS = {
    "content-security-policy": "default-src 'none'; img-src 'self'; style-src 'self'; "
                               "script-src 'self'; connect-src 'self'; form-action 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}
EXAMPLE_SPEC = """{
  "inputs": [{"name": "x", "datatype": "FP32", "shape": ["batch", 16]}],
  "precisions": ["fp32"]
}"""


class ResidencyReport(Protocol):
    """What the pools page reads of the residency (:class:`gateway.residency.manager.
    Residency`): the report ``GET /v1/residency`` serves."""

    def report(self) -> dict[str, Any]: ...


class SignInFirst(Exception):
    """No session: the page sends the browser to the sign-in page."""


@dataclass(frozen=True)
class Console:
    """What the pages read, built in ``serve``."""

    core: Core
    auth: TokenTable
    history: TrafficHistory
    sessions: Sessions
    lifecycle: ModelLifecycle | None = None
    plans: SchedulerPlans | None = None
    residency: ResidencyReport | None = None  # pools with a memory budget per member
    tenants: TenantWindow | None = None  # each tenant's rate and queue wait, recently

    async def model_names(self, residency: Mapping[str, Any] | None = None) -> list[str]:
        """Every model the lifecycle manages or finds in its repository (adopted then,
        as ``GET /v1/models/{name}`` does), then any other the gateway has word of,
        those the residency (its report: ``residency``) may hold included: a model of
        a ``*`` pool held nowhere and never asked for is known to it alone."""
        served = sorted(set(self.core.state.known_models())
                        | set((residency or {}).get("models", {})))
        if self.lifecycle is None:
            return served
        catalog = self.lifecycle.catalog
        managed = set(catalog.model_names())
        for name in catalog.repository_models():
            if name not in managed:
                with contextlib.suppress(GatewayError):
                    await catalog.known(name)
        managed = set(catalog.model_names())
        return sorted(managed) + [n for n in served if n not in managed]

    def managed(self) -> ModelLifecycle:
        if self.lifecycle is None:
            raise Unsupported("model uploads are not enabled on this gateway (add a "
                              "'lifecycle:' section with the model repository to its config)")
        return self.lifecycle


def _templates() -> Environment:
    env = Environment(loader=FileSystemLoader(HERE / "templates"),
                      autoescape=select_autoescape(default=True, default_for_string=True))
    env.filters["when"] = lambda t: time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) \
        if t else "–"
    env.filters["seconds"] = lambda s: "–" if s is None else f"{s:.1f} s"
    env.filters["url"] = lambda s: quote(str(s), safe="")
    env.filters["bytes"] = lambda n: "–" if n is None else size_text(n)
    env.filters["duration"] = lambda s: duration_text(s)  # defined below
    return env


TEMPLATES = _templates()


def render(template: str, status: int = 200, **context: Any) -> HTMLResponse:
    html = TEMPLATES.get_template(template).render(**context)
    return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)


class ConsoleRoute(APIRoute):
    """Console routes answer in HTML: a gateway error becomes a page with the API's own
    message and status; a missing session, the sign-in page."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except SignInFirst:
                target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                return RedirectResponse(f"/ui/signin?next={quote(target, safe='')}", 303)
            except GatewayError as error:
                return render("error.html", http_status(error), message=error.message,
                              session=None)

        return route


def safe_next(target: str | None) -> str:
    """Where to go after sign-in: a console path, never another site."""
    if target and target.startswith("/ui/") and not target.startswith("//") \
            and "\\" not in target:
        return target
    return "/ui/models"


def create_console_router(console: Console) -> APIRouter:
    router = APIRouter(prefix="/ui", route_class=ConsoleRoute, include_in_schema=False)
    sessions, auth = console.sessions, console.auth

    def session_of(request: Request, scope: Scope = Scope.UPLOAD) -> Session:
        session = sessions.find(request.cookies.get(COOKIE))
        if session is None:
            raise SignInFirst()
        if not session.principal.allows(scope):
            raise Forbidden(access.LACKS_SCOPE.format(name=session.principal.name,
                                                      scope=scope.value))
        return session

    async def form_of(request: Request, scope: Scope) -> tuple[Session, Mapping[str, Any]]:
        session = session_of(request, scope)
        form = await small_form(request, max_fields=16)
        check_form(session, _text(form.get("csrf")), request.headers.get("origin"),
                   request.headers.get("host"))
        return session, form

    def page(template: str, session: Session, status: int = 200, **context: Any) -> HTMLResponse:
        return render(template, status, session=session, **context)

    @router.get("", include_in_schema=False)
    @router.get("/", include_in_schema=False)
    async def home() -> Response:
        return RedirectResponse("/ui/models", 303)

    # -- signing in and out -------------------------------------------------------------
    @router.get("/signin")
    async def signin_page(next: str | None = None) -> HTMLResponse:
        return render("signin.html", session=None, next=safe_next(next),
                      auth_enabled=auth.enabled)

    @router.post("/signin")
    async def signin(request: Request) -> Response:
        form = await small_form(request, max_fields=4)
        target = safe_next(_text(form.get("next")))
        check_origin(request.headers.get("origin"), request.headers.get("host"))
        try:
            principal = auth.authenticate(_text(form.get("token")).strip() or None)
            if not principal.allows(Scope.UPLOAD):
                raise Forbidden(f"token {principal.name!r} has the predict scope only: the "
                                "console needs an upload or admin token")
        except GatewayError as error:
            return render("signin.html", http_status(error), session=None, next=target,
                          auth_enabled=auth.enabled, error=error.message)
        session = sessions.open(principal)
        answer = RedirectResponse(target, 303)
        # a browser-session cookie: the server ends the session after idle_s unused
        answer.set_cookie(COOKIE, session.id, path="/ui", httponly=True, samesite="strict",
                          secure=request.url.scheme == "https")
        return answer

    @router.post("/signout")
    async def signout(request: Request) -> Response:
        session, _ = await form_of(request, Scope.UPLOAD)
        sessions.close(session.id)
        answer = RedirectResponse("/ui/signin", 303)
        answer.delete_cookie(COOKIE, path="/ui")
        return answer

    # -- models ---------------------------------------------------------------------------
    @router.get("/models")
    async def models(request: Request) -> HTMLResponse:
        session = session_of(request)
        report = console.residency.report() if console.residency is not None else None
        names = await console.model_names(report)
        rows = [model_row(console, name, report) for name in names]
        return page("models.html", session, rows=rows, uploads=console.lifecycle is not None,
                    residency=report is not None,
                    window_s=console.history.interval_s * console.history.keep)

    @router.get("/models/{name}")
    async def model(request: Request, name: str, version: int | None = None) -> HTMLResponse:
        session = session_of(request)
        catalog = console.managed().catalog
        record = await catalog.known(name)
        versions = sorted(catalog.versions(record.name), key=lambda v: -v.version)
        live = [v for v in versions if v.live]
        shown = version or record.serving_version or (live[0].version if live else None)
        report = None
        if shown is not None and any(v.version == shown and v.report and v.live
                                     for v in versions):
            path = catalog.report_path(record.name, shown)
            url = f"/ui/models/{quote(record.name, safe='')}/versions/{shown}/files/{{file}}"
            report = Markup(report_html(path.read_text(errors="replace"), url)) \
                if path.suffix == ".md" else None
        rollout = catalog.store.rollout(record.name)
        jobs = catalog.store.jobs(record.name, limit=20)
        return page("model.html", session, model=record, versions=versions, shown=shown,
                    report=report, rollout=rollout, jobs=jobs,
                    row=model_row(console, name, console.residency.report()
                                  if console.residency is not None else None),
                    busy=any(j.state not in TERMINAL_JOB_STATES for j in jobs)
                    or bool(rollout and rollout.active))

    @router.get("/models/{name}/versions/{version}/files/{file}")
    async def version_file(request: Request, name: str, version: int, file: str) -> Response:
        session_of(request)
        catalog = console.managed().catalog
        found = report_file(catalog.report_path(name, version), file)
        if found is None:
            return render("error.html", 404, session=None,
                          message=f"no report file {file!r} for {name!r} version {version}")
        return FileResponse(found, headers={"cache-control": "private, max-age=300",
                                            "x-content-type-options": "nosniff"})

    @router.post("/models/{name}/rollback")
    async def rollback(request: Request, name: str) -> Response:
        _, form = await form_of(request, Scope.ADMIN)
        version = _text(form.get("version"))
        if version and not version.isdigit():
            raise InvalidInput(f"version {version!r} is not a number")
        model = await console.managed().rollback(name, int(version) if version else None)
        return RedirectResponse(f"/ui/models/{quote(model, safe='')}", 303)

    @router.post("/models/{name}/versions/{version}/delete")
    async def delete_version(request: Request, name: str, version: int) -> Response:
        await form_of(request, Scope.ADMIN)
        model = await console.managed().delete_version(name, version)
        return RedirectResponse(f"/ui/models/{quote(model, safe='')}", 303)

    @router.post("/models/{name}/rollout/{action}")
    async def rollout_action(request: Request, name: str, action: str) -> Response:
        session, _ = await form_of(request, Scope.ADMIN)
        if action not in ("pause", "resume", "abort"):
            raise InvalidInput(f"unknown rollout action {action!r} (pause, resume, abort)")
        await console.managed().rollout(name, action, session.principal.name)
        return RedirectResponse(f"/ui/models/{quote(name, safe='')}", 303)

    # -- uploads and jobs -----------------------------------------------------------------
    @router.get("/upload")
    async def upload_page(request: Request, model: str | None = None) -> HTMLResponse:
        session = session_of(request)
        console.managed()
        return page("upload.html", session, name=model or "", spec=EXAMPLE_SPEC)

    @router.post("/upload")
    async def upload(request: Request) -> Response:
        session = session_of(request)
        lifecycle = console.managed()
        seen: dict[str, str] = {}

        def check(fields: dict[str, str]) -> str:
            seen.update(fields)
            check_form(session, fields.get("csrf"), request.headers.get("origin"),
                       request.headers.get("host"))
            if not fields.get("name", "").strip():
                raise InvalidInput("give the model a name")
            return fields["name"].strip()

        length = request.headers.get("content-length")
        body = _Body(request)
        try:
            job = await lifecycle.jobs.submit_form(
                body.chunks(), request.headers.get("content-type"),
                int(length) if length and length.isdigit() else None, session.principal,
                FORM_FIELDS, check)
        except GatewayError as error:
            await body.drain()
            return page("upload.html", session, http_status(error), name=seen.get("name", ""),
                        spec=EXAMPLE_SPEC, error=error.message)
        return RedirectResponse(f"/ui/jobs/{job.id}", 303)

    @router.get("/jobs/{job_id}")
    async def job(request: Request, job_id: str) -> HTMLResponse:
        session = session_of(request)
        lifecycle = console.managed()
        record = lifecycle.jobs.job(job_id)
        model = lifecycle.catalog.store.model(record.model)
        return page("job.html", session, job=record, model=model, steps=job_steps(record),
                    active=record.state not in TERMINAL_JOB_STATES)

    # -- pools and placement ----------------------------------------------------------------
    @router.get("/pools")
    async def pools(request: Request) -> HTMLResponse:
        session = session_of(request)
        await console.core.refresh_gauges()
        plan, problem = None, None
        if console.plans is not None:
            try:
                plan = await console.plans.latest()
            except PlacementUnavailable as exc:
                problem = str(exc)
        report = console.residency.report() if console.residency is not None else None
        return page("pools.html", session, pools=pool_rows(console.core, report), plan=plan,
                    problem=problem, scheduler=console.plans.url if console.plans else None,
                    tenants=tenant_rows(console))

    @router.get("/placement/{plan_id}.svg")
    async def plan_svg(request: Request, plan_id: str) -> Response:
        session_of(request)
        if console.plans is None:
            raise Unsupported("no scheduler is configured for this console")
        try:
            svg = await console.plans.svg(plan_id)
        except PlacementUnavailable as exc:
            return render("error.html", 502, session=None, message=str(exc))
        # shown in <img> (no script runs there); opened on its own, still no script
        return Response(svg, media_type="image/svg+xml", headers={
            "content-security-policy": "default-src 'none'; style-src 'unsafe-inline'",
            "x-content-type-options": "nosniff", "cache-control": "private, max-age=60"})

    @router.get("/static/{file}")
    async def static(file: str) -> Response:
        media = STATIC_FILES.get(file)
        if media is None:
            return Response(status_code=404)
        return FileResponse(HERE / "static" / file, media_type=media,
                            headers={"cache-control": "max-age=300"})

    return router


# -- what the pages show ----------------------------------------------------------------------
def model_row(console: Console, name: str,
              residency: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One model on the models page: the catalog's record (when uploads are on), the
    rollout, the last minutes of traffic and, in a pool with residency (``residency``:
    the residency's report), where it is held."""
    points, slots = console.history.points(name), console.history.keep
    traffic = {
        "rate": Markup(sparkline([Series("req/s", [p.rate for p in points])],
                                 f"{name} requests per second", "/s", slots=slots)),
        "latency": Markup(sparkline(
            [Series("p50", [p.p50_s for p in points], BLUE),
             Series("p99", [p.p99_s for p in points], ORANGE)],
            f"{name} latency", " ms", scale=1000.0, slots=slots)),
        "residency": model_residency(residency, name),
    }
    if console.lifecycle is None or name not in console.lifecycle.catalog.model_names():
        return {"name": name, "managed": False, **traffic}
    catalog = console.lifecycle.catalog
    record = catalog.record(name)
    versions = {v.version: v for v in catalog.versions(name, live=True)}
    serving = versions.get(record.serving_version or -1)
    rollout = catalog.store.rollout(name)
    return {
        "name": name, "managed": True, "state": record.state, "detail": record.detail,
        "serving": record.serving_version, "previous": record.previous_version,
        "versions": sorted(versions, reverse=True), "pools": record.pools,
        "precision": serving.precision if serving else None,
        "accuracy": accuracy_text(serving.metadata if serving else {}),
        "loading": catalog.loading(name),
        "rollout": rollout if rollout is not None and rollout.active else None,
        **traffic,
    }


def accuracy_text(metadata: Mapping[str, Any]) -> str:
    """The served variant's accuracy against its source, as the report measured it."""
    accuracy = metadata.get("accuracy") or {}
    parts = []
    if accuracy.get("top1_drop") is not None:
        parts.append(f"top-1 drop {accuracy['top1_drop']:.2%}")
    if accuracy.get("cosine") is not None:
        parts.append(f"cosine {accuracy['cosine']:.5f}")
    if accuracy.get("samples"):
        synthetic = metadata.get("evaluation") == "synthetic"
        parts.append(f"{accuracy['samples']} {'synthetic inputs' if synthetic else 'samples'}")
    return ", ".join(parts) or "–"


def job_steps(job: JobRecord) -> list[dict[str, Any]]:
    now = time.time()
    return [{"name": s.name, "state": s.state, "detail": s.detail, "fraction": s.fraction,
             "seconds": (s.finished_at or now) - s.started_at} for s in job.steps]


def duration_text(seconds: float | None) -> str:
    """How long, in the largest unit that keeps it readable: 42 s, 3 min 5 s, 2 h 4 min."""
    if seconds is None:
        return "–"
    whole = int(max(seconds, 0))
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} min"


# a holding's states, in the order a member's table lists them ("evicting": the old name)
HOLDING_ORDER = {state: rank for rank, state in enumerate((
    "resident", "warming", "loading", "queued", "draining", "unloading", "evicting", "failed"))}


def _by_state(held: dict[str, Any]) -> tuple[int, str]:
    return HOLDING_ORDER.get(held.get("state", ""), len(HOLDING_ORDER)), str(held.get("model"))


def residency_rows(report: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """pool -> what its members hold (``GET /v1/residency``'s pools): each member's models
    (state, for how long, why, footprint, requests waiting for the load), its loads at
    once and its memory as a bar, used against usable (the budget less the headroom)
    against the budget; the requests waiting for loads in the pool, and the misses no
    member has room for yet in the order room goes to them; and the models the
    residency knows in it (a pool serving ``*`` names none in its configuration)."""
    if not report:
        return {}
    entries: Mapping[str, Mapping[str, Any]] = report.get("models", {})
    rows = {}
    for pool in report.get("pools", []):
        name = pool["name"]
        known = sorted(m for m, entry in entries.items() if entry.get("pool") == name)
        waiting = pool.get("waiting")
        if waiting is None:  # a report before pools had "waiting": its models' own
            waiting = sum(int(entries[m].get("waiting") or 0) for m in known)
        rows[name] = {"budget": pool.get("budget_bytes"),
                      "headroom": pool.get("headroom_bytes", 0),
                      "timings": report.get("timings") or {},
                      "waiting": int(waiting), "models": known,
                      "room": [{**f, "waiting": int(f.get("waiting") or 0)}
                               for f in pool.get("waiting_for_room", [])],
                      "members": [_member_row(pool, m) for m in pool.get("members", [])]}
    return rows


def _member_row(pool: Mapping[str, Any], member: Mapping[str, Any]) -> dict[str, Any]:
    budget = int(member.get("budget_bytes") or pool.get("budget_bytes") or 0)
    usable = int(member.get("usable_bytes") or budget)
    used = int(member.get("used_bytes") or 0)
    held = [{**h, "waiting": int(h.get("waiting") or 0)} for h in member.get("models", [])]
    return {"key": member["key"], "available": member.get("available", True),
            "load_slots": member.get("load_slots"),
            "used": used, "usable": usable, "budget": budget, "over": used > usable,
            "margin": int(member.get("margin_bytes") or 0),
            "bar": Markup(memory_bar(used, usable, budget, f"memory of {member['key']}")),
            "models": sorted(held, key=_by_state)}


def model_residency(report: Mapping[str, Any] | None, name: str) -> dict[str, Any] | None:
    """Where a model of a pool with residency is held (None: it is in no such pool): the
    members where it is resident, its other holdings (state, for how long, why, requests
    waiting for the load) and the requests waiting for it. A report without a model's
    ``holdings`` has them in its pools' members."""
    entry = report.get("models", {}).get(name) if report else None
    if report is None or entry is None:
        return None
    held = entry.get("holdings")
    if held is None:
        held = [{"member": member["key"], **h} for pool in report.get("pools", [])
                for member in pool.get("members", []) for h in member.get("models", [])
                if h.get("model") == name]
    ordered = sorted(({**h, "model": name, "waiting": int(h.get("waiting") or 0)}
                      for h in held), key=lambda h: (_by_state(h), h["member"]))
    return {"pool": entry.get("pool"), "waiting": int(entry.get("waiting") or 0),
            "load_s": entry.get("load_s"),
            "resident": [h["member"] for h in ordered if h.get("state") == "resident"],
            "others": [h for h in ordered if h.get("state") != "resident"]}


def pool_rows(core: Core, residency: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Each pool with its members as the probes and the data plane see them now; with
    ``residency`` (the residency's report), what each member of a pool with a memory
    budget holds, and the models it knows there beside those assigned."""
    rows, now = [], core.clock()
    resident = residency_rows(residency)
    assigned = core.state.assignments()
    for pool in core.state.pools:
        members = [{"key": m.key, "healthy": m.healthy, "restoring": m.restoring,
                    "ejected": not m.available(now) and m.healthy and not m.restoring,
                    "in_flight": m.in_flight + m.external_in_flight, "queue": m.upstream_queue,
                    "version": m.triton_version or "unknown"} for m in pool.members]
        load = sum(m.in_flight + m.external_in_flight + m.upstream_queue for m in pool.members)
        held = resident.get(pool.name)
        models = {model for model, pools in assigned.items() if pool.name in pools}
        rows.append({"name": pool.name, "capacity": pool.capacity, "load": load,
                     "saturation": load / pool.capacity if pool.capacity else 0.0,
                     "members": members, "residency": held,
                     "models": sorted(models | set(held["models"] if held else ())),
                     # '*' without residency: any model its members have, named or not;
                     # with residency the report names every one it may hold
                     "any": "*" in pool.spec.models and held is None})
    return rows


async def small_form(request: Request, max_fields: int) -> Mapping[str, Any]:
    """A form of a few fields (not the upload's), parsed once its declared length is
    known to be small: form bodies are read whole into memory."""
    length = request.headers.get("content-length", "")
    if not length.isdigit() or int(length) > FORM_LIMIT_BYTES:
        raise PayloadTooLarge(f"a console form is at most {FORM_LIMIT_BYTES} bytes, with "
                              "a Content-Length")
    return await request.form(max_files=0, max_fields=max_fields)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


class _Body:
    """A request body read as it arrives, and what is left of it read and dropped when
    the upload is refused early (up to ``DRAIN_LIMIT``): the browser, still sending,
    then gets to read the page that says why instead of a reset connection."""

    DRAIN_LIMIT = 64 * 1024 * 1024

    def __init__(self, request: Request) -> None:
        self._request, self._ended = request, False

    async def chunks(self) -> AsyncIterator[bytes]:
        while not self._ended:
            body = await self._next()
            if body:
                yield body

    async def _next(self) -> bytes:
        message = await self._request.receive()  # the ASGI messages: no other reader
        self._ended = message["type"] != "http.request" or not message.get("more_body")
        return bytes(message.get("body", b""))

    async def drain(self) -> None:
        seen = 0
        while not self._ended and seen < self.DRAIN_LIMIT:
            seen += len(await self._next())


def tenant_rows(console: Console) -> dict[str, Any] | None:
    """The pools page's tenants (None: tenancy is off, or nothing samples them)."""
    if console.tenants is None or console.core.state.tenancy is None:
        return None
    return {"window_s": console.tenants.window_s, "rows": console.tenants.rows()}
