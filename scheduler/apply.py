"""Carry a plan out: server-side apply to a cluster, or write the manifests to a folder.

Order matters: PriorityClasses and the mig-parted ConfigMap first, then the node labels
that make MIG Manager repartition, then (optionally after the nodes report
``nvidia.com/mig.config.state=success``) the pools' Services and Deployments, whose pods
need the new MIG devices.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from scheduler.errors import ApplyFailed
from scheduler.manifests import ManifestSettings, build_manifests, to_yaml
from scheduler.migparted import MIG_CONFIG_STATE_LABEL, mig_parted_config
from scheduler.plan import PlanRecord
from scheduler.render import plan_svg

FIELD_MANAGER = "infergate-scheduler"


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

    def __init__(
        self,
        client: Any,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.client = client
        self.clock = clock
        self.sleep = sleep

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

    def wait_for_mig(self, nodes: Sequence[str], timeout_s: float, poll_s: float = 5.0) -> None:
        """Wait until MIG Manager reports success on every node; fail fast on failure."""
        pending = set(nodes)
        deadline = self.clock() + timeout_s
        resource = self.client.resources.get(api_version="v1", kind="Node")
        while pending:
            for name in sorted(pending):
                labels = self.client.get(resource, name=name).metadata.labels or {}
                state = labels.get(MIG_CONFIG_STATE_LABEL)
                if state == "failed":
                    raise ApplyFailed(f"MIG Manager failed to repartition node {name}")
                if state == "success":
                    pending.discard(name)
            if pending and self.clock() >= deadline:
                raise ApplyFailed(f"MIG repartition not done in {timeout_s:g}s: {sorted(pending)}")
            if pending:
                self.sleep(poll_s)


def apply_plan(
    record: PlanRecord,
    applier: ClusterApplier,
    settings: ManifestSettings | None = None,
    wait_timeout_s: float | None = 900.0,
) -> list[AppliedObject]:
    objects = build_manifests(record.plan, record.request.pools, settings)
    first = [o for o in objects if _is_node_phase(o)]
    done = applier.apply(first)
    relabelled = [o["metadata"]["name"] for o in first if o["kind"] == "Node"]
    if relabelled and wait_timeout_s:
        applier.wait_for_mig(relabelled, wait_timeout_s)
    return done + applier.apply([o for o in objects if not _is_node_phase(o)])


def cluster_applier(kubeconfig: Path, context: str | None = None) -> ClusterApplier:
    """A ClusterApplier for the cluster in ``kubeconfig`` (contacts the API server)."""
    from kubernetes import config
    from kubernetes.dynamic import DynamicClient

    api_client = config.new_client_from_config(config_file=str(kubeconfig), context=context)
    return ClusterApplier(DynamicClient(api_client))
