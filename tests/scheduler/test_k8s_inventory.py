from __future__ import annotations

from scheduler.k8s_inventory import (
    MigPartedConfigs,
    NodeFacts,
    PodFacts,
    fleet_from_facts,
    node_facts,
    node_from_labels,
    pod_facts,
    resolve_profile_name,
)
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
