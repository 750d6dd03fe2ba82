from __future__ import annotations

import re
from typing import Any

import kubernetes_validate
import pytest
import yaml

from scheduler.manifests import TRITON_IMAGE, ManifestSettings, build_manifests, to_yaml
from scheduler.plan import PlanRecord
from scheduler.planner import plan_placement
from scheduler.profiles import GPU_TYPES
from tests.scheduler.builders import gpu, node, pool, request

DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
K8S = "1.31"


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


@pytest.fixture(scope="module")
def objects(example_record: PlanRecord) -> list[dict[str, Any]]:
    return build_manifests(example_record.plan, example_record.request.pools)


def test_build_manifests_pass_kubernetes_schemas_when_validated(
    objects: list[dict[str, Any]],
) -> None:
    for obj in objects:
        if obj["kind"] != "Node":  # label patches are partial objects, by design
            kubernetes_validate.validate(obj, K8S, strict=True)


def test_deployments_request_one_mig_resource_when_pool_is_placed(
    objects: list[dict[str, Any]], example_record: PlanRecord
) -> None:
    deployments = by_kind(objects, "Deployment")
    placed = {p.name: p for p in example_record.plan.pools if p.replicas_placed}
    assert {d["metadata"]["labels"]["infergate.io/pool"] for d in deployments} == set(placed)
    for d in deployments:
        assert DNS_LABEL.match(d["metadata"]["name"])
        pod = d["spec"]["template"]
        assert d["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        (container,) = pod["spec"]["containers"]
        assert container["image"] == TRITON_IMAGE == "nvcr.io/nvidia/tritonserver:25.04-py3"
        assert [p["containerPort"] for p in container["ports"]] == [8000, 8001, 8002]
        gpu_resources = [r for r in container["resources"]["limits"] if r.startswith("nvidia.com/")]
        assert len(gpu_resources) == 1
        on_mig = {
            GPU_TYPES[g.gpu_type].mig_capable
            for g in example_record.plan.gpus
            for i in g.instances
            if i.pool == d["metadata"]["labels"]["infergate.io/pool"]
        }
        assert gpu_resources[0].startswith("nvidia.com/mig-") == on_mig.pop()


def test_deployment_replicas_match_the_plan_per_node_when_built(
    objects: list[dict[str, Any]], example_record: PlanRecord
) -> None:
    planned: dict[tuple[str, str, str], int] = {}
    for g in example_record.plan.gpus:
        for i in g.instances:
            if i.pool is not None:
                key = (i.pool, GPU_TYPES[g.gpu_type].resource_name(i.profile_id), g.node)
                planned[key] = planned.get(key, 0) + 1
    built = {}
    for d in by_kind(objects, "Deployment"):
        spec = d["spec"]["template"]["spec"]
        resource = next(iter(spec["containers"][0]["resources"]["limits"]))
        assert "affinity" not in spec
        key = (d["metadata"]["labels"]["infergate.io/pool"], resource,
               spec["nodeSelector"]["kubernetes.io/hostname"])  # fmt: skip
        built[key] = d["spec"]["replicas"]
    assert built == planned


def test_replicas_cannot_pile_onto_one_node_when_a_pool_spans_nodes() -> None:
    nodes = [node("n1", [gpu(0, layout=[(19, 0, "a"), (19, 1, "b")])]),
             node("n2", [gpu(0, layout=[(19, 0, "a"), (19, 1, "b")])])]  # fmt: skip
    req = request(nodes, [pool("a", target=200), pool("b", target=200)])
    deployments = by_kind(build_manifests(plan_placement(req), req.pools), "Deployment")
    pinned = sorted(
        (d["metadata"]["labels"]["infergate.io/pool"], d["spec"]["replicas"],
         d["spec"]["template"]["spec"]["nodeSelector"]["kubernetes.io/hostname"])
        for d in deployments
    )  # fmt: skip
    assert pinned == [("a", 1, "n1"), ("a", 1, "n2"), ("b", 1, "n1"), ("b", 1, "n2")]
    assert all(DNS_LABEL.match(d["metadata"]["name"]) for d in deployments)
    for d in deployments:  # an update replaces a pod in place: no surge pod without a device
        assert d["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}


def test_pools_get_a_disruption_budget_and_a_rotation_selector_when_built(
    objects: list[dict[str, Any]],
) -> None:
    budgets = {b["metadata"]["name"]: b for b in by_kind(objects, "PodDisruptionBudget")}
    for s in by_kind(objects, "Service"):
        pool_name = s["spec"]["selector"]["infergate.io/pool"]
        assert s["spec"]["selector"]["infergate.io/rotation"] == "in"
        budget = budgets[s["metadata"]["name"]]
        assert budget["spec"] == {
            "maxUnavailable": 1,
            "selector": {"matchLabels": {"infergate.io/pool": pool_name}},
        }
    for d in by_kind(objects, "Deployment"):
        assert d["spec"]["template"]["metadata"]["labels"]["infergate.io/rotation"] == "in"


def test_priority_classes_cover_every_pool_when_built(
    objects: list[dict[str, Any]], example_record: PlanRecord
) -> None:
    classes = {c["metadata"]["name"]: c["value"] for c in by_kind(objects, "PriorityClass")}
    for p in example_record.request.pools:
        assert classes[p.priority_class_name] == p.priority
    for d in by_kind(objects, "Deployment"):
        assert d["spec"]["template"]["spec"]["priorityClassName"] in classes


def test_services_are_headless_per_pool_when_built(objects: list[dict[str, Any]]) -> None:
    services = by_kind(objects, "Service")
    pods = [d["spec"]["template"]["metadata"]["labels"] for d in by_kind(objects, "Deployment")]
    for s in services:
        assert s["spec"]["clusterIP"] == "None"
        assert s["metadata"]["name"] == f"triton-{s['spec']['selector']['infergate.io/pool']}"
        assert any(s["spec"]["selector"].items() <= labels.items() for labels in pods)
        assert [p["port"] for p in s["spec"]["ports"]] == [8000, 8001, 8002]


def test_manifests_carry_tolerations_when_pool_tolerates_taints(
    objects: list[dict[str, Any]],
) -> None:
    (llama,) = [d for d in by_kind(objects, "Deployment") if "llama" in d["metadata"]["name"]]
    tolerations = llama["spec"]["template"]["spec"]["tolerations"]
    assert tolerations[0]["key"] == "dedicated"


def test_pool_gets_one_deployment_per_resource_when_replicas_span_gpu_types() -> None:
    nodes = [node("a100", [gpu(0, "A100-40GB")]), node("h200", [gpu(0, "H200")])]
    spread = pool("spread", {9: 100}, target=200, constraints={"max_replicas_per_gpu": 1})
    req = request(nodes, [spread])
    plan = plan_placement(req)
    deployments = by_kind(build_manifests(plan, req.pools), "Deployment")
    resources = sorted(
        next(iter(d["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]))
        for d in deployments
    )
    assert resources == ["nvidia.com/mig-3g.20gb", "nvidia.com/mig-3g.71gb"]


def test_manifests_order_node_phase_first_when_built(objects: list[dict[str, Any]]) -> None:
    kinds = [o["kind"] for o in objects]
    first_pool = min(kinds.index("Service"), kinds.index("Deployment"))
    assert (
        max(i for i, k in enumerate(kinds) if k in ("PriorityClass", "ConfigMap", "Node"))
        < first_pool
    )
    assert by_kind(objects, "ConfigMap")[0]["metadata"]["namespace"] == "gpu-operator"


def test_to_yaml_round_trips_without_aliases_when_dumped(objects: list[dict[str, Any]]) -> None:
    text = to_yaml(objects)
    assert "&id" not in text and "*id" not in text
    assert list(yaml.safe_load_all(text)) == objects


def test_manifest_settings_change_namespace_when_given(example_record: PlanRecord) -> None:
    settings = ManifestSettings(namespace="serving", image="registry.local/triton:1")
    out = build_manifests(example_record.plan, example_record.request.pools, settings)
    d = by_kind(out, "Deployment")[0]
    assert d["metadata"]["namespace"] == "serving"
    assert d["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.local/triton:1"
