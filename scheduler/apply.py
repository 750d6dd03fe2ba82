"""Carry a plan out: roll it out on a cluster, or write the manifests to a folder.

On a cluster the order and the waiting are :mod:`scheduler.changeover`'s pure state
machine; this module only runs it: :func:`run_changeover` reads a snapshot, asks
:func:`scheduler.changeover.step` what to do, does it, and waits. :class:`KubernetesCluster`
is the thin layer over the Kubernetes API (reads and the six kinds of action); nothing in
it decides anything. No test here reaches a real API server: the state machine is tested
over recorded snapshots and a scripted cluster (``tests/scheduler/fake_cluster.py``).
"""

from __future__ import annotations

import json
import logging
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from gateway.netaddr import join_host_port
from scheduler.changeover import (
    Action,
    Apply,
    Changeover,
    ChangeoverSettings,
    ChangeoverState,
    ClusterSnapshot,
    Cordon,
    Delete,
    DeploymentView,
    Evict,
    PodView,
    Relabel,
    SetRotation,
    build_changeover,
    managed_selector,
    nodes_in,
    pending_count,
    step,
)
from scheduler.errors import ApplyFailed
from scheduler.manifests import (
    NODE_LABEL,
    POOL_LABEL,
    ROTATION_LABEL,
    ManifestSettings,
    build_manifests,
    to_yaml,
)
from scheduler.migparted import MIG_CONFIG_LABEL, MIG_CONFIG_STATE_LABEL, mig_parted_config
from scheduler.plan import PlanRecord
from scheduler.render import plan_svg

FIELD_MANAGER = "infergate-scheduler"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AppliedObject:
    kind: str
    name: str
    namespace: str | None
    where: str
    """The file written, or ``cluster``."""


def _is_node_phase(obj: dict[str, Any]) -> bool:
    return obj["kind"] in ("PriorityClass", "ConfigMap", "Node")


def write_directory(
    record: PlanRecord, directory: Path, settings: ManifestSettings | None = None
) -> list[AppliedObject]:
    """Write numbered manifest files (apply with ``kubectl apply --server-side -f``),
    the raw mig-parted config, the plan record and the layout picture."""
    objects = build_manifests(record.plan, record.request.pools, settings)
    groups = {
        "00-priorityclasses.yaml": [o for o in objects if o["kind"] == "PriorityClass"],
        "10-mig-parted-configmap.yaml": [o for o in objects if o["kind"] == "ConfigMap"],
        "20-node-labels.yaml": [o for o in objects if o["kind"] == "Node"],
        "30-pools.yaml": [o for o in objects if not _is_node_phase(o)],
    }
    written: list[AppliedObject] = []
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for filename, group in groups.items():
            path = directory / filename
            path.write_text(to_yaml(group), encoding="utf-8")
            written += [
                AppliedObject(
                    o["kind"], o["metadata"]["name"], o["metadata"].get("namespace"), str(path)
                )
                for o in group
            ]
        (directory / "mig-parted-config.yaml").write_text(
            yaml.safe_dump(mig_parted_config(record.plan), sort_keys=False), encoding="utf-8"
        )
        (directory / "plan.json").write_text(record.model_dump_json(indent=2), encoding="utf-8")
        (directory / "layout.svg").write_text(plan_svg(record.plan), encoding="utf-8")
    except OSError as e:
        raise ApplyFailed(f"cannot write manifests to {directory}: {e}") from e
    return written


