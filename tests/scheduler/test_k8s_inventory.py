from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import yaml

from scheduler.errors import UnsupportedCluster
from scheduler.inventory import NodeSpec
from scheduler.k8s_inventory import (
    MIG_CONFIG_MAPS,
    PRODUCT,
    MigPartedConfigs,
    NodeFacts,
    PodFacts,
    fleet_from_facts,
    memory_mismatches,
    node_facts,
    node_from_labels,
    pod_facts,
    read_fleet,
    resolve_profile_name,
)
from scheduler.manifests import ManifestSettings
from scheduler.profiles import gpu_type
from scheduler.request import PlanningRequest, check_request

A100 = {
    "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
    "nvidia.com/gpu.count": "2",
    "nvidia.com/mig.strategy": "mixed",
    "nvidia.com/cuda.driver.major": "550",
    "nvidia.com/cuda.driver.minor": "54",
    "nvidia.com/cuda.driver.rev": "15",
}


def test_resolve_profile_name_tolerates_driver_drift_when_name_differs() -> None:
    kind = gpu_type("A100-80GB")
    assert resolve_profile_name(kind, "3g.39gb") == 9
    assert resolve_profile_name(kind, "7g.79gb") == 0
    assert resolve_profile_name(kind, "1g.20gb") == 15
    assert resolve_profile_name(kind, "1g.10gb+me") == 20
    assert resolve_profile_name(kind, "bogus") is None


def test_node_from_labels_spreads_mig_counts_when_no_config_is_known() -> None:
    labels = {**A100, "nvidia.com/mig-4g.40gb.count": "1", "nvidia.com/mig-3g.40gb.count": "2",
              "nvidia.com/mig-1g.10gb.count": "3"}  # fmt: skip
    spec = node_from_labels(NodeFacts("n1", labels))
    assert spec is not None and spec.driver_version == "550.54.15"
    counts = sorted(len(g.mig.instances) for g in spec.gpus if g.mig)
    assert counts == [2, 4]  # 4g+3g on one GPU, 3g+3x1g on the other
    req = PlanningRequest.model_validate({"fleet": {"nodes": [spec.model_dump()]}})
    assert check_request(req) == []  # start slots are valid and do not overlap


def test_node_from_labels_uses_mig_parted_entry_when_label_names_it() -> None:
    configs = MigPartedConfigs.from_yaml(
        """
version: v1
mig-configs:
  custom:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"1g.10gb": 7}
    - devices: [1]
      mig-enabled: false
"""
    )
    spec = node_from_labels(NodeFacts("n1", {**A100, "nvidia.com/mig.config": "custom"}), configs)
    assert spec is not None
    first, second = spec.gpus
    assert first.mig is not None and [i.start for i in first.mig.instances] == list(range(7))
    assert second.mig is not None and not second.mig.enabled


def test_node_from_labels_assigns_pools_from_pods_when_resources_match() -> None:
    labels = {**A100, "nvidia.com/gpu.count": "1", "nvidia.com/mig-3g.40gb.count": "2"}
    pods = [PodFacts("n1", "web", "nvidia.com/mig-3g.40gb")]
    spec = node_from_labels(NodeFacts("n1", labels), pods=pods)
    assert spec is not None and spec.gpus[0].mig is not None
    assert [i.pool for i in spec.gpus[0].mig.instances] == ["web", None]


def test_node_from_labels_models_whole_gpus_when_type_has_no_mig() -> None:
    labels = {"nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.count": "2"}
    spec = node_from_labels(NodeFacts("t4", labels), pods=[PodFacts("t4", "tok", "nvidia.com/gpu")])
    assert spec is not None
    assert [(g.type, g.pool) for g in spec.gpus] == [("T4", "tok"), ("T4", None)]


def test_node_from_labels_ignores_node_when_it_has_no_known_gpu() -> None:
    assert node_from_labels(NodeFacts("cpu", {"kubernetes.io/os": "linux"})) is None
    assert node_from_labels(NodeFacts("l40s", {"nvidia.com/gpu.product": "NVIDIA-L40S",
                                               "nvidia.com/gpu.count": "1"})) is None  # fmt: skip


def test_node_from_labels_marks_old_driver_when_major_is_470() -> None:
    labels = {**A100, "nvidia.com/cuda.driver.major": "470", "nvidia.com/cuda.driver.minor": "82"}
    spec = node_from_labels(NodeFacts("old", labels))
    assert spec is not None and not spec.allows_4g_with_3g


