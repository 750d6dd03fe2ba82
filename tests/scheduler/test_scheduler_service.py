from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from scheduler.changeover import ChangeoverSettings, Relabel
from scheduler.migparted import node_labels
from scheduler.plan import PlacementPlan
from scheduler.planner import plan_id
from scheduler.request import PlanningRequest
from scheduler.service import ServiceSettings, create_app
from tests.scheduler.fake_cluster import ScriptedCluster


def body(request: PlanningRequest) -> dict[str, Any]:
    """The example request as a client sends it (heuristic solver: fast, deterministic)."""
    data = json.loads(request.model_dump_json())
    data["options"]["solver"] = "heuristic"
    return data


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(ServiceSettings(output_dir=tmp_path))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://scheduler") as c:
        yield c


async def test_post_plan_returns_plan_and_links_when_request_is_valid(
    client: httpx.AsyncClient, example_request: PlanningRequest
) -> None:
    response = await client.post("/v1/plans", json=body(example_request))
    assert response.status_code == 201
    data = response.json()
    assert data["id"] == plan_id(PlanningRequest.model_validate(body(example_request)))
    assert data["plan"]["metrics"]["pools_unplaced"] == 0
    fetched = await client.get(data["links"]["self"])
    assert fetched.status_code == 200 and fetched.json()["id"] == data["id"]


async def test_get_manifests_returns_objects_when_plan_exists(
    client: httpx.AsyncClient, example_request: PlanningRequest
) -> None:
    created = (await client.post("/v1/plans", json=body(example_request))).json()
    manifests = (await client.get(created["links"]["manifests"])).json()
    kinds = {o["kind"] for o in manifests["objects"]}
    assert {"PriorityClass", "ConfigMap", "Deployment", "Service"} <= kinds
    assert manifests["mig_parted"]["version"] == "v1"
    as_yaml = await client.get(created["links"]["manifests"], params={"format": "yaml"})
    assert as_yaml.headers["content-type"].startswith("application/yaml")
    assert len(list(yaml.safe_load_all(as_yaml.text))) == len(manifests["objects"])


async def test_get_layout_serves_svg_and_png_when_plan_exists(
    client: httpx.AsyncClient, example_request: PlanningRequest
) -> None:
    created = (await client.post("/v1/plans", json=body(example_request))).json()
    svg = await client.get(created["links"]["layout_svg"])
    assert svg.headers["content-type"] == "image/svg+xml" and svg.text.startswith("<svg")
    png = await client.get(created["links"]["layout_png"])
    assert png.content[:4] == b"\x89PNG"


async def test_apply_writes_directory_when_no_kubeconfig(
    client: httpx.AsyncClient, example_request: PlanningRequest, tmp_path: Path
) -> None:
    created = (await client.post("/v1/plans", json=body(example_request))).json()
    response = await client.post(created["links"]["apply"])
    assert response.status_code == 200
    assert response.json()["target"] == str(tmp_path / created["id"])
    assert (tmp_path / created["id"] / "30-pools.yaml").exists()


async def test_apply_rolls_out_on_the_cluster_when_one_is_configured(
    example_request: PlanningRequest,
) -> None:
    cluster = ScriptedCluster(node_labels={n.name: {} for n in example_request.fleet.nodes})
    # no settle wait: the gateway re-resolving its Service is not part of this test
    settings = ServiceSettings(changeover=ChangeoverSettings(
        mig_timeout_s=60, rotation_settle_s=0.0, poll_s=0.05))
    app = create_app(settings, cluster_factory=lambda: cluster)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://s") as c:
        created = (await c.post("/v1/plans", json=body(example_request))).json()
        response = await c.post(created["links"]["apply"])
    assert response.status_code == 200, response.text
    assert response.json()["target"] == "cluster"
    relabelled = [a.node for a in cluster.actions if isinstance(a, Relabel)]
    assert relabelled == sorted(node_labels(PlacementPlan.model_validate(created["plan"])))
    assert {o["kind"] for o in response.json()["objects"]} >= {"ConfigMap", "Deployment"}


async def test_get_plan_answers_404_when_id_is_unknown(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/plans/plan-nope")
    assert response.status_code == 404 and "plan-nope" in response.json()["detail"]


async def test_post_plan_answers_422_naming_field_when_gpu_type_is_unknown(
    client: httpx.AsyncClient, example_request: PlanningRequest
) -> None:
    data = body(example_request)
    data["fleet"]["nodes"][1]["gpus"][0]["type"] = "B200"
    response = await client.post("/v1/plans", json=data)
    assert response.status_code == 422
    locs = [d["loc"] for d in response.json()["detail"]]
    assert ["body", "fleet", "nodes", 1, "gpus", 0, "type"] in locs


async def test_post_plan_answers_422_naming_field_when_start_slot_is_invalid(
    client: httpx.AsyncClient, example_request: PlanningRequest
) -> None:
    data = body(example_request)
    data["fleet"]["nodes"][0]["gpus"][0]["mig"]["instances"][0]["start"] = 2
    response = await client.post("/v1/plans", json=data)
    assert response.status_code == 422
    (detail,) = response.json()["detail"]
    assert detail["loc"] == ["body", "fleet", "nodes", 0, "gpus", 0, "mig", "instances", 0, "start"]


async def test_post_plan_answers_422_naming_field_when_pool_is_malformed(
    client: httpx.AsyncClient, example_request: PlanningRequest
) -> None:
    data = body(example_request)
    data["pools"][2]["target_rps"] = -5
    response = await client.post("/v1/plans", json=data)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "pools", 2, "target_rps"]


async def test_list_plans_answers_newest_first_and_counts_a_repeated_request_as_new(
    client: httpx.AsyncClient, example_request: PlanningRequest
) -> None:
    assert (await client.get("/v1/plans")).json() == {"plans": []}
    first = body(example_request)
    second = json.loads(json.dumps(first))
    second["options"]["seed"] = first["options"]["seed"] + 1  # another request, another id
    a = (await client.post("/v1/plans", json=first)).json()["id"]
    b = (await client.post("/v1/plans", json=second)).json()["id"]
    assert a != b
    listed = (await client.get("/v1/plans")).json()["plans"]
    assert [p["id"] for p in listed] == [b, a]
    assert listed[0]["links"]["layout_svg"] == f"/v1/plans/{b}/layout.svg"
    assert listed[0]["metrics"]["pools_unplaced"] == 0
    await client.post("/v1/plans", json=first)  # asked again: the newest
    assert [p["id"] for p in (await client.get("/v1/plans", params={"limit": 1}))
            .json()["plans"]] == [a]
    assert (await client.get("/v1/plans", params={"limit": 0})).status_code == 422
