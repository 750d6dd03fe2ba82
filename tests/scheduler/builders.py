"""Builders for scheduler tests: small fleets and pools written as plain data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scheduler.request import PlanningRequest, parse_request

EXAMPLES = Path(__file__).resolve().parents[2] / "scheduler" / "examples"

Slot = tuple[Any, int, str | None]
"""(profile, start slot, pool) of an existing instance."""


def gpu(
    index: int,
    kind: str = "A100-80GB",
    layout: list[Slot] | None = None,
    enabled: bool = True,
    pool: str | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"index": index, "type": kind}
    if layout is not None or not enabled:
        spec["mig"] = {
            "enabled": enabled,
            "instances": [{"profile": p, "start": s, "pool": o} for p, s, o in layout or []],
        }
    if pool is not None:
        spec["pool"] = pool
    return spec


def node(name: str, gpus: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"name": name, "gpus": gpus, **extra}


def pool(
    name: str,
    profile_rps: dict[Any, float] | None = None,
    target: float = 100.0,
    memory: float = 4.0,
    **extra: Any,
) -> dict[str, Any]:
    """A pool whose capacity is ``profile_rps`` (profile -> req/s; default 1g = 100)."""
    capacity = [{"profile": p, "rps": r} for p, r in (profile_rps or {19: 100.0}).items()]
    return {
        "name": name,
        "model": name,
        "memory_gib": memory,
        "target_rps": target,
        "capacity": capacity,
        **extra,
    }


def request(
    nodes: list[dict[str, Any]], pools: list[dict[str, Any]], **options: Any
) -> PlanningRequest:
    return parse_request({"fleet": {"nodes": nodes}, "pools": pools, "options": options})
