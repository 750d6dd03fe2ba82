"""Kubernetes objects for a plan: PriorityClasses, the mig-parted ConfigMap, node label
patches, and per pool a headless Service plus one Triton Deployment per MIG resource.

A container should request one MIG device type only (mixed strategy), and the resource
name differs per GPU type (``3g.40gb`` on an H100-80GB, ``3g.71gb`` on an H200), so a
pool whose replicas span GPU types gets one Deployment per resource name. Each
Deployment is pinned by node affinity to the nodes the plan put its instances on.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from scheduler.migparted import mig_parted_config, node_labels
from scheduler.plan import PlacementPlan
from scheduler.pools import PoolSpec
from scheduler.profiles import GPU_TYPES

TRITON_IMAGE = "nvcr.io/nvidia/tritonserver:24.10-py3"
MANAGED_BY = {"app.kubernetes.io/managed-by": "infergate-scheduler"}
POOL_LABEL = "infergate.io/pool"


@dataclass(frozen=True)
class ManifestSettings:
    namespace: str = "infergate"
    image: str = TRITON_IMAGE
    model_repository_claim: str = "infergate-model-repo"
    model_repository_path: str = "/models"
    gpu_operator_namespace: str = "gpu-operator"
    mig_config_map: str = "infergate-mig-parted-config"
    cpu_request: str = "2"
    memory_request: str = "8Gi"


def _suffix(resource: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", resource.removeprefix("nvidia.com/").lower()).strip("-")


def priority_classes(pools: Sequence[PoolSpec]) -> list[dict[str, Any]]:
    by_name: dict[str, int] = {}
    for pool in pools:
        by_name.setdefault(pool.priority_class_name, pool.priority)
    return [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name, "labels": dict(MANAGED_BY)},
            "value": value,
            "globalDefault": False,
            "preemptionPolicy": "PreemptLowerPriority",
            "description": "Triton pools planned by the infergate MIG scheduler.",
        }
        for name, value in sorted(by_name.items())
    ]


def _container(pool: PoolSpec, resource: str, settings: ManifestSettings) -> dict[str, Any]:
    def ready() -> dict[str, Any]:  # fresh dicts: YAML would alias shared ones
        return {"httpGet": {"path": "/v2/health/ready", "port": "http"}, "periodSeconds": 5}

    return {
        "name": "triton",
        "image": settings.image,
        "args": [
            "tritonserver",
            f"--model-repository={settings.model_repository_path}",
            "--model-control-mode=explicit",
            f"--load-model={pool.model}",
            "--http-port=8000",
            "--grpc-port=8001",
            "--metrics-port=8002",
        ],
        "ports": [
            {"name": "http", "containerPort": 8000},
            {"name": "grpc", "containerPort": 8001},
            {"name": "metrics", "containerPort": 8002},
        ],
        "resources": {
            "requests": {
                "cpu": settings.cpu_request,
                "memory": settings.memory_request,
                resource: 1,
            },
            "limits": {resource: 1},
        },
        "readinessProbe": ready(),
        "startupProbe": {**ready(), "failureThreshold": 60},
        "livenessProbe": {"httpGet": {"path": "/v2/health/live", "port": "http"}},
        "volumeMounts": [
            {"name": "models", "mountPath": settings.model_repository_path, "readOnly": True}
        ],
    }


def deployment(
    pool: PoolSpec,
    resource: str,
    nodes: Sequence[str],
    replicas: int,
    plan: PlacementPlan,
    settings: ManifestSettings,
) -> dict[str, Any]:
    name = f"triton-{pool.name}-{_suffix(resource)}"
    labels = {
        "app.kubernetes.io/name": "triton",
        "app.kubernetes.io/instance": pool.name,
        POOL_LABEL: pool.name,
        **MANAGED_BY,
    }
    selector = {POOL_LABEL: pool.name, "infergate.io/resource": _suffix(resource)}
    tolerations = [t.model_dump(exclude_none=True) for t in pool.constraints.tolerations]
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": "kubernetes.io/hostname",
                                "operator": "In",
                                "values": sorted(nodes),
                            }
                        ]
                    }
                ]
            }
        }
    }
    pod_spec: dict[str, Any] = {
        "priorityClassName": pool.priority_class_name,
        "affinity": affinity,
        "containers": [_container(pool, resource, settings)],
        "volumes": [
            {
                "name": "models",
                "persistentVolumeClaim": {
                    "claimName": settings.model_repository_claim,
                    "readOnly": True,
                },
            }
        ],
    }
    if tolerations:
        pod_spec["tolerations"] = tolerations
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "namespace": settings.namespace,
            "labels": labels,
            "annotations": {"infergate.io/plan-id": plan.id},
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": {**labels, **selector}},
                "spec": pod_spec,
            },
        },
    }


def service(pool: PoolSpec, settings: ManifestSettings) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": f"triton-{pool.name}",
            "namespace": settings.namespace,
            "labels": {POOL_LABEL: pool.name, **MANAGED_BY},
        },
        "spec": {
            "clusterIP": "None",
            "selector": {POOL_LABEL: pool.name},
            "ports": [
                {"name": "http", "port": 8000, "targetPort": "http"},
                {"name": "grpc", "port": 8001, "targetPort": "grpc"},
                {"name": "metrics", "port": 8002, "targetPort": "metrics"},
            ],
        },
    }


def mig_config_map(plan: PlacementPlan, settings: ManifestSettings) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": settings.mig_config_map,
            "namespace": settings.gpu_operator_namespace,
            "labels": dict(MANAGED_BY),
        },
        "data": {"config.yaml": yaml.safe_dump(mig_parted_config(plan), sort_keys=False)},
    }


def node_label_patches(plan: PlacementPlan) -> list[dict[str, Any]]:
    """Partial Node objects: server-side apply sets only these labels."""
    return [
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": labels}}
        for node, labels in node_labels(plan).items()
    ]


def pool_objects(
    plan: PlacementPlan, pools: Sequence[PoolSpec], settings: ManifestSettings
) -> list[dict[str, Any]]:
    """Service and Deployments for every pool with instances, in pool order."""
    groups: dict[str, dict[str, list[str]]] = {}
    for gpu in plan.gpus:
        kind = GPU_TYPES[gpu.gpu_type]
        for inst in gpu.instances:
            if inst.pool is not None:
                resource = kind.resource_name(inst.profile_id)
                groups.setdefault(inst.pool, {}).setdefault(resource, []).append(gpu.node)
    objects: list[dict[str, Any]] = []
    for pool in pools:
        if pool.name not in groups:
            continue
        objects.append(service(pool, settings))
        for resource, nodes in sorted(groups[pool.name].items()):
            objects.append(
                deployment(pool, resource, sorted(set(nodes)), len(nodes), plan, settings)
            )
    return objects


def build_manifests(
    plan: PlacementPlan, pools: Sequence[PoolSpec], settings: ManifestSettings | None = None
) -> list[dict[str, Any]]:
    """Every object, in apply order: priorities and MIG config before the nodes are
    relabelled, and the nodes before the pods that need their new MIG devices."""
    settings = settings or ManifestSettings()
    return [
        *priority_classes(pools),
        mig_config_map(plan, settings),
        *node_label_patches(plan),
        *pool_objects(plan, pools, settings),
    ]


def to_yaml(objects: Sequence[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(list(objects), sort_keys=False)
