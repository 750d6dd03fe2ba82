"""mig-parted configuration and node labels for a plan (schema in mig.md).

mig-parted configs are counts per profile name, never slot positions; the plan has
checked that each GPU's counts are placeable. One config entry per distinct node layout,
named after its content (``infergate-<hash>``), so identical nodes share an entry and an
unchanged layout keeps its name across plans. Profiles are listed most constrained first
(biggest instances first), the order in which creating them cannot strand a later one.
A GPU the plan does not rebuild is listed with its current counts, idle instances
included: mig-parted then skips it (``Skipping -- already set to desired value``).

Once the ClusterPolicy's ``migManager.config.name`` points at this document it is the
only one the MIG manager knows, so it also carries the GPU Operator's standard entries
(``all-disabled``, the operator's usual default for unlabelled nodes, ``all-enabled``,
``all-balanced`` and ``all-<profile>``), generated from the profile tables with each
GPU type's ``device-filter``: a node labelled with one of them (or left at the default)
keeps passing ``nvidia-mig-parted assert --valid-config``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from scheduler.plan import GpuPlan, PlacementPlan
from scheduler.profiles import GPU_TYPES, PROFILE_ORDER, PROFILES, GpuType

MIG_CONFIG_LABEL = "nvidia.com/mig.config"
MIG_CONFIG_STATE_LABEL = "nvidia.com/mig.config.state"


def _device_layout(gpu: GpuPlan) -> tuple[bool, tuple[tuple[str, int], ...]]:
    counts: dict[int, int] = {}
    for inst in gpu.instances:
        counts[inst.profile_id] = counts.get(inst.profile_id, 0) + 1
    kind = GPU_TYPES[gpu.gpu_type]
    ordered = tuple((kind.profile_name(pid), counts[pid]) for pid in PROFILE_ORDER if pid in counts)
    return gpu.mig_enabled, ordered


def node_entry(gpus: list[GpuPlan]) -> list[dict[str, Any]]:
    """The mig-parted device entries for one node's MIG-capable GPUs."""
    groups: dict[tuple[bool, tuple[tuple[str, int], ...]], list[int]] = {}
    for gpu in sorted(gpus, key=lambda g: g.index):
        groups.setdefault(_device_layout(gpu), []).append(gpu.index)
    entries = []
    for (enabled, devices), indexes in groups.items():
        entry: dict[str, Any] = {
            "devices": "all" if len(groups) == 1 else indexes,
            "mig-enabled": enabled,
        }
        if enabled:
            entry["mig-devices"] = dict(devices)
        entries.append(entry)
    return entries


def config_name(entry: list[dict[str, Any]]) -> str:
    digest = hashlib.sha256(json.dumps(entry, sort_keys=True).encode()).hexdigest()
    return f"infergate-{digest[:10]}"


def _mig_gpus_by_node(plan: PlacementPlan) -> dict[str, list[GpuPlan]]:
    nodes: dict[str, list[GpuPlan]] = {}
    for gpu in plan.gpus:
        if GPU_TYPES[gpu.gpu_type].mig_capable:
            nodes.setdefault(gpu.node, []).append(gpu)
    return nodes


def _device_filter(kind: GpuType) -> list[str]:
    return [f"0x{pci:04X}10DE" for pci in kind.pci_device_ids]


BALANCED = {19: 2, 14: 1, 9: 1}
"""The operator's ``all-balanced``: two 1g, one 2g and one 3g instance per GPU."""


def operator_configs() -> dict[str, list[dict[str, Any]]]:
    """The GPU Operator's standard entries for every MIG-capable type we know."""
    kinds = [k for k in GPU_TYPES.values() if k.mig_capable]
    configs: dict[str, list[dict[str, Any]]] = {
        "all-disabled": [{"devices": "all", "mig-enabled": False}],
        "all-enabled": [{"devices": "all", "mig-enabled": True, "mig-devices": {}}],
        "all-balanced": [
            {
                "device-filter": _device_filter(k),
                "devices": "all",
                "mig-enabled": True,
                "mig-devices": {k.profile_name(p): n for p, n in BALANCED.items()},
            }
            for k in kinds
        ],
    }
    for pid in PROFILE_ORDER:
        for k in kinds:
            name = k.profile_name(pid)
            configs.setdefault(f"all-{name.replace('+', '.')}", []).append(
                {
                    "device-filter": _device_filter(k),
                    "devices": "all",
                    "mig-enabled": True,
                    "mig-devices": {name: PROFILES[pid].max_per_gpu},
                }
            )
    return configs


def mig_parted_config(plan: PlacementPlan) -> dict[str, Any]:
    """``version: v1`` document: the operator's standard entries, then one entry per
    distinct node layout of the plan."""
    configs: dict[str, list[dict[str, Any]]] = {}
    for gpus in _mig_gpus_by_node(plan).values():
        entry = node_entry(gpus)
        configs[config_name(entry)] = entry
    return {"version": "v1", "mig-configs": {**operator_configs(), **dict(sorted(configs.items()))}}


def node_configs(plan: PlacementPlan) -> dict[str, str]:
    """Node name -> mig-parted config name it should carry."""
    return {node: config_name(node_entry(gpus)) for node, gpus in _mig_gpus_by_node(plan).items()}


def node_labels(plan: PlacementPlan, changed_only: bool = True) -> dict[str, dict[str, str]]:
    """``nvidia.com/mig.config`` label per node; by default only nodes being repartitioned
    (relabelling a node makes MIG Manager stop its GPU clients while it applies)."""
    repartitioned = {g.node for g in plan.gpus if g.repartition}
    return {
        node: {MIG_CONFIG_LABEL: name}
        for node, name in sorted(node_configs(plan).items())
        if not changed_only or node in repartitioned
    }
