from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduler.k8s_inventory import MigPartedConfigs, NodeFacts, node_from_labels
from scheduler.migparted import MIG_CONFIG_LABEL, mig_parted_config, node_configs, node_labels
from scheduler.plan import PlacementPlan, PlanRecord
from scheduler.planner import plan_placement
from tests.scheduler.builders import gpu, node, pool, request

RECORDED = Path(__file__).parent / "recorded"


def planned_entries(plan: PlacementPlan) -> dict[str, Any]:
    configs = mig_parted_config(plan)["mig-configs"]
    return {k: v for k, v in configs.items() if k.startswith("infergate-")}


def test_mig_parted_config_lists_counts_by_name_when_node_has_mixed_layouts(
    example_record: PlanRecord,
) -> None:
    config = mig_parted_config(example_record.plan)
    assert config["version"] == "v1"
    name = node_configs(example_record.plan)["gpu-a100-0"]
    entries = config["mig-configs"][name]
    counted = {
        i: entry["mig-devices"]
        for entry in entries
        if entry["mig-enabled"]
        for i in (range(4) if entry["devices"] == "all" else entry["devices"])
    }
    for g in example_record.plan.gpus:
        if g.node == "gpu-a100-0" and g.mig_enabled:
            expected: dict[str, int] = {}
            for inst in g.instances:
                expected[inst.profile] = expected.get(inst.profile, 0) + 1
            assert counted[g.index] == expected
    assert "gpu-t4-0" not in node_configs(example_record.plan)
    yaml.safe_dump(config)  # serialisable as the ConfigMap's document


def test_mig_parted_config_uses_devices_all_when_every_gpu_is_the_same() -> None:
    nodes = [node("n", [gpu(0), gpu(1)])]
    plan = plan_placement(request(nodes, [pool("a", {0: 100}, target=200)]))
    (entry,) = planned_entries(plan).values()
    assert entry == [{"devices": "all", "mig-enabled": True, "mig-devices": {"7g.80gb": 1}}]


def test_mig_parted_entry_is_shared_when_nodes_have_identical_layouts() -> None:
    nodes = [node("a", [gpu(0)]), node("b", [gpu(0)])]
    plan = plan_placement(request(nodes, [pool("x", {0: 100}, target=200)]))
    names = node_configs(plan)
    assert names["a"] == names["b"] and len(planned_entries(plan)) == 1


def test_node_labels_cover_only_repartitioned_nodes_when_changed_only() -> None:
    nodes = [node("steady", [gpu(0, layout=[(0, 0, "a")])]), node("fresh", [gpu(0)])]
    plan = plan_placement(request(nodes, [pool("a", {0: 100}), pool("b", {0: 100})]))
    labels = node_labels(plan)
    assert list(labels) == ["fresh"]
    assert labels["fresh"][MIG_CONFIG_LABEL].startswith("infergate-")
    assert set(node_labels(plan, changed_only=False)) == {"steady", "fresh"}


def test_mig_parted_lists_profiles_biggest_first_when_mixed() -> None:
    nodes = [node("n", [gpu(0)])]
    plan = plan_placement(request(nodes, [pool("s", {19: 100}), pool("b", {9: 100})]))
    (entry,) = planned_entries(plan).values()
    assert list(entry[0]["mig-devices"]) == ["3g.40gb", "1g.10gb"]


def test_mig_parted_config_carries_the_operators_entries_when_it_replaces_the_default(
    example_record: PlanRecord,
) -> None:
    configs = mig_parted_config(example_record.plan)["mig-configs"]
    assert configs["all-disabled"] == [{"devices": "all", "mig-enabled": False}]
    assert configs["all-enabled"] == [{"devices": "all", "mig-enabled": True, "mig-devices": {}}]
    assert {"all-balanced", "all-1g.10gb", "all-1g.10gb.me", "all-7g.141gb"} <= set(configs)


def _layout(product: str, config: str, configs: MigPartedConfigs) -> tuple[bool, list[str]]:
    labels = {"nvidia.com/gpu.product": product, "nvidia.com/gpu.count": "1",
              "nvidia.com/mig.config": config}  # fmt: skip
    spec = node_from_labels(NodeFacts("n", labels), configs)
    assert spec is not None and spec.gpus[0].mig is not None
    mig = spec.gpus[0].mig
    return mig.enabled, sorted(str(i.profile) for i in mig.instances)


@pytest.mark.parametrize(
    "product",
    ["NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-NVL",
     "NVIDIA-H200"],
)  # fmt: skip
@pytest.mark.parametrize("config", ["all-disabled", "all-enabled", "all-1g.10gb", "all-balanced"])
def test_operator_entries_give_each_gpu_what_the_operators_own_config_gives_when_read(
    product: str, config: str
) -> None:
    cm = yaml.safe_load((RECORDED / "gpu-operator-default-mig-config.yaml").read_text())
    theirs = MigPartedConfigs.from_config_map(cm)
    assert theirs is not None
    nodes = [node("x", [gpu(0)])]
    ours = MigPartedConfigs(mig_parted_config(plan_placement(request(nodes, [])))["mig-configs"])
    assert _layout(product, config, ours) == _layout(product, config, theirs)
