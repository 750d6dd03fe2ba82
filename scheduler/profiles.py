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
    pci_device_ids: tuple[int, ...] = ()
    """PCI device ids (the high half of mig-parted's ``device-filter`` values,
    ``0x20B210DE`` = device 0x20B2 of vendor 0x10DE)."""

    def profile_name(self, profile_id: int) -> str:
        if profile_id == WHOLE_DEVICE:
            return "gpu"
        return self.profiles[profile_id][0]

    def profile_memory_gib(self, profile_id: int) -> float:
        if profile_id == WHOLE_DEVICE:
            return self.memory_gib
        return self.profiles[profile_id][1]

    def resolve_profile(self, ref: int | str) -> int | None:
        """Profile id for an id or a name label of this type; None if unknown here.

        The device plugin's spelling (``1g.10gb.me``, ``+`` is not allowed in a resource
        name or label key) is accepted beside the driver's (``1g.10gb+me``)."""
        if not self.mig_capable:
            return None
        if isinstance(ref, int):
            return ref if ref in self.profiles else None
        text = canonical_profile_name(ref)
        if text.isdigit():
            return self.resolve_profile(int(text))
        for pid, (name, _) in self.profiles.items():
            if name.lower() == text:
                return pid
        return None

    def resource_name(self, profile_id: int) -> str:
        """The Kubernetes extended resource (mixed strategy) that serves this profile:
        ``nvidia.com/mig-<name>`` with ``+`` replaced by ``.``, as the device plugin
        advertises it (``nvidia.com/mig-1g.10gb.me``)."""
        if profile_id == WHOLE_DEVICE or not self.mig_capable:
            return "nvidia.com/gpu"
        return "nvidia.com/mig-" + self.profile_name(profile_id).replace("+", ".")

    def matches_device_filter(self, device_filter: object) -> bool:
        """Whether a mig-parted entry's ``device-filter`` (absent, one string or a list of
        ``0x<device><vendor>`` ids) selects GPUs of this type."""
        if device_filter in (None, "", []):
            return True
        items = [device_filter] if isinstance(device_filter, str) else device_filter
        if not isinstance(items, list):
            return False
        for item in items:
            try:
                raw = int(str(item).split(":")[0], 0)
            except ValueError:
                continue
            if raw >> 16 in self.pci_device_ids and raw & 0xFFFF == NVIDIA_VENDOR_ID:
                return True
        return False


NVIDIA_VENDOR_ID = 0x10DE


def canonical_profile_name(name: str) -> str:
    """``MIG 1g.10gb.me`` / ``mig-1g.10gb+me`` -> ``1g.10gb+me`` (lower case)."""
    text = name.strip().lower().removeprefix("mig-").removeprefix("mig ").strip()
    if text.endswith(".me"):
        text = text[: -len(".me")] + "+me"
    return text


def _mig_type(
    name: str,
    memory_gib: float,
    names: tuple[str, str, str, str, str, str, str],
    memory: tuple[float, float, float, float, float, float, float],
    aliases: tuple[str, ...],
    pattern: str,
    pci_ids: tuple[int, ...],
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
        pci_device_ids=pci_ids,
    )


