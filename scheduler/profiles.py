"""GPU types and their MIG profile tables (../shared/reference/mig.md).

Everything is keyed on the profile id and its slice counts. Profile names such as
``3g.40gb`` are labels that differ per GPU type and drift with the driver; they are used
for output (mig-parted entries, ``nvidia.com/mig-<name>`` resources) and accepted as
input aliases, never as identity.

All MIG-capable types listed here share one placement shape: 8 memory slices, 7 compute
slices, and the same start slots per profile id.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

MEMORY_SLOTS = 8
COMPUTE_SLICES = 7
WHOLE_DEVICE = -1
"""Pseudo profile id for a GPU used whole (non-MIG types: T4, V100, L4)."""


@dataclass(frozen=True)
class MigProfile:
    """One MIG GPU-instance profile, independent of the GPU type's memory size."""

    id: int
    compute_slices: int
    memory_slices: int
    max_per_gpu: int
    start_slots: tuple[int, ...]
    media_extensions: bool = False

    def slot_mask(self, start: int) -> int:
        """Bitmask of the memory slots an instance starting at ``start`` occupies."""
        return ((1 << self.memory_slices) - 1) << start


# Ordered from most to least constrained (fewest start slots, biggest first): the order
# in which placement decisions are made and count vectors are laid out.
PROFILES: Mapping[int, MigProfile] = MappingProxyType(
    {
        0: MigProfile(0, 7, 8, 1, (0,)),
        5: MigProfile(5, 4, 4, 1, (0,)),
        9: MigProfile(9, 3, 4, 2, (0, 4)),
        14: MigProfile(14, 2, 2, 3, (0, 2, 4)),
        15: MigProfile(15, 1, 2, 4, (0, 2, 4, 6)),
        20: MigProfile(20, 1, 1, 1, (0, 1, 2, 3, 4, 5, 6), media_extensions=True),
        19: MigProfile(19, 1, 1, 7, (0, 1, 2, 3, 4, 5, 6)),
    }
)
PROFILE_ORDER: tuple[int, ...] = tuple(PROFILES)
PROFILE_INDEX: Mapping[int, int] = MappingProxyType({p: i for i, p in enumerate(PROFILE_ORDER)})


@dataclass(frozen=True)
class GpuType:
    """A GPU model. ``profiles`` maps profile id -> (name label, usable memory GiB)."""

    name: str
    memory_gib: float
    mig_capable: bool
    profiles: Mapping[int, tuple[str, float]] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()
    # Regex over the lower-cased GPU feature discovery product label; types are tried
    # in catalogue order, so more specific patterns come first.
    product_pattern: str = ""

    def profile_name(self, profile_id: int) -> str:
        if profile_id == WHOLE_DEVICE:
            return "gpu"
        return self.profiles[profile_id][0]

    def profile_memory_gib(self, profile_id: int) -> float:
        if profile_id == WHOLE_DEVICE:
            return self.memory_gib
        return self.profiles[profile_id][1]

    def resolve_profile(self, ref: int | str) -> int | None:
        """Profile id for an id or a name label of this type; None if unknown here."""
        if not self.mig_capable:
            return None
        if isinstance(ref, int):
            return ref if ref in self.profiles else None
        text = ref.strip().lower().removeprefix("mig-")
        if text.isdigit():
            return self.resolve_profile(int(text))
        for pid, (name, _) in self.profiles.items():
            if name.lower() == text:
                return pid
        return None

    def resource_name(self, profile_id: int) -> str:
        """The Kubernetes extended resource (mixed strategy) that serves this profile."""
        if profile_id == WHOLE_DEVICE or not self.mig_capable:
            return "nvidia.com/gpu"
        return f"nvidia.com/mig-{self.profile_name(profile_id)}"


