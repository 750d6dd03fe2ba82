"""HTTP adapter of the model lifecycle: ``/v1/models...`` and ``/v1/jobs/{id}``.

Each route checks the caller's token scope, converts the request to a call on
:class:`~gateway.lifecycle.service.ModelLifecycle` (its job runner for uploads and jobs,
its catalog for reads), and encodes the answer as JSON: the HTTP-shaped views of jobs
and models live here. Errors are the gateway's own (one table, see :mod:`gateway.errors`).

The reads (:func:`create_reads_router`) need only a
:class:`~gateway.lifecycle.records.catalog.RecordedCatalog`: a standby control plane
serves them from the records with the same shapes (:mod:`gateway.control.standby`),
``loading`` null and a rollout without its running step's windows.

| route | scope |
|---|---|
| ``POST /v1/models/{name}/versions`` (multipart upload) | upload |
| ``GET /v1/jobs/{id}``, ``GET /v1/models``, ``GET /v1/models/{name}``, report | upload |
| ``GET /v1/models/{name}/rollout`` | upload |
| ``POST /v1/models/{name}/rollback``, ``DELETE /v1/models/{name}/versions/{v}`` | admin |
| ``POST /v1/models/{name}/rollout/{pause,resume,abort}`` | admin |
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Literal

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import FileResponse, JSONResponse
from pydantic import BaseModel, Field

from gateway.auth import Principal, Scope, TokenTable
from gateway.errors import Unsupported
from gateway.lifecycle.records.catalog import RecordedCatalog
from gateway.lifecycle.records.jobs import JobRecord
from gateway.lifecycle.service import ModelLifecycle
from gateway.policy.access import presented_token


def api_key(request: Request) -> str | None:
    """``X-API-Key``, else ``Authorization: Bearer`` (:func:`presented_token`)."""
    return presented_token(request.headers.get)


def requires(auth: TokenTable, scope: Scope) -> Callable[[Request], Principal]:
    """A FastAPI dependency: the caller's principal, or 401/403 before the body is read."""
    def check(request: Request) -> Principal:
        return auth.require(api_key(request), scope)

    return check


RolloutAction = Literal["pause", "resume", "abort"]


class RollbackRequest(BaseModel):
    version: int | None = Field(None, ge=1, description="Default: the previous version.")


def job_json(job: JobRecord) -> dict[str, Any]:
    return {**job.to_json(), "links": {"self": f"/v1/jobs/{job.id}",
                                       "model": f"/v1/models/{job.model}"}}


def create_reads_router(catalog: Callable[[], RecordedCatalog], auth: TokenTable,
                        rollout_status: Callable[[str], Awaitable[dict[str, Any]]]
                        ) -> APIRouter:
    """The lifecycle's reads (upload scope): jobs, models, reports, rollout status, over
    ``catalog()`` (which raises what the caller should see when there is none)."""
    router = APIRouter(prefix="/v1")
    upload = Depends(requires(auth, Scope.UPLOAD))

    @router.get("/jobs/{job_id}")
    async def get_job(job_id: str, who: Principal = upload) -> JSONResponse:
        store = catalog().store
        job = store.job(job_id)
        rollout = store.rollout(job.model)
        extra = {"rollout": rollout.to_json()} if rollout and rollout.job_id == job.id else {}
        return JSONResponse({**job_json(job), **extra})

    @router.get("/models")
    async def list_models(who: Principal = upload) -> JSONResponse:
        models = catalog()
        return JSONResponse({"models": [model_json(models, m) for m in models.model_names()]})

    @router.get("/models/{name}")
    async def show_model(name: str, who: Principal = upload) -> JSONResponse:
        models = catalog()
        return JSONResponse(model_json(models, (await models.known(name)).name))

    @router.get("/models/{name}/versions/{version}/report")
    async def version_report(name: str, version: int, who: Principal = upload) -> Response:
        return FileResponse(catalog().report_path(name, version))

    @router.get("/models/{name}/rollout")
    async def rollout_state(name: str, who: Principal = upload) -> JSONResponse:
        """The model's latest rollout: state, step, split, every verdict with its figures
        and, while it runs, the current step's windows."""
        return JSONResponse(await rollout_status(name))

    return router


