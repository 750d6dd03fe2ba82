from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest.mock import create_autospec

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from scheduler.apply import FIELD_MANAGER, ClusterApplier, KubernetesCluster, write_directory
from scheduler.changeover import (
    Changeover,
    Cordon,
    DeploymentView,
    Evict,
    NodeChange,
    Relabel,
    SetRotation,
)
from scheduler.errors import ApplyFailed
from scheduler.manifests import build_manifests
from scheduler.plan import PlanRecord


def dynamic_client() -> DynamicClient:
    client = create_autospec(DynamicClient, instance=True)
    client.resources = SimpleNamespace(get=lambda api_version, kind: f"{api_version}/{kind}")
    return client


def test_write_directory_writes_manifests_and_record_when_no_cluster(
    example_record: PlanRecord, tmp_path: Path
) -> None:
    done = write_directory(example_record, tmp_path / "out")
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert files == [
        "00-priorityclasses.yaml", "10-mig-parted-configmap.yaml", "20-node-labels.yaml",
        "30-pools.yaml", "layout.svg", "mig-parted-config.yaml", "plan.json",
    ]  # fmt: skip
    pools = list(yaml.safe_load_all((tmp_path / "out" / "30-pools.yaml").read_text()))
    assert {o["kind"] for o in pools} == {"Service", "PodDisruptionBudget", "Deployment"}
    assert len(done) == sum(
        len(list(yaml.safe_load_all(p.read_text()))) for p in (tmp_path / "out").glob("*0-*.yaml")
    )
    again = PlanRecord.model_validate_json((tmp_path / "out" / "plan.json").read_text())
    assert again == example_record


def test_write_directory_raises_apply_failed_when_path_is_a_file(
    example_record: PlanRecord, tmp_path: Path
) -> None:
    blocker = tmp_path / "taken"
    blocker.write_text("x")
    with pytest.raises(ApplyFailed, match="cannot write"):
        write_directory(example_record, blocker / "out")


def test_cluster_applier_server_side_applies_each_object_when_called(
    example_record: PlanRecord,
) -> None:
    client = dynamic_client()
    objects = build_manifests(example_record.plan, example_record.request.pools)
    done = ClusterApplier(client).apply(objects)
    calls = client.server_side_apply.call_args_list
    assert len(calls) == len(done) == len(objects) > 0
    assert all(c.kwargs["field_manager"] == FIELD_MANAGER and c.kwargs["force_conflicts"]
               for c in calls)  # fmt: skip


def test_cluster_applier_raises_apply_failed_when_api_refuses() -> None:
    client = dynamic_client()
    client.server_side_apply.side_effect = ApiException(status=409, reason="Conflict")
    applier = ClusterApplier(client)
    body = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": "x"}}
    with pytest.raises(ApplyFailed, match="Service/s: the API server answered 409"):
        applier.apply([body])


def core_api() -> Any:
    return create_autospec(client.CoreV1Api, instance=True)


def kubernetes_cluster_with(core: Any) -> KubernetesCluster:
    cluster = KubernetesCluster.__new__(KubernetesCluster)  # no API client: calls are mocked
    cluster.core, cluster.namespace = core, "infergate"
    return cluster


def test_relabel_sets_the_config_and_removes_the_old_state_in_one_patch_when_executed() -> None:
    core = core_api()
    kubernetes_cluster_with(core).execute(Relabel("n1", "infergate-abc"))
    core.patch_node.assert_called_once_with(
        "n1",
        {"metadata": {"labels": {"nvidia.com/mig.config": "infergate-abc",
                                 "nvidia.com/mig.config.state": None}}},
    )  # fmt: skip


def test_eviction_refused_by_a_budget_is_reported_not_raised_when_executed() -> None:
    core = core_api()
    body = '{"message": "Cannot evict pod as it would violate the pod\'s disruption budget."}'
    core.create_namespaced_pod_eviction.side_effect = ApiException(status=429, reason="TooMany")
    core.create_namespaced_pod_eviction.side_effect.body = body
    why = kubernetes_cluster_with(core).execute(Evict("p", "infergate"))
    assert why is not None and "disruption budget" in why
    (name, namespace, eviction), _ = core.create_namespaced_pod_eviction.call_args
    assert (name, namespace, eviction.metadata.name) == ("p", "infergate", "p")