_NAMES_96GB = ("1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb")
# GiB per instance as `nvidia-smi mig -lgip` reports it (the smallest figure seen across
# drivers, so that a replica that fits here fits on every driver). Figures marked (est.)
# were not in any capture we had: they follow the 4g -> 7g ratio (x2.0) of the others.
# The inventory compares these with the device plugin's `nvidia.com/mig-<name>.memory`
# labels when it reads a cluster and reports any profile that is smaller there.
_GPU_TYPES: tuple[GpuType, ...] = (
    _mig_type(
        "A100-40GB",
        39.5,
        ("1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
        (4.75, 4.75, 9.62, 9.75, 19.62, 19.62, 39.5),
        ("A100", "A100-SXM4-40GB", "A100-PCIE-40GB", "A800-40GB"),
        r"a[18]00.*40gb",
        (0x20B0, 0x20B1, 0x20F1, 0x20F6),
    ),
    _mig_type(
        "A100-80GB",
        78.5,
        ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
        # A100-80GB lgip: 1g 9.50 (14 SMs), 2g 19.50, 3g/4g 39.25, 7g 78.50-79.12.
        (9.5, 9.5, 19.5, 19.5, 39.25, 39.25, 78.5),
        ("A100-SXM4-80GB", "A100-PCIE-80GB", "A100 80GB", "A800-80GB"),
        r"a[18]00.*80gb",
        (0x20B2, 0x20B5, 0x20F3, 0x20F5),
    ),
    _mig_type(
        "H100-80GB",
        79.25,
        ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
        (9.75, 9.75, 19.62, 19.62, 39.5, 39.5, 79.25),
        ("H100", "H100-SXM5-80GB", "H100-PCIE-80GB", "H100 80GB", "H800-80GB"),
        "",  # matched by gpu_type_from_product: the H100 label needs the memory size
        (0x2330, 0x2331, 0x2322, 0x2324),
    ),
    _mig_type(
        "H100-NVL",
        92.62,
        ("1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"),
        (10.75, 10.75, 21.5, 21.5, 46.12, 46.12, 92.62),
        ("H100 NVL", "H100NVL", "H100-NVL-94GB", "H100-94GB", "H800-NVL"),
        "",
        (0x2321, 0x233A),
    ),
    _mig_type(
        "H100-96GB",
        93.0,
        _NAMES_96GB,
        (10.75, 10.75, 23.0, 23.0, 46.5, 46.5, 93.0),  # 1g.12gb: as H100 NVL's (est.)
        ("H100 96GB", "H100-SXM5-96GB", "H20"),
        "",
        (0x233D, 0x20B6, 0x2329),
    ),
    _mig_type(
        "GH200-144GB",
        140.0,
        ("1g.18gb", "1g.18gb+me", "1g.36gb", "2g.36gb", "3g.72gb", "4g.72gb", "7g.144gb"),
        (17.5, 17.5, 35.25, 35.25, 70.0, 70.0, 140.0),  # 3g/4g/7g (est.)
        ("GH200 144GB", "GH200-144G-HBM3e"),
        r"gh200.*144g",
        (0x2348,),
    ),
    _mig_type(
        "GH200",
        93.0,
        _NAMES_96GB,
        (10.75, 10.75, 23.0, 23.0, 46.5, 46.5, 93.0),  # 1g.12gb (est.)
        ("GH200-96GB", "GH200-480GB", "GH200 480GB"),
        r"gh200",
        (0x2342,),
    ),
    _mig_type(
        "H200",
        139.0,
        ("1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
        (16.0, 16.0, 32.25, 32.25, 69.5, 69.5, 139.0),  # 7g (est.)
        ("H200-SXM-141GB", "H200 141GB", "H200-NVL"),
        r"(^|[^g])h200",  # not GH200: a different part with other profile sizes
        (0x2335, 0x233B),
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


def _h100_class(text: str, memory_mib: int | None) -> str:
    """Which H100 part a product label names: 80, 94 (NVL) or 96 GB differ in profile
    names and sizes. The label says so when it carries a size; otherwise GPU feature
    discovery's ``nvidia.com/gpu.memory`` (MiB) decides."""
    if "nvl" in text or "94gb" in text:
        return "H100-NVL"
    if "96gb" in text:
        return "H100-96GB"
    if "80gb" in text or memory_mib is None:
        return "H100-80GB"
    if memory_mib > 97_000:
        return "H100-96GB"
    return "H100-NVL" if memory_mib > 88_000 else "H100-80GB"


def gpu_type_from_product(product: str, memory_mib: int | None = None) -> GpuType | None:
    """Match a GPU feature discovery ``nvidia.com/gpu.product`` label to a type.

    Labels look like ``NVIDIA-A100-SXM4-80GB`` or, with the single strategy,
    ``NVIDIA-A100-SXM4-40GB-MIG-1g.5gb``; the MIG suffix is ignored. ``memory_mib`` is
    ``nvidia.com/gpu.memory``, used where the product does not name its size.
    """
    text = product.lower().split("-mig-")[0]
    if re.search(r"h[18]00", text) and not re.search(r"gh200|h200", text):
        return GPU_TYPES[_h100_class(text, memory_mib)]
    for t in _GPU_TYPES:
        if t.product_pattern and re.search(t.product_pattern, text):
            return t
    return None