class ClusterApplier:
    """Server-side apply through a ``kubernetes.dynamic.DynamicClient``."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def apply(self, objects: Sequence[dict[str, Any]]) -> list[AppliedObject]:
        from kubernetes.client.exceptions import ApiException
        from kubernetes.dynamic.exceptions import DynamicApiError

        done = []
        for obj in objects:
            meta = obj["metadata"]
            try:
                resource = self.client.resources.get(
                    api_version=obj["apiVersion"], kind=obj["kind"]
                )
                self.client.server_side_apply(
                    resource,
                    body=obj,
                    name=meta["name"],
                    namespace=meta.get("namespace"),
                    field_manager=FIELD_MANAGER,
                    force_conflicts=True,
                )
            except (ApiException, DynamicApiError) as e:
                status = getattr(e, "status", None)
                raise ApplyFailed(
                    f"{obj['kind']}/{meta['name']}: the API server answered {status}"
                ) from e
            done.append(AppliedObject(obj["kind"], meta["name"], meta.get("namespace"), "cluster"))
        return done


class Cluster(Protocol):
    """What the changeover needs from a cluster: snapshots and actions."""

    def observe(self, changeover: Changeover, at: float,
                refusals: dict[str, str]) -> ClusterSnapshot:
        """The cluster as the changeover sees it now (quorum reads, not a cache)."""
        ...

    def execute(self, action: Action) -> str | None:
        """Carry out one action; an eviction refused (HTTP 429) returns why."""
        ...


@dataclass(frozen=True)
class ChangeoverResult:
    state: ChangeoverState
    applied: list[AppliedObject]


def run_changeover(
    changeover: Changeover,
    cluster: Cluster,
    settings: ChangeoverSettings | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    poll_s: float | None = None,
) -> ChangeoverResult:
    """Step the changeover until it is done or failed; waits ``poll_s`` (default: the
    settings') while a phase waits."""
    poll_s = poll_s if poll_s is not None else (settings or ChangeoverSettings()).poll_s
    state = ChangeoverState()
    refusals: dict[str, str] = {}
    applied: list[AppliedObject] = []
    while not state.finished:
        snapshot = cluster.observe(changeover, clock(), refusals)
        following, actions = step(changeover, state, snapshot, settings)
        refusals = {}
        for action in actions:
            refused = cluster.execute(action)
            if refused is not None and isinstance(action, Evict):
                refusals[action.pod] = refused
            if isinstance(action, Apply):
                applied += [
                    AppliedObject(o["kind"], o["metadata"]["name"],
                                  o["metadata"].get("namespace"), "cluster")
                    for o in action.objects
                ]  # fmt: skip
        if following.phase != state.phase:
            log.info("changeover: %s -> %s", state.phase, following.phase)
        elif not following.finished:
            sleep(poll_s)
        state = following
    return ChangeoverResult(state, applied)


def apply_plan(
    record: PlanRecord,
    cluster: Cluster,
    settings: ManifestSettings | None = None,
    changeover_settings: ChangeoverSettings | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[AppliedObject]:
    """Roll ``record`` out on ``cluster``; ApplyFailed with the changeover's reason."""
    result = run_changeover(build_changeover(record, settings), cluster, changeover_settings,
                            clock, sleep)
    if result.state.phase == "failed":
        raise ApplyFailed(f"changeover of {record.plan.id} failed: {result.state.reason}")
    return result.applied


def _ready(pod: Any) -> bool:
    conditions = (pod.status.conditions if pod.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def _scrape_pending(pod_ip: str | None, port: int = 8002, timeout_s: float = 1.0) -> int | None:
    if not pod_ip:
        return None
    try:
        with urllib.request.urlopen(f"http://{join_host_port(pod_ip, port)}/metrics",
                                    timeout=timeout_s) as r:
            return pending_count(r.read().decode("utf-8", "replace"))
    except OSError:
        return None


class KubernetesCluster:
    """:class:`Cluster` over the Kubernetes API (thin: reads and writes, no decisions)."""

    def __init__(self, api_client: Any, namespace: str) -> None:
        from kubernetes import client
        from kubernetes.dynamic import DynamicClient

        # Any: the generated client's Optional-everywhere models say nothing useful here.
        self.core: Any = client.CoreV1Api(api_client)
        self.apps: Any = client.AppsV1Api(api_client)
        self.scheduling: Any = client.SchedulingV1Api(api_client)
        self.applier = ClusterApplier(DynamicClient(api_client))
        self.namespace = namespace

    def observe(self, changeover: Changeover, at: float,
                refusals: dict[str, str]) -> ClusterSnapshot:
        labels, unschedulable, pods = {}, {}, []
        for name in nodes_in(changeover):
            node = self.core.read_node(name)
            labels[name] = dict(node.metadata.labels or {})
            unschedulable[name] = bool(node.spec.unschedulable)
            listed = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}")
            pods += [self._pod(p, name, scrape=True) for p in listed.items]
        seen = {p.name for p in pods}
        elsewhere = self.core.list_namespaced_pod(self.namespace, label_selector=POOL_LABEL)
        pods += [
            self._pod(p, (p.spec.node_name if p.spec else None) or "", scrape=False)
            for p in elsewhere.items
            if p.metadata.name not in seen
        ]
        deployments = [
            DeploymentView(d.metadata.name, d.metadata.namespace,
                           (d.metadata.labels or {}).get(NODE_LABEL), d.spec.replicas or 0,
                           (d.status.ready_replicas if d.status else 0) or 0)
            for d in self.apps.list_namespaced_deployment(
                self.namespace, label_selector=managed_selector()).items
        ]  # fmt: skip
        classes = {c.metadata.name: c.value for c in self.scheduling.list_priority_class().items}
        return ClusterSnapshot(at, labels, unschedulable, tuple(pods), tuple(deployments),
                               classes, dict(refusals))  # fmt: skip

    def _pod(self, pod: Any, node: str, scrape: bool) -> PodView:
        labels = pod.metadata.labels or {}
        resources = tuple(
            sorted(
                {
                    r
                    for c in pod.spec.containers or []
                    for r in ((c.resources.limits if c.resources else None) or {})
                    if r.startswith("nvidia.com/")
                }
            )
        )
        pool = labels.get(POOL_LABEL)
        return PodView(
            name=pod.metadata.name,
            namespace=pod.metadata.namespace,
            node=node,
            resources=resources,
            pool=pool,
            ready=_ready(pod),
            in_rotation=labels.get(ROTATION_LABEL, "in") != "out",
            rotation_labelled=ROTATION_LABEL in labels,
            terminating=pod.metadata.deletion_timestamp is not None,
            in_flight=(
                _scrape_pending(pod.status.pod_ip if pod.status else None)
                if pool and scrape
                else None
            ),
        )

    def execute(self, action: Action) -> str | None:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        try:
            if isinstance(action, Apply):
                self.applier.apply(action.objects)
            elif isinstance(action, Delete):
                if action.kind == "PriorityClass":
                    self.scheduling.delete_priority_class(action.name)
                else:
                    self.apps.delete_namespaced_deployment(action.name, action.namespace)
            elif isinstance(action, Cordon):
                self.core.patch_node(action.node, {"spec": {"unschedulable": action.unschedulable}})
            elif isinstance(action, SetRotation):
                value = "in" if action.in_rotation else "out"
                body = {"metadata": {"labels": {ROTATION_LABEL: value}}}
                self.core.patch_namespaced_pod(action.pod, action.namespace, body)
            elif isinstance(action, Evict):
                meta = client.V1ObjectMeta(name=action.pod, namespace=action.namespace)
                eviction = client.V1Eviction(
                    api_version="policy/v1", kind="Eviction", metadata=meta
                )
                self.core.create_namespaced_pod_eviction(action.pod, action.namespace, eviction)
            elif isinstance(action, Relabel):
                # One patch: the new config and no state, so that the next state seen
                # beside this config is this change's (a null removes a label).
                labels = {MIG_CONFIG_LABEL: action.config, MIG_CONFIG_STATE_LABEL: None}
                self.core.patch_node(action.node, {"metadata": {"labels": labels}})
        except ApiException as e:
            if e.status == 404 and isinstance(action, Delete | Evict):
                return None  # already gone
            if e.status == 429 and isinstance(action, Evict):
                return f"eviction refused: {_message(e)}"
            raise ApplyFailed(f"{type(action).__name__} {action}: API answered {e.status}") from e
        return None


def _message(e: Any) -> str:
    try:
        return str(json.loads(e.body).get("message", e.reason))
    except (TypeError, ValueError, AttributeError):
        return str(getattr(e, "reason", "refused"))


def kubernetes_cluster(
    kubeconfig: Path, context: str | None = None, namespace: str = "infergate"
) -> KubernetesCluster:
    """A KubernetesCluster for ``kubeconfig`` (contacts the API server when used)."""
    from kubernetes import config

    api_client = config.new_client_from_config(config_file=str(kubeconfig), context=context)
    return KubernetesCluster(api_client, namespace)
