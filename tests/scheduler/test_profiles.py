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


@pytest.mark.parametrize("kind", [t.name for t in GPU_TYPES.values() if t.mig_capable])
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
        ("NVIDIA-H200-NVL", "H200"),
        ("NVIDIA-GH200-480GB", "GH200"),
        ("NVIDIA-GH200-144G-HBM3e", "GH200-144GB"),
        ("NVIDIA-H100-SXM5-94GB", "H100-NVL"),
        ("NVIDIA-H100-96GB", "H100-96GB"),
        ("NVIDIA-H800-80GB-HBM3", "H100-80GB"),
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


def test_gh200_is_not_read_as_h200_when_product_names_it() -> None:
    gh200 = gpu_type_from_product("NVIDIA-GH200-480GB")
    assert gh200 is not None and gh200.profile_name(19) == "1g.12gb"
    assert gh200.profile_name(9) == "3g.48gb" and gh200.profile_name(0) == "7g.96gb"
    big = gpu_type_from_product("NVIDIA-GH200-144G-HBM3e")
    assert big is not None and big.profile_name(15) == "1g.36gb"


@pytest.mark.parametrize(
    ("memory_mib", "expected"), [(81559, "H100-80GB"), (95830, "H100-NVL"), (97871, "H100-96GB")]
)
def test_h100_part_is_told_by_gpu_memory_when_product_omits_the_size(
    memory_mib: int, expected: str
) -> None:
    found = gpu_type_from_product("NVIDIA-H100-PCIe", memory_mib)
    assert found is not None and found.name == expected


def test_resource_name_replaces_plus_when_profile_has_media_extensions() -> None:
    kind = gpu_type("A100-40GB")
    assert kind.resource_name(20) == "nvidia.com/mig-1g.5gb.me"
    assert kind.resolve_profile("1g.5gb.me") == kind.resolve_profile("1g.5gb+me") == 20


def test_a100_80gb_memory_is_its_own_when_compared_with_h100() -> None:
    a100, h100 = gpu_type("A100-80GB"), gpu_type("H100-80GB")
    # nvidia-smi mig -lgip on an A100-80GB: 1g.10gb 9.50 GiB, 3g.40gb 39.25 GiB (H100: 9.75, 39.50)
    assert a100.profile_memory_gib(19) == 9.5 and a100.profile_memory_gib(9) == 39.25
    assert h100.profile_memory_gib(19) == 9.75
    assert a100.profiles != h100.profiles


def test_device_filter_matches_pci_ids_of_the_type_when_given_as_string_or_list() -> None:
    a100_80 = gpu_type("A100-80GB")
    assert a100_80.matches_device_filter(None)
    assert a100_80.matches_device_filter("0x20B210DE")
    assert a100_80.matches_device_filter(["0x20B010DE", "0x20B510DE"])
    assert not a100_80.matches_device_filter(["0x20B010DE"])  # an A100-40GB
    assert not gpu_type("H200").matches_device_filter("0x234810DE")  # a GH200 144G