def _mig_type(
    name: str,
    memory_gib: float,
    names: tuple[str, str, str, str, str, str, str],
    memory: tuple[float, float, float, float, float, float, float],
    aliases: tuple[str, ...],
    pattern: str,
) -> GpuType:
    # names/memory are given in the column order of mig.md: 19, 20, 15, 14, 9, 5, 0.
    ids = (19, 20, 15, 14, 9, 5, 0)
    return GpuType(
        name=name,
        memory_gib=memory_gib,
        mig_capable=True,
        profiles=MappingProxyType(
            {pid: (label, gib) for pid, label, gib in zip(ids, names, memory, strict=True)}
        ),
        aliases=aliases,
        product_pattern=pattern,
    )


# Usable memory per profile: A100/H100-80GB from `nvidia-smi mig -lgip` (mig.md);
# A100-40GB likewise; H100 NVL and H200 are the nominal size x 0.95 (conservative until
# read from the device plugin's `.memory` labels at run time).
_GPU_TYPES: tuple[GpuType, ...] = (
    _mig_type(
        "A100-40GB",
        39.5,
        ("1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
        (4.75, 4.75, 9.62, 9.75, 19.62, 19.62, 39.5),
        ("A100", "A100-SXM4-40GB", "A100-PCIE-40GB"),
        r"a100.*40gb",
    ),
    _mig_type(
        "A100-80GB",
        79.25,
        ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
        (9.75, 9.75, 19.62, 19.62, 39.5, 39.5, 79.25),
        ("A100-SXM4-80GB", "A100-PCIE-80GB", "A100 80GB"),
        r"a100.*80gb",
    ),
    _mig_type(
        "H100-80GB",
        79.25,
        ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
        (9.75, 9.75, 19.62, 19.62, 39.5, 39.5, 79.25),
        ("H100", "H100-SXM5-80GB", "H100-PCIE-80GB", "H100 80GB"),
        r"h100(?!.*nvl)",
    ),
    _mig_type(
        "H100-NVL",
        89.3,
        ("1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"),
        (11.4, 11.4, 22.8, 22.8, 44.65, 44.65, 89.3),
        ("H100 NVL", "H100NVL", "H100-NVL-94GB"),
        r"h100.*nvl",
    ),
    _mig_type(
        "H200",
        133.95,
        ("1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
        (17.1, 17.1, 33.25, 33.25, 67.45, 67.45, 133.95),
        ("H200-SXM-141GB", "H200 141GB"),
        r"h200",
    ),
    GpuType(
        "T4", 15.0, False, aliases=("Tesla-T4", "Tesla T4"), product_pattern=r"(^|[-_ ])t4($|[-_ ])"
    ),
    GpuType(
        "V100", 31.75, False, aliases=("V100-SXM2-32GB", "Tesla-V100"), product_pattern=r"v100"
    ),
    GpuType("L4", 22.5, False, aliases=("NVIDIA L4",), product_pattern=r"(^|[-_ ])l4($|[-_ ])"),
)

GPU_TYPES: Mapping[str, GpuType] = MappingProxyType({t.name: t for t in _GPU_TYPES})
_BY_ALIAS: Mapping[str, GpuType] = MappingProxyType(
    {alias.lower(): t for t in _GPU_TYPES for alias in (t.name, *t.aliases)}
)


def gpu_type(name: str) -> GpuType:
    """The GPU type for a canonical name or alias; KeyError naming the known types."""
    found = _BY_ALIAS.get(name.strip().lower())
    if found is None:
        raise KeyError(f"unknown GPU type {name!r}; known: {', '.join(GPU_TYPES)}")
    return found


def gpu_type_from_product(product: str) -> GpuType | None:
    """Match a GPU feature discovery ``nvidia.com/gpu.product`` label to a type.

    Labels look like ``NVIDIA-A100-SXM4-80GB`` or, with the single strategy,
    ``NVIDIA-A100-SXM4-40GB-MIG-1g.5gb``; the MIG suffix is ignored.
    """
    text = product.lower().split("-mig-")[0]
    for t in _GPU_TYPES:
        if t.product_pattern and re.search(t.product_pattern, text):
            return t
    return None
