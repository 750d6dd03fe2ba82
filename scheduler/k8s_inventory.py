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

What a real GPU Operator cluster looks like, and how it is read:

- the MIG manager's config is the ConfigMap the ClusterPolicy names
  (``infergate-mig-parted-config`` once the scheduler wrote it, else the operator's
  ``default-mig-parted-config``), document under the key ``config.yaml``;
- an entry applies to a GPU only when its ``device-filter`` (PCI device ids) matches the
  GPU, and of several matching entries the last one wins, as mig-parted walks them: the
  operator's ``all-1g.10gb`` is 7 x 1g.10gb on an A100-80GB / H100 but 4 x 1g.10gb (the
  2-slice profile) on an A100-40GB;
- a profile name is read on the node's own GPU type only, with the driver's naming drift
  tolerated within 1 GB (``3g.39gb`` for ``3g.40gb``), never mapped across types
  (``1g.5gb`` is not an A100-80GB profile);
- the device plugin spells ``+me`` profiles with a dot (``nvidia.com/mig-1g.10gb.me``);
- under the device plugin's ``single`` strategy MIG devices are ``nvidia.com/gpu`` and
  ``nvidia.com/gpu.count`` counts MIG devices, not GPUs: such nodes are refused with
  :class:`~scheduler.errors.UnsupportedCluster` (the plans and manifests are for the
  ``mixed`` strategy) instead of being misread.

The label parsing is pure (:func:`node_from_labels`); :func:`read_fleet` only fetches.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from scheduler.errors import UnsupportedCluster
from scheduler.inventory import Fleet, GpuSpec, MigInstanceSpec, MigState, NodeSpec, Taint
from scheduler.layouts import CountVector, add_profile, layout_table
from scheduler.profiles import (
    PROFILE_INDEX,
    PROFILE_ORDER,
    GpuType,
    canonical_profile_name,
    gpu_type_from_product,
)

log = logging.getLogger(__name__)

PRODUCT = "nvidia.com/gpu.product"
COUNT = "nvidia.com/gpu.count"
GPU_MEMORY = "nvidia.com/gpu.memory"
MIG_CONFIG = "nvidia.com/mig.config"
MIG_STRATEGY = "nvidia.com/mig.strategy"
MIG_CONFIG_KEY = "config.yaml"
"""The ConfigMap key the GPU Operator's MIG manager reads its mig-parted document from."""
MIG_CONFIG_MAPS = ("infergate-mig-parted-config", "default-mig-parted-config")
"""The ConfigMap the scheduler writes, then the operator's own default."""
DRIFT_GB = 1
"""How far a profile name's memory may drift with the driver and still be read as the
profile (``3g.39gb`` for ``3g.40gb``; ``1g.12gb`` is another GPU's profile, not drift)."""
_MIG_LABEL = re.compile(r"^nvidia\.com/mig-(?P<name>.+)\.(?P<what>count|memory)$")
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

    @classmethod
    def from_config_map(cls, config_map: Mapping[str, Any]) -> MigPartedConfigs | None:
        """The document under ``config.yaml`` (None when the key is absent)."""
        text = (config_map.get("data") or {}).get(MIG_CONFIG_KEY)
        return None if text is None else cls.from_yaml(text)


def resolve_profile_name(kind: GpuType, name: str) -> int | None:
    """Profile id for a name label, tolerating driver drift (``3g.39gb`` for ``3g.40gb``):
    same compute slices and media-extension flag, nearest memory size."""
    exact = kind.resolve_profile(name)
    if exact is not None:
        return exact
    wanted = _NAME.match(canonical_profile_name(name))
    if wanted is None:
        return None
    best: tuple[int, int] | None = None
    for pid, (label, _) in kind.profiles.items():
        have = _NAME.match(label.lower())
        if have is None or have["g"] != wanted["g"] or bool(have["me"]) != bool(wanted["me"]):
            continue
        distance = abs(int(have["gb"]) - int(wanted["gb"]))
        if distance <= DRIFT_GB and (best is None or distance < best[0]):
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
        if not kind.matches_device_filter(entry.get("device-filter")):
            continue  # meant for another GPU model (mig-parted skips it too)
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
    """The node as inventory, or None when it has no GPU the scheduler knows.

    Raises :class:`UnsupportedCluster` for a MIG-capable node under the device plugin's
    ``single`` strategy (its labels count MIG devices, not GPUs)."""
    labels = facts.labels
    kind = node_gpu_type(labels)
    count = int(labels.get(COUNT, "0") or 0)
    if kind is None or count == 0:
        return None
    if kind.mig_capable and single_strategy(labels):
        raise UnsupportedCluster(
            f"node {facts.name} runs the device plugin's single MIG strategy "
            f"({MIG_STRATEGY}={labels.get(MIG_STRATEGY, '?')}, product "
            f"{labels.get(PRODUCT, '?')}): its MIG devices are advertised as nvidia.com/gpu "
            f"and {COUNT} counts MIG devices, not GPUs; the scheduler plans per-profile "
            f"resources, so set the device plugin / GPU Operator mig.strategy to mixed"
        )
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
        for name, value in mig_labels(labels, "count").items():
            pid = resolve_profile_name(kind, name)
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


def node_gpu_type(labels: Mapping[str, str]) -> GpuType | None:
    memory = labels.get(GPU_MEMORY, "")
    return gpu_type_from_product(labels.get(PRODUCT, ""), int(memory) if memory.isdigit() else None)


def single_strategy(labels: Mapping[str, str]) -> bool:
    """The device plugin's single strategy: said by GPU feature discovery, or visible in a
    ``-MIG-<profile>`` product suffix."""
    return labels.get(MIG_STRATEGY) == "single" or "-mig-" in labels.get(PRODUCT, "").lower()


def mig_labels(labels: Mapping[str, str], what: str) -> dict[str, str]:
    """``nvidia.com/mig-<name>.<what>`` labels by profile name (``count``, ``memory``)."""
    out = {}
    for key, value in labels.items():
        match = _MIG_LABEL.match(key)
        if match and match["what"] == what:
            out[match["name"]] = value
    return out


def memory_mismatches(facts: NodeFacts) -> list[str]:
    """Profiles whose memory, as the device plugin labels it (``.memory``, MiB), is below
    the profile table's figure: sizing would trust memory the instance lacks."""
    kind = node_gpu_type(facts.labels)
    if kind is None or not kind.mig_capable:
        return []
    out = []
    for name, value in sorted(mig_labels(facts.labels, "memory").items()):
        pid = resolve_profile_name(kind, name)
        if pid is None or not value.isdigit():
            continue
        labelled, table = int(value) / 1024, kind.profile_memory_gib(pid)
        if labelled + 0.01 < table:
            out.append(
                f"node {facts.name}: {name} has {labelled:.2f} GiB by its label, the "
                f"{kind.name} table says {table:g} GiB"
            )
    return out


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
    namespace: str = "gpu-operator",
    config_maps: Sequence[str] = MIG_CONFIG_MAPS,
) -> Fleet:
    """Fetch nodes, pool pods and the mig-parted ConfigMap (the first of ``config_maps``
    that exists in ``namespace``), then parse them."""
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
    for name in config_maps:
        try:
            cm = as_json(api.read_namespaced_config_map(name, namespace))
        except ApiException as e:
            if e.status != 404:
                raise
            continue
        configs = MigPartedConfigs.from_config_map(cm)
        break
    for warning in (w for n in nodes for w in memory_mismatches(n)):
        log.warning("%s", warning)
    return fleet_from_facts(nodes, configs, pods)