def test_cordon_and_rotation_patch_only_their_fields_when_executed() -> None:
    core = core_api()
    cluster = kubernetes_cluster_with(core)
    cluster.execute(Cordon("n1"))
    cluster.execute(SetRotation("p", "infergate", False))
    core.patch_node.assert_called_once_with("n1", {"spec": {"unschedulable": True}})
    core.patch_namespaced_pod.assert_called_once_with(
        "p", "infergate", {"metadata": {"labels": {"infergate.io/rotation": "out"}}}
    )


def test_observe_reads_pods_nodes_and_deployments_into_a_snapshot_when_listed() -> None:
    m = client
    core = core_api()
    apps = create_autospec(m.AppsV1Api, instance=True)
    scheduling = create_autospec(m.SchedulingV1Api, instance=True)
    core.read_node.return_value = m.V1Node(
        metadata=m.V1ObjectMeta(name="n1", labels={"nvidia.com/mig.config": "c"}),
        spec=m.V1NodeSpec(unschedulable=True),
    )
    limits = {"nvidia.com/mig-1g.10gb.me": "1", "cpu": "2"}
    pod = m.V1Pod(
        metadata=m.V1ObjectMeta(name="p", namespace="infergate", deletion_timestamp=None,
                                labels={"infergate.io/pool": "a", "infergate.io/rotation": "out"}),
        spec=m.V1PodSpec(containers=[m.V1Container(name="t", resources=m.V1ResourceRequirements(
            limits=limits))]),
        status=m.V1PodStatus(conditions=[m.V1PodCondition(type="Ready", status="True")]),
    )  # fmt: skip
    core.list_pod_for_all_namespaces.return_value = m.V1PodList(items=[pod])
    elsewhere = m.V1Pod(metadata=m.V1ObjectMeta(name="q", namespace="infergate",
                                                labels={"infergate.io/pool": "a"}),
                        spec=m.V1PodSpec(node_name="n2", containers=[]))  # fmt: skip
    core.list_namespaced_pod.return_value = m.V1PodList(items=[pod, elsewhere])
    apps.list_namespaced_deployment.return_value = m.V1DeploymentList(items=[m.V1Deployment(
        metadata=m.V1ObjectMeta(name="d", namespace="infergate",
                                labels={"infergate.io/node": "n1"}),
        spec=m.V1DeploymentSpec(replicas=2, selector=m.V1LabelSelector(),
                                template=m.V1PodTemplateSpec()),
        status=m.V1DeploymentStatus(ready_replicas=1))])  # fmt: skip
    scheduling.list_priority_class.return_value = m.V1PriorityClassList(
        items=[m.V1PriorityClass(metadata=m.V1ObjectMeta(name="pc"), value=7)]
    )
    cluster = kubernetes_cluster_with(core)
    cluster.apps, cluster.scheduling = apps, scheduling
    change = NodeChange("n1", "c", frozenset(), (), 0)
    snap = cluster.observe(Changeover((), (change,), (), "infergate"), 3.0, {"p": "refused"})
    assert snap.node_labels == {"n1": {"nvidia.com/mig.config": "c"}}
    assert snap.unschedulable == {"n1": True} and snap.priority_classes == {"pc": 7}
    seen, other = snap.pods  # the node's pods, then pool pods elsewhere (once each)
    assert (seen.resources, seen.pool, seen.ready, seen.in_rotation, seen.terminating) == (
        ("nvidia.com/mig-1g.10gb.me",), "a", True, False, False)  # fmt: skip
    assert (other.name, other.node, other.rotation_labelled) == ("q", "n2", False)
    assert snap.deployments == (DeploymentView("d", "infergate", "n1", 2, 1),)
    assert snap.refusals == {"p": "refused"} and snap.at == 3.0
    core.list_pod_for_all_namespaces.assert_called_once_with(field_selector="spec.nodeName=n1")
