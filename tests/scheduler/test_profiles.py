from __future__ import annotations

import pytest

from scheduler.profiles import GPU_TYPES, PROFILES, gpu_type, gpu_type_from_product

# mig.md's table: profile id -> (compute slices, memory slices, max per GPU, start slots)
MIG_TABLE = {
    19: (1, 1, 7, (0, 1, 2, 3, 4, 5, 6)),
    20: (1, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
    15: (1, 2, 4, (0, 2, 4, 6)),
    14: (2, 2, 3, (0, 2, 4)),
    9: (3, 4, 2, (0, 4)),
    5: (4, 4, 1, (0,)),
    0: (7, 8, 1, (0,)),
}


def test_profiles_match_mig_table_when_read_by_id() -> None:
    for pid, (compute, memory, most, starts) in MIG_TABLE.items():
        p = PROFILES[pid]
        assert (p.compute_slices, p.memory_slices, p.max_per_gpu, p.start_slots) == (
            compute,
            memory,
            most,
            starts,
        )


def test_profiles_never_start_one_slice_instances_at_slot_7_when_listed() -> None:
    assert all(7 not in p.start_slots for p in PROFILES.values())


@pytest.mark.parametrize("kind", ["A100-40GB", "A100-80GB", "H100-80GB", "H100-NVL", "H200"])
def test_gpu_type_has_every_profile_when_mig_capable(kind: str) -> None:
    assert set(GPU_TYPES[kind].profiles) == set(MIG_TABLE)


def test_gpu_type_resolves_names_per_type_when_labels_differ() -> None:
    assert gpu_type("A100-40GB").resolve_profile("1g.10gb") == 15
    assert gpu_type("A100-80GB").resolve_profile("1g.10gb") == 19
    assert gpu_type("H200").resolve_profile("3g.71gb") == 9
    assert gpu_type("H100-80GB").resolve_profile(9) == 9
    assert gpu_type("H100-80GB").resolve_profile("3g.71gb") is None
    assert gpu_type("T4").resolve_profile(19) is None


def test_gpu_type_accepts_alias_when_name_has_spaces() -> None:
    assert gpu_type("H100 NVL").name == "H100-NVL"
    with pytest.raises(KeyError, match="known"):
        gpu_type("B200")


@pytest.mark.parametrize(
    ("product", "expected"),
    [
        ("NVIDIA-A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA-A100-SXM4-80GB-MIG-1g.10gb", "A100-80GB"),
        ("NVIDIA-A100-80GB-PCIe", "A100-80GB"),
        ("NVIDIA-H100-80GB-HBM3", "H100-80GB"),
        ("NVIDIA-H100-NVL", "H100-NVL"),
        ("NVIDIA-H200", "H200"),
        ("Tesla-T4", "T4"),
        ("NVIDIA-L4", "L4"),
        ("NVIDIA-L40S", None),
    ],
)
def test_gpu_type_from_product_matches_when_label_is_gfd_product(
    product: str, expected: str | None
) -> None:
    found = gpu_type_from_product(product)
    assert (found.name if found else None) == expected


def test_resource_name_follows_mixed_strategy_when_profile_is_mig() -> None:
    assert gpu_type("A100-40GB").resource_name(9) == "nvidia.com/mig-3g.20gb"
    assert gpu_type("T4").resource_name(-1) == "nvidia.com/gpu"