def create_lifecycle_router(lifecycle: ModelLifecycle | None, auth: TokenTable) -> APIRouter:
    admin = Depends(requires(auth, Scope.ADMIN))

    def core() -> ModelLifecycle:
        if lifecycle is None:
            raise Unsupported("model uploads are not enabled on this gateway (add a "
                              "'lifecycle:' section with the model repository to its config)")
        return lifecycle

    router = create_reads_router(lambda: core().catalog, auth,
                                 lambda name: core().rollout(name, "status", ""))
    upload = Depends(requires(auth, Scope.UPLOAD))

    @router.post("/models/{name}/versions", status_code=202)
    async def upload_version(name: str, request: Request,
                             who: Principal = upload) -> JSONResponse:
        """Multipart upload: ``model`` file, ``spec`` JSON, optional ``calibration`` /
        ``evaluation`` samples. Answers 202 with the job to follow."""
        length = request.headers.get("content-length")
        job = await core().jobs.submit(name, request.stream(), request.headers.get("content-type"),
                                  int(length) if length and length.isdigit() else None, who)
        return JSONResponse(job_json(job), status_code=202,
                            headers={"location": f"/v1/jobs/{job.id}"})

    @router.post("/models/{name}/rollback")
    async def rollback(name: str, body: RollbackRequest | None = None,
                       who: Principal = admin) -> JSONResponse:
        lifecycle = core()
        model = await lifecycle.rollback(name, body.version if body else None)
        return JSONResponse(model_json(lifecycle.catalog, model))

    @router.post("/models/{name}/rollout/{action}")
    async def rollout_control(name: str, action: RolloutAction,
                              who: Principal = admin) -> JSONResponse:
        """``pause`` (the split stays, no verdicts), ``resume`` (the step starts over),
        ``abort`` (stable takes 100 % again, the candidate is removed)."""
        return JSONResponse(await core().rollout(name, action, who.name))

    @router.delete("/models/{name}/versions/{version}")
    async def delete_version(name: str, version: int, who: Principal = admin) -> JSONResponse:
        lifecycle = core()
        model = await lifecycle.delete_version(name, version)
        return JSONResponse(model_json(lifecycle.catalog, model))

    return router


def model_json(catalog: RecordedCatalog, model: str) -> dict[str, Any]:
    """A managed model as the HTTP API shows it: its state, versions and recent jobs.
    ``versions`` lists every number ever issued with what became of it: available or
    serving (in the repository), else failed, rolled_back or deleted with ``reason``.
    ``loading``: null where it is not known (a standby, which does not probe)."""
    record = catalog.record(model)
    versions = []
    for v in catalog.versions(model):
        report = f"/v1/models/{model}/versions/{v.version}/report" \
            if v.report and v.live else None
        versions.append({"version": v.version, "state": v.state, "precision": v.precision,
                         "job": v.job_id, "created_at": v.created_at, "report": report,
                         "metadata": v.metadata, "reason": v.reason or None,
                         "ended_at": v.ended_at})
    jobs = [{"id": j.id, "state": j.state, "version": j.version}
            for j in catalog.recent_jobs(model)]
    keep_warm = catalog.keep_warm_policies().get(model)
    rollout = catalog.store.rollout(model)
    return {"name": model, "state": record.state, "detail": record.detail,
            "serving_version": record.serving_version,
            "previous_version": record.previous_version, "pools": list(record.pools),
            "keep_warm": keep_warm.model_dump(mode="json") if keep_warm else None,
            "loading": catalog.loading(model), "versions": versions, "recent_jobs": jobs,
            "rollout": None if rollout is None else {
                "state": rollout.state, "stable": rollout.stable,
                "candidate": rollout.candidate, "percent": rollout.percent,
                "detail": rollout.detail, "link": f"/v1/models/{model}/rollout"}}