def test_node_and_pod_facts_parse_api_json_when_given_dicts() -> None:
    n = node_facts({"metadata": {"name": "n1", "labels": A100},
                    "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}})  # fmt: skip
    assert n.name == "n1" and n.taints[0].key == "k" and n.taints[0].value == ""
    pod = {
        "metadata": {"labels": {"infergate.io/pool": "web"}},
        "spec": {
            "nodeName": "n1",
            "containers": [{"resources": {"limits": {"nvidia.com/mig-1g.10gb": "1", "cpu": "2"}}}],
        },
    }
    assert pod_facts(pod) == [PodFacts("n1", "web", "nvidia.com/mig-1g.10gb")]
    assert pod_facts({"metadata": {}, "spec": {}}) == []
    fleet = fleet_from_facts([n, NodeFacts("cpu", {})])
    assert [x.name for x in fleet.nodes] == ["n1"]


# --- a real GPU Operator cluster (issue 12, points 4, 5, 8, 10) -------------------------

RECORDED = Path(__file__).parent / "recorded"


def operator_configs() -> MigPartedConfigs:
    cm = yaml.safe_load((RECORDED / "gpu-operator-default-mig-config.yaml").read_text())
    configs = MigPartedConfigs.from_config_map(cm)
    assert configs is not None
    return configs


def counts_of_first_gpu(spec: NodeSpec | None) -> dict[str, int]:
    assert spec is not None and spec.gpus[0].mig is not None
    kind = gpu_type(spec.gpus[0].type)
    out: dict[str, int] = {}
    for inst in spec.gpus[0].mig.instances:
        name = kind.profile_name(kind.resolve_profile(inst.profile) or 0)
        out[name] = out.get(name, 0) + 1
    return out


@pytest.mark.parametrize(
    ("product", "expected"),
    [
        ("NVIDIA-A100-SXM4-80GB", {"1g.10gb": 7}),
        ("NVIDIA-H100-80GB-HBM3", {"1g.10gb": 7}),
        ("NVIDIA-A100-SXM4-40GB", {"1g.10gb": 4}),
    ],
)
def test_node_from_labels_honours_device_filter_when_operator_entry_differs_per_gpu(
    product: str, expected: dict[str, int]
) -> None:
    labels = {**A100, "nvidia.com/gpu.product": product, "nvidia.com/mig.config": "all-1g.10gb"}
    assert counts_of_first_gpu(node_from_labels(NodeFacts("n", labels), operator_configs())) == (
        expected
    )


def test_node_from_labels_reads_balanced_entry_for_its_own_gpu_when_filters_list_others() -> None:
    labels = {**A100, "nvidia.com/gpu.product": "NVIDIA-H200", "nvidia.com/mig.config":
              "all-balanced"}  # fmt: skip
    spec = node_from_labels(NodeFacts("h200", labels), operator_configs())
    assert counts_of_first_gpu(spec) == {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}


def test_resolve_profile_name_refuses_other_gpus_names_when_not_mere_drift() -> None:
    a100_80 = gpu_type("A100-80GB")
    assert resolve_profile_name(a100_80, "1g.5gb") is None  # an A100-40GB profile
    assert resolve_profile_name(a100_80, "1g.12gb") is None  # an H100 NVL profile
    assert resolve_profile_name(gpu_type("H100-NVL"), "3g.40gb") is None
    assert resolve_profile_name(a100_80, "3g.39gb") == 9  # driver drift stays accepted


def test_node_from_labels_falls_back_to_labels_when_config_names_another_gpus_profile() -> None:
    configs = operator_configs()  # all-1g.5gb has no device-filter but only A100-40GB names
    labels = {**A100, "nvidia.com/gpu.count": "1", "nvidia.com/mig.config": "all-1g.5gb",
              "nvidia.com/mig-3g.40gb.count": "2"}  # fmt: skip
    assert counts_of_first_gpu(node_from_labels(NodeFacts("n", labels), configs)) == {"3g.40gb": 2}


def test_config_map_is_read_by_its_config_yaml_key_when_other_keys_come_first() -> None:
    cm = {"data": {"a-readme.txt": "not yaml: [", "config.yaml": "version: v1\nmig-configs:\n"
                   "  x:\n    - devices: all\n      mig-enabled: false\n"}}  # fmt: skip
    configs = MigPartedConfigs.from_config_map(cm)
    assert configs is not None and list(configs.configs) == ["x"]
    assert MigPartedConfigs.from_config_map({"data": {"other": "x"}}) is None


def test_read_fleet_looks_for_the_config_map_the_scheduler_writes_when_called() -> None:
    assert MIG_CONFIG_MAPS[0] == ManifestSettings().mig_config_map == "infergate-mig-parted-config"
    assert inspect.signature(read_fleet).parameters["config_maps"].default == MIG_CONFIG_MAPS


def test_node_from_labels_reads_me_profiles_when_device_plugin_spells_them_with_a_dot() -> None:
    labels = {**A100, "nvidia.com/gpu.count": "1", "nvidia.com/mig-1g.10gb.me.count": "1",
              "nvidia.com/mig-3g.40gb.count": "1"}  # fmt: skip
    pods = [PodFacts("n", "video", "nvidia.com/mig-1g.10gb.me")]
    spec = node_from_labels(NodeFacts("n", labels), pods=pods)
    assert spec is not None and spec.gpus[0].mig is not None
    owned = {(i.profile, i.pool) for i in spec.gpus[0].mig.instances}
    assert owned == {(20, "video"), (9, None)}


@pytest.mark.parametrize(
    "labels",
    [
        {"nvidia.com/mig.strategy": "single"},
        {"nvidia.com/mig.strategy": "", PRODUCT: "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"},
    ],
)
def test_node_from_labels_refuses_single_strategy_when_labels_show_it(
    labels: dict[str, str],
) -> None:
    facts = NodeFacts("single-0", {**A100, "nvidia.com/gpu.count": "14", **labels})
    with pytest.raises(UnsupportedCluster, match="single MIG strategy.*mixed"):
        node_from_labels(facts)


def test_memory_mismatches_report_profiles_smaller_than_the_table_when_labelled() -> None:
    labels = {**A100, "nvidia.com/mig-1g.10gb.memory": "9728",  # 9.50 GiB: as the table
              "nvidia.com/mig-3g.40gb.memory": "39000"}  # fmt: skip
    (warning,) = memory_mismatches(NodeFacts("n", labels))
    assert "3g.40gb" in warning and "38.09 GiB" in warning
