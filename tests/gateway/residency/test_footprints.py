"""A model's footprint: the largest of the configured figure, the converter's and what a
member measured; an estimate only until one is known."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from gateway.config import GatewayConfig
from gateway.pools import build_pools
from gateway.residency.footprints import Footprints

MB = 1_000_000


def gateway_config(models: dict[str, object]) -> GatewayConfig:
    return GatewayConfig.model_validate({
        "pools": [{"name": "p", "members": [{"http_port": 9}],
                   "residency": {"memory_budget_bytes": 800 * MB}}],
        "models": models})


def publish(repo: Path, model: str, version: int, size: int | None) -> None:
    folder = repo / model / str(version) / "report"
    folder.mkdir(parents=True)
    report = {"footprint": None if size is None else {"bytes": size, "method": "test"}}
    (folder / "report.json").write_text(json.dumps(report))


def test_the_largest_known_figure_wins(tmp_path: Path) -> None:
    config = gateway_config({"cfg": {"footprint_bytes": 50 * MB},
                             "both": {"footprint_bytes": 10 * MB}})
    pool = build_pools(config.pools)[0]
    publish(tmp_path, "both", 1, 30 * MB)
    publish(tmp_path, "conv", 1, 20 * MB)
    footprints = Footprints(config, httpx.AsyncClient(), tmp_path)
    footprints.refresh(["cfg", "both", "conv"])
    assert footprints.of("cfg", pool) == (50 * MB, "configured")
    assert footprints.of("both", pool) == (30 * MB, "converter")  # larger than configured
    assert footprints.of("conv", pool) == (20 * MB, "converter")
    footprints.measured("conv", 48 * MB)  # what the member reported once loaded
    assert footprints.of("conv", pool) == (48 * MB, "measured")
    footprints.measured("conv", 44 * MB)  # its last load's figure counts
    assert footprints.of("conv", pool) == (44 * MB, "measured")


def test_the_runtime_overhead_learned_is_added_to_a_converter_figure(tmp_path: Path) -> None:
    """The converter measures a session in a process with its libraries loaded; the
    member's runtime adds its own per model (a stub): learned from a model measured
    both ways, it is added to the figure of a model not loaded yet."""
    config = gateway_config({})
    pool = build_pools(config.pools)[0]
    publish(tmp_path, "a", 1, 20 * MB)
    publish(tmp_path, "b", 1, 5 * MB)
    footprints = Footprints(config, httpx.AsyncClient(), tmp_path)
    footprints.refresh(["a", "b"])
    assert footprints.overhead() == 0
    footprints.measured("a", 50 * MB)
    assert footprints.overhead() == 30 * MB
    assert footprints.of("b", pool) == (35 * MB, "converter")
    footprints.measured("b", 33 * MB)
    assert footprints.of("b", pool) == (33 * MB, "measured")


def test_a_new_version_is_read_again(tmp_path: Path) -> None:
    config = gateway_config({})
    pool = build_pools(config.pools)[0]
    publish(tmp_path, "m", 1, 20 * MB)
    footprints = Footprints(config, httpx.AsyncClient(), tmp_path)
    footprints.refresh(["m"])
    assert footprints.bytes("m", pool) == 20 * MB
    publish(tmp_path, "m", 2, 70 * MB)
    footprints.refresh(["m"])
    assert footprints.bytes("m", pool) == 70 * MB


def test_a_model_nothing_is_known_of_counts_as_the_largest_known(tmp_path: Path) -> None:
    config = gateway_config({})
    pool = build_pools(config.pools)[0]
    footprints = Footprints(config, httpx.AsyncClient(), tmp_path)
    assert footprints.of("x", pool) == (100 * MB, "estimate")  # an eighth of the budget
    publish(tmp_path, "big", 1, 300 * MB)
    footprints.refresh(["big", "x"])
    assert footprints.of("x", pool) == (300 * MB, "estimate")
