"""Read the fleet inventory from a Kubernetes cluster (GPU feature discovery labels).

Labels give per node: the product (``nvidia.com/gpu.product``), the GPU count, the
driver version, and with the mixed strategy the MIG devices per profile
(``nvidia.com/mig-3g.40gb.count``). They do not say which GPU holds which instance or
at which start slot. When the node's ``nvidia.com/mig.config`` names an entry of a
known mig-parted config, that entry gives the counts per GPU; otherwise the node's
counts are spread over its GPUs (most constrained profile first, each GPU kept
placeable). Start slots are then the least fragmented layout of each GPU's counts: the
driver's actual slots are not visible from Kubernetes. Pods labelled
``infergate.io/pool`` tell which pool uses which kind of instance.

The label parsing is pure (:func:`node_from_labels`); :func:`read_fleet` only fetches.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from scheduler.inventory import Fleet, GpuSpec, MigInstanceSpec, MigState, NodeSpec, Taint
from scheduler.layouts import CountVector, add_profile, layout_table
from scheduler.profiles import PROFILE_INDEX, PROFILE_ORDER, GpuType, gpu_type_from_product

PRODUCT = "nvidia.com/gpu.product"
COUNT = "nvidia.com/gpu.count"
MIG_CONFIG = "nvidia.com/mig.config"
_MIG_COUNT = re.compile(r"^nvidia\.com/mig-(?P<name>.+)\.count$")
_NAME = re.compile(r"^(?P<g>\d)g\.(?P<gb>\d+)gb(?P<me>\+me)?$")


@dataclass(frozen=True)
class NodeFacts:
    name: str
    labels: Mapping[str, str]
    taints: tuple[Taint, ...] = ()


@dataclass(frozen=True)
class PodFacts:
    node: str
    pool: str
    resource: str
    """e.g. ``nvidia.com/mig-3g.40gb``."""


@dataclass(frozen=True)
class MigPartedConfigs:
    """``mig-configs`` of a mig-parted document: name -> device entries."""

    configs: Mapping[str, Sequence[Mapping[str, Any]]] = field(default_factory=dict)

    @classmethod
    def from_yaml(cls, text: str) -> MigPartedConfigs:
        doc = yaml.safe_load(text) or {}
        return cls(doc.get("mig-configs", {}))


def resolve_profile_name(kind: GpuType, name: str) -> int | None:
    """Profile id for a name label, tolerating driver drift (``3g.39gb`` for ``3g.40gb``):
    same compute slices and media-extension flag, nearest memory size."""
    exact = kind.resolve_profile(name)
    if exact is not None:
        return exact
    wanted = _NAME.match(name.lower())
    if wanted is None:
        return None
    best: tuple[int, int] | None = None
    for pid, (label, _) in kind.profiles.items():
        have = _NAME.match(label.lower())
        if have is None or have["g"] != wanted["g"] or bool(have["me"]) != bool(wanted["me"]):
            continue
        distance = abs(int(have["gb"]) - int(wanted["gb"]))
        if best is None or distance < best[0]:
            best = (distance, pid)
    return None if best is None else best[1]


def _driver(labels: Mapping[str, str]) -> str | None:
    full = labels.get("nvidia.com/cuda.driver-version.full")
    if full:
        return full
    parts = [labels.get(f"nvidia.com/cuda.driver.{p}") for p in ("major", "minor", "rev")]
    present = [p for p in parts if p]
    return ".".join(present) if present and present[0] == parts[0] else None


def _counts_from_config(
    kind: GpuType, entries: Sequence[Mapping[str, Any]], gpus: int
) -> list[tuple[bool, dict[int, int]]] | None:
    per_gpu: list[tuple[bool, dict[int, int]] | None] = [None] * gpus
    for entry in entries:
        devices = entry.get("devices", "all")
        indexes = range(gpus) if devices == "all" else [int(i) for i in devices]
        counts: dict[int, int] = {}
        for name, n in (entry.get("mig-devices") or {}).items():
            pid = resolve_profile_name(kind, str(name))
            if pid is None:
                return None
            counts[pid] = counts.get(pid, 0) + int(n)
        for i in indexes:
            if 0 <= i < gpus:
                per_gpu[i] = (bool(entry.get("mig-enabled", True)), counts)
    if any(x is None for x in per_gpu):
        return None
    return [x for x in per_gpu if x is not None]


def _spread(kind: GpuType, totals: dict[int, int], gpus: int) -> list[tuple[bool, dict[int, int]]]:
    """Node-level counts spread over GPUs, most constrained profile first."""
    table = layout_table(True)
    vectors: list[CountVector] = [tuple(0 for _ in PROFILE_ORDER)] * gpus
    for pid in PROFILE_ORDER:
        for _ in range(totals.get(pid, 0)):
            for i, vec in enumerate(vectors):
                grown = add_profile(vec, pid)
                if table.placeable(grown):
                    vectors[i] = grown
                    break
            else:
                raise ValueError(f"MIG devices listed on the node do not fit {gpus} GPUs")
    return [
        (
            any(vec),
            {pid: vec[PROFILE_INDEX[pid]] for pid in PROFILE_ORDER if vec[PROFILE_INDEX[pid]]},
        )
        for vec in vectors
    ]


def _instances(
    counts: dict[int, int], allow_4g_3g: bool, pools: dict[int, list[str]]
) -> tuple[MigInstanceSpec, ...]:
    vec = tuple(counts.get(pid, 0) for pid in PROFILE_ORDER)
    layout = layout_table(allow_4g_3g).best_layout(vec)
    if layout is None:
        raise ValueError(f"MIG counts {counts} are not placeable on one GPU")
    out = []
    for pid, start in sorted(layout.placements, key=lambda p: p[1]):
        owners = pools.get(pid, [])
        out.append(
            MigInstanceSpec(profile=pid, start=start, pool=owners.pop(0) if owners else None)
        )
    return tuple(out)


def node_from_labels(
    facts: NodeFacts,
    configs: MigPartedConfigs | None = None,
    pods: Sequence[PodFacts] = (),
) -> NodeSpec | None:
    """The node as inventory, or None when it has no GPU the scheduler knows."""
    labels = facts.labels
    kind = gpu_type_from_product(labels.get(PRODUCT, ""))
    count = int(labels.get(COUNT, "0") or 0)
    if kind is None or count == 0:
        return None
    driver = _driver(labels)
    node = NodeSpec(name=facts.name, labels=dict(labels), taints=facts.taints,
                    driver_version=driver, gpus=())  # fmt: skip
    if not kind.mig_capable:
        gpus = [GpuSpec(index=i, type=kind.name) for i in range(count)]
        for i, pod in enumerate(p for p in pods if p.resource == "nvidia.com/gpu"):
            if i < count:
                gpus[i] = GpuSpec(index=i, type=kind.name, pool=pod.pool)
        return node.model_copy(update={"gpus": tuple(gpus)})
    per_gpu = None
    config_name = labels.get(MIG_CONFIG, "")
    if configs is not None and config_name in configs.configs:
        per_gpu = _counts_from_config(kind, configs.configs[config_name], count)
    if per_gpu is None:
        totals: dict[int, int] = {}
        for key, value in labels.items():
            match = _MIG_COUNT.match(key)
            pid = resolve_profile_name(kind, match["name"]) if match else None
            if pid is not None:
                totals[pid] = totals.get(pid, 0) + int(value)
        per_gpu = _spread(kind, totals, count)
    owners: dict[int, list[str]] = {}
    for pod in pods:
        pid = resolve_profile_name(kind, pod.resource.removeprefix("nvidia.com/mig-"))
        if pid is not None:
            owners.setdefault(pid, []).append(pod.pool)
    gpus = []
    for i, (enabled, counts) in enumerate(per_gpu):
        instances = _instances(counts, node.allows_4g_with_3g, owners) if enabled else ()
        gpus.append(
            GpuSpec(index=i, type=kind.name, mig=MigState(enabled=enabled, instances=instances))
        )
    return node.model_copy(update={"gpus": tuple(gpus)})


def fleet_from_facts(
    nodes: Sequence[NodeFacts],
    configs: MigPartedConfigs | None = None,
    pods: Sequence[PodFacts] = (),
) -> Fleet:
    specs = []
    for facts in nodes:
        spec = node_from_labels(facts, configs, [p for p in pods if p.node == facts.name])
        if spec is not None:
            specs.append(spec)
    return Fleet(nodes=tuple(specs))


def node_facts(node: Mapping[str, Any]) -> NodeFacts:
    """NodeFacts from a Node as JSON (``kubectl get node -o json``)."""
    meta = node.get("metadata") or {}
    taints = (node.get("spec") or {}).get("taints") or []
    return NodeFacts(
        name=meta["name"],
        labels=dict(meta.get("labels") or {}),
        taints=tuple(
            Taint(key=t["key"], value=t.get("value") or "", effect=t["effect"]) for t in taints
        ),
    )


def pod_facts(pod: Mapping[str, Any]) -> list[PodFacts]:
    """One PodFacts per NVIDIA resource a pool's pod holds (JSON form of a Pod)."""
    spec = pod.get("spec") or {}
    pool = ((pod.get("metadata") or {}).get("labels") or {}).get("infergate.io/pool")
    node = spec.get("nodeName")
    if not pool or not node:
        return []
    return [
        PodFacts(node, pool, resource)
        for c in spec.get("containers") or []
        for resource in ((c.get("resources") or {}).get("limits") or {})
        if resource.startswith("nvidia.com/")
    ]


def read_fleet(
    kubeconfig: Path,
    context: str | None = None,
    mig_config_map: tuple[str, str] = ("gpu-operator", "default-mig-parted-config"),
) -> Fleet:
    """Fetch nodes, pool pods and the mig-parted ConfigMap, then parse them."""
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException

    api_client = config.new_client_from_config(str(kubeconfig), context=context)
    api = client.CoreV1Api(api_client)

    def as_json(obj: Any) -> Any:
        return api_client.sanitize_for_serialization(obj)

    nodes = [node_facts(n) for n in as_json(api.list_node())["items"]]
    pods = [
        facts
        for pod in as_json(api.list_pod_for_all_namespaces(label_selector="infergate.io/pool"))[
            "items"
        ]
        for facts in pod_facts(pod)
    ]
    configs = None
    try:
        cm = as_json(api.read_namespaced_config_map(mig_config_map[1], mig_config_map[0]))
        configs = MigPartedConfigs.from_yaml(next(iter((cm.get("data") or {}).values()), ""))
    except ApiException as e:
        if e.status != 404:
            raise
    return fleet_from_facts(nodes, configs, pods)
