"""HTTP service: submit a fleet and pools, get a plan, its manifests and pictures, apply it.

A thin transport over the planner: each route parses, calls the core, encodes. Plans are
content-addressed (the same request gets the same id) and kept in memory, newest
``max_plans``. Applying goes to the cluster of ``kubeconfig`` by server-side apply when
one is configured, otherwise into ``output_dir/<plan id>/``.
"""

from __future__ import annotations

import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from scheduler.apply import Cluster, apply_plan, kubernetes_cluster, write_directory
from scheduler.changeover import ChangeoverSettings
from scheduler.errors import InvalidPlanningInput, PlanNotFound, SchedulerError, http_status
from scheduler.manifests import ManifestSettings, build_manifests, to_yaml
from scheduler.migparted import mig_parted_config, node_labels
from scheduler.plan import PlacementPlan, PlanRecord
from scheduler.planner import plan_placement
from scheduler.render import plan_png, plan_svg, plan_text
from scheduler.request import PlanningRequest, check_request


@dataclass(frozen=True)
class ServiceSettings:
    kubeconfig: Path | None = None
    kube_context: str | None = None
    output_dir: Path = Path("scheduler-out")
    max_plans: int = 256
    changeover: ChangeoverSettings = field(default_factory=ChangeoverSettings)
    manifests: ManifestSettings = field(default_factory=ManifestSettings)


class PlanStore:
    """The newest ``capacity`` plan records, by id (thread-safe)."""

    def __init__(self, capacity: int) -> None:
        self._records: OrderedDict[str, PlanRecord] = OrderedDict()
        self._capacity = capacity
        self._lock = threading.Lock()

    def put(self, record: PlanRecord) -> None:
        with self._lock:
            self._records[record.plan.id] = record
            self._records.move_to_end(record.plan.id)
            while len(self._records) > self._capacity:
                self._records.popitem(last=False)

    def newest(self, limit: int) -> list[PlanRecord]:
        """The ``limit`` plans made (or asked for again) last, newest first."""
        with self._lock:
            return list(reversed(self._records.values()))[:limit]

    def get(self, plan_id: str) -> PlanRecord:
        with self._lock:
            record = self._records.get(plan_id)
        if record is None:
            raise PlanNotFound(f"no plan {plan_id!r}")
        return record


def _summary(plan: PlacementPlan) -> dict[str, Any]:
    base = f"/v1/plans/{plan.id}"
    return {
        "id": plan.id,
        "plan": plan.model_dump(mode="json"),
        "links": {
            "self": base,
            "manifests": f"{base}/manifests",
            "layout_svg": f"{base}/layout.svg",
            "layout_png": f"{base}/layout.png",
            "apply": f"{base}/apply",
        },
    }


def create_app(
    settings: ServiceSettings,
    *,
    clock: Callable[[], float] = time.monotonic,
    cluster_factory: Callable[[], Cluster] | None = None,
) -> FastAPI:
    app = FastAPI(title="infergate MIG placement scheduler", version="1")
    store = PlanStore(settings.max_plans)
    kubeconfig = settings.kubeconfig
    if cluster_factory is None and kubeconfig is not None:

        def cluster_factory() -> Cluster:
            return kubernetes_cluster(
                kubeconfig, settings.kube_context, settings.manifests.namespace
            )

    @app.exception_handler(SchedulerError)
    async def scheduler_error(_: Request, error: SchedulerError) -> JSONResponse:
        if isinstance(error, InvalidPlanningInput):
            detail: Any = [
                {"loc": ["body", *p.loc], "msg": p.msg, "type": "value_error"}
                for p in error.problems
            ]
        else:
            detail = error.message
        return JSONResponse({"detail": detail}, status_code=http_status(error))

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/plans", status_code=201)
    async def create_plan(body: PlanningRequest) -> dict[str, Any]:
        problems = check_request(body)
        if problems:
            raise InvalidPlanningInput(problems)
        plan = await run_in_threadpool(
            plan_placement, body, clock=clock, rng=random.Random(body.options.seed)
        )
        store.put(PlanRecord(request=body, plan=plan))
        return _summary(plan)

    @app.get("/v1/plans")
    async def list_plans(limit: int = Query(20, ge=1, le=256)) -> dict[str, Any]:
        """The plans kept, newest first (a plan asked for again counts as new): id,
        when it was made, its figures and links; the newest is the fleet's latest."""
        return {"plans": [
            {"id": r.plan.id, "created_at": r.plan.created_at.isoformat(),
             "metrics": r.plan.metrics.model_dump(mode="json"),
             "links": _summary(r.plan)["links"]}
            for r in store.newest(limit)]}

    @app.get("/v1/plans/{plan_id}")
    async def get_plan(plan_id: str) -> dict[str, Any]:
        return store.get(plan_id).plan.model_dump(mode="json")

    @app.get("/v1/plans/{plan_id}/manifests", response_model=None)
    async def get_manifests(
        plan_id: str, format: Literal["json", "yaml"] = "json"
    ) -> dict[str, Any] | Response:
        record = store.get(plan_id)
        objects = build_manifests(record.plan, record.request.pools, settings.manifests)
        if format == "yaml":
            return PlainTextResponse(to_yaml(objects), media_type="application/yaml")
        return {
            "objects": objects,
            "mig_parted": mig_parted_config(record.plan),
            "node_labels": node_labels(record.plan),
            "unplaced": [p.model_dump(mode="json") for p in record.plan.unplaced],
        }

    @app.get("/v1/plans/{plan_id}/layout.svg")
    async def get_svg(plan_id: str) -> Response:
        return Response(plan_svg(store.get(plan_id).plan), media_type="image/svg+xml")

    @app.get("/v1/plans/{plan_id}/layout.png")
    async def get_png(plan_id: str) -> Response:
        png = await run_in_threadpool(plan_png, store.get(plan_id).plan)
        return Response(png, media_type="image/png")

    @app.get("/v1/plans/{plan_id}/layout.txt")
    async def get_text(plan_id: str) -> PlainTextResponse:
        return PlainTextResponse(plan_text(store.get(plan_id).plan))

    @app.post("/v1/plans/{plan_id}/apply")
    async def apply(plan_id: str) -> dict[str, Any]:
        record = store.get(plan_id)
        if cluster_factory is not None:
            factory = cluster_factory

            def to_cluster() -> list[Any]:
                return apply_plan(record, factory(), settings.manifests, settings.changeover)

            done = await run_in_threadpool(to_cluster)
            target = "cluster"
        else:
            directory = settings.output_dir / plan_id
            done = await run_in_threadpool(write_directory, record, directory, settings.manifests)
            target = str(directory)
        return {
            "plan": plan_id,
            "target": target,
            "objects": [
                {"kind": o.kind, "name": o.name, "namespace": o.namespace, "where": o.where}
                for o in done
            ],
        }

    return app
