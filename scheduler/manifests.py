"""Kubernetes objects for a plan: PriorityClasses, the mig-parted ConfigMap, node label
patches, and per pool a headless Service, a PodDisruptionBudget and one Triton
Deployment per (MIG resource, node).

A container should request one MIG device type only (mixed strategy), and the resource
name differs per GPU type (``3g.40gb`` on an H100-80GB, ``3g.71gb`` on an H200). The
plan's per-node counts are enforced, not hoped for: each Deployment is pinned to one
node (``nodeSelector: kubernetes.io/hostname``) with exactly the replicas the plan put
there, so replicas of one pool cannot pile onto one node and take devices the plan gave
another pool of the same profile. Updates replace one pod at a time without a surge
(a surge pod would wait for a MIG device that does not exist).

The Service selects ready pods that are *in rotation* (``infergate.io/rotation: in``):
the changeover takes a pod out of the gateway's rotation by relabelling it before it is
evicted, so in-flight requests finish while no new ones arrive. The PodDisruptionBudget
(``maxUnavailable: 1``) is what evictions respect while the rest of the pool serves.

A PriorityClass' ``value`` cannot change after creation (the API server rejects the
update, server-side apply included); :mod:`scheduler.changeover` recreates a class whose
value the plan changes.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from scheduler.migparted import mig_parted_config, node_labels
from scheduler.plan import PlacementPlan
from scheduler.pools import PoolSpec
from scheduler.profiles import GPU_TYPES

TRITON_IMAGE = "nvcr.io/nvidia/tritonserver:25.04-py3"
MANAGED_BY = {"app.kubernetes.io/managed-by": "infergate-scheduler"}
POOL_LABEL = "infergate.io/pool"
NODE_LABEL = "infergate.io/node"
RESOURCE_LABEL = "infergate.io/resource"
ROTATION_LABEL = "infergate.io/rotation"
"""``in``: the pool's Service routes to the pod; ``out``: taken out before an eviction."""
HOSTNAME_LABEL = "kubernetes.io/hostname"


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


def deployment_name(pool: str, resource: str, node: str) -> str:
    """``triton-<pool>-<resource>-<node hash>``, hashed whole when over 63 characters
    (a DNS label: the pods' hostnames derive from it)."""
    digest = hashlib.sha256(node.encode()).hexdigest()[:8]
    name = f"triton-{pool}-{_suffix(resource)}-{digest}"
    if len(name) <= 63:
        return name
    return f"triton-{pool}-{hashlib.sha256(f'{resource}/{node}'.encode()).hexdigest()[:12]}"


def deployment(
    pool: PoolSpec,
    resource: str,
    node: str,
    replicas: int,
    plan: PlacementPlan,
    settings: ManifestSettings,
) -> dict[str, Any]:
    labels = {
        "app.kubernetes.io/name": "triton",
        "app.kubernetes.io/instance": pool.name,
        POOL_LABEL: pool.name,
        **MANAGED_BY,
    }
    selector = {POOL_LABEL: pool.name, RESOURCE_LABEL: _suffix(resource), NODE_LABEL: node}
    tolerations = [t.model_dump(exclude_none=True) for t in pool.constraints.tolerations]
    pod_spec: dict[str, Any] = {
        "priorityClassName": pool.priority_class_name,
        "nodeSelector": {HOSTNAME_LABEL: node},
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
            "name": deployment_name(pool.name, resource, node),
            "namespace": settings.namespace,
            "labels": {**labels, **selector},
            "annotations": {"infergate.io/plan-id": plan.id},
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
            },
            "template": {
                "metadata": {"labels": {**labels, **selector, ROTATION_LABEL: "in"}},
                "spec": pod_spec,
            },
        },
    }


def disruption_budget(pool: PoolSpec, settings: ManifestSettings) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {
            "name": f"triton-{pool.name}",
            "namespace": settings.namespace,
            "labels": {POOL_LABEL: pool.name, **MANAGED_BY},
        },
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {POOL_LABEL: pool.name}}},
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
            "selector": {POOL_LABEL: pool.name, ROTATION_LABEL: "in"},
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


def placements_by_node(plan: PlacementPlan) -> dict[str, dict[tuple[str, str], int]]:
    """pool -> (resource, node) -> instances the plan gives it there."""
    groups: dict[str, dict[tuple[str, str], int]] = {}
    for gpu in plan.gpus:
        kind = GPU_TYPES[gpu.gpu_type]
        for inst in gpu.instances:
            if inst.pool is not None:
                key = (kind.resource_name(inst.profile_id), gpu.node)
                per_pool = groups.setdefault(inst.pool, {})
                per_pool[key] = per_pool.get(key, 0) + 1
    return groups


def pool_objects(
    plan: PlacementPlan, pools: Sequence[PoolSpec], settings: ManifestSettings
) -> list[dict[str, Any]]:
    """Service, PodDisruptionBudget and per-node Deployments for every pool with
    instances, in pool order."""
    groups = placements_by_node(plan)
    objects: list[dict[str, Any]] = []
    for pool in pools:
        if pool.name not in groups:
            continue
        objects.append(service(pool, settings))
        objects.append(disruption_budget(pool, settings))
        for (resource, node), n in sorted(groups[pool.name].items()):
            objects.append(deployment(pool, resource, node, n, plan, settings))
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
