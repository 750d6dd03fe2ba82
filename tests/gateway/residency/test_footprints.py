"""A model's footprint: the largest of the configured figure, the converter's and what a
member measured; an estimate only until one is known. The converter's figure is read
from the lifecycle's repository or the configured ``model_repository``; the models
resident on a member of this host are measured again, each at its latest figure."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import yaml

from converters.tiny import TINY_MODEL_NAME, build_tiny_model
from gateway.config import GatewayConfig, load_gateway_config
from gateway.config.pools import MemberSpec
from gateway.pools import PoolMember, build_pools
from gateway.residency.footprints import Footprints
from gateway.residency.window import RISE_MEMORY_S
from gateway.upstream.triton import MemberAdmin
from tests.conftest import triton_settings
from tests.procs import started_triton

MB = 1_000_000
GB = 1_000_000_000


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
    footprints = Footprints(config, MemberAdmin(httpx.AsyncClient()), tmp_path)
    footprints.refresh(["cfg", "both", "conv"])
    assert footprints.of("cfg", pool) == (50 * MB, "configured")
    assert footprints.of("both", pool) == (30 * MB, "converter")  # larger than configured
    assert footprints.of("conv", pool) == (20 * MB, "converter")
    footprints.measured("conv", 48 * MB)  # what the member reported once loaded
    assert footprints.of("conv", pool) == (48 * MB, "measured")
    footprints.measured("conv", 44 * MB)  # its last load's figure counts
    assert footprints.of("conv", pool) == (44 * MB, "measured")


def test_the_most_a_figure_rose_at_a_measure_is_remembered(tmp_path: Path) -> None:
    """A placement leaves free what the figures were seen to move by: a stub growing as
    it first serves, a load measured larger than the last (not a first figure, not a
    fall)."""
    footprints = Footprints(gateway_config({}), MemberAdmin(httpx.AsyncClient()), tmp_path)
    footprints.measured("m", 30 * MB)  # its first figure: no rise
    footprints.measured("m", 29 * MB)  # a fresh stub measured after its load elsewhere
    assert footprints.growth(["m"]) == 0
    footprints.measured("m", 29 * MB + 600_000)  # it served: grown by 0.6 MB
    footprints.measured("m", 29 * MB + 550_000)
    footprints.measured("n", 80 * MB)
    footprints.measured("n", 80 * MB + 40_000)  # a few pages more
    assert footprints.growth(["m", "n"]) == 600_000
    assert footprints.growth(["n", "unknown"]) == 40_000 and footprints.growth([]) == 0


def test_a_rise_is_remembered_for_a_while_not_for_good(tmp_path: Path) -> None:
    """A one-off rise (a new version measured larger than the old, a rollout's two
    versions measured together) leaves room free for RISE_MEMORY_S, then no more."""
    now = [1000.0]
    footprints = Footprints(gateway_config({}), MemberAdmin(httpx.AsyncClient()), tmp_path,
                            clock=lambda: now[0])
    footprints.measured("m", 30 * MB)
    footprints.measured("m", 60 * MB)  # version 2, twice as large
    now[0] += 100
    footprints.measured("m", 60 * MB + 300_000)  # it served
    assert footprints.growth(["m"]) == 30 * MB
    now[0] += RISE_MEMORY_S - 100  # the version's rise is as old as remembered
    assert footprints.growth(["m"]) == 30 * MB
    now[0] += 1
    assert footprints.growth(["m"]) == 300_000  # the stub's own growth, newer, stays
    now[0] += 100
    assert footprints.growth(["m"]) == 0


def test_the_runtime_overhead_learned_is_added_to_a_converter_figure(tmp_path: Path) -> None:
    """The converter measures a session in a process with its libraries loaded; the
    member's runtime adds its own per model (a stub): learned from a model measured
    both ways, it is added to the figure of a model not loaded yet."""
    config = gateway_config({})
    pool = build_pools(config.pools)[0]
    publish(tmp_path, "a", 1, 20 * MB)
    publish(tmp_path, "b", 1, 5 * MB)
    footprints = Footprints(config, MemberAdmin(httpx.AsyncClient()), tmp_path)
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
    footprints = Footprints(config, MemberAdmin(httpx.AsyncClient()), tmp_path)
    footprints.refresh(["m"])
    assert footprints.bytes("m", pool) == 20 * MB
    publish(tmp_path, "m", 2, 70 * MB)
    footprints.refresh(["m"])
    assert footprints.bytes("m", pool) == 70 * MB


def test_a_model_nothing_is_known_of_counts_as_the_largest_known(tmp_path: Path) -> None:
    config = gateway_config({})
    pool = build_pools(config.pools)[0]
    footprints = Footprints(config, MemberAdmin(httpx.AsyncClient()), tmp_path)
    assert footprints.of("x", pool) == (100 * MB, "estimate")  # an eighth of the budget
    publish(tmp_path, "big", 1, 300 * MB)
    footprints.refresh(["big", "x"])
    assert footprints.of("x", pool) == (300 * MB, "estimate")


def test_the_overhead_and_the_estimate_follow_each_new_figure_once_read(
        tmp_path: Path) -> None:
    """Both are worked out once per change of the figures (not per model asked): a
    figure measured or published after they were read moves them."""
    config = gateway_config({})
    pool = build_pools(config.pools)[0]
    publish(tmp_path, "a", 1, 20 * MB)
    footprints = Footprints(config, MemberAdmin(httpx.AsyncClient()), tmp_path)
    footprints.refresh(["a"])
    assert footprints.of("x", pool) == (20 * MB, "estimate")
    assert footprints.overhead() == 0
    footprints.measured("a", 50 * MB)
    assert footprints.overhead() == 30 * MB
    assert footprints.of("x", pool) == (50 * MB, "estimate")
    footprints.measured("b", 70 * MB)
    assert footprints.of("x", pool) == (70 * MB, "estimate")
    footprints.measured("a", 45 * MB)  # measured again, smaller
    assert footprints.overhead() == 25 * MB
    publish(tmp_path, "c", 1, 90 * MB)
    footprints.refresh(["a", "c"])
    assert footprints.of("x", pool) == (90 * MB, "estimate")


def test_footprints_read_the_converters_figure_when_only_model_repository_names_it(
        tmp_path: Path) -> None:
    """No lifecycle section: the configuration's ``model_repository`` (relative to its
    file) is where the converter's reports are, before any load measured a model."""
    publish(tmp_path / "repo", "m", 1, 20 * MB)
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump({
        "pools": [{"name": "p", "members": [{"http_port": 9}],
                   "residency": {"memory_budget_bytes": 800 * MB}}],
        "model_repository": "repo"}))
    config = load_gateway_config(path)
    assert config.model_repository == tmp_path / "repo"
    pool = build_pools(config.pools)[0]
    footprints = Footprints(config, MemberAdmin(httpx.AsyncClient()))
    footprints.refresh(["m"])
    assert footprints.of("m", pool) == (20 * MB, "converter")
    # a lifecycle's repository, when the assembler passes one, is the one read
    publish(tmp_path / "lifecycle", "m", 1, 30 * MB)
    theirs = Footprints(config, MemberAdmin(httpx.AsyncClient()), tmp_path / "lifecycle")
    theirs.refresh(["m"])
    assert theirs.of("m", pool) == (30 * MB, "converter")


def test_footprints_estimate_a_published_model_when_no_repository_is_named(
        tmp_path: Path) -> None:
    publish(tmp_path, "m", 1, 20 * MB)
    config = gateway_config({})
    footprints = Footprints(config, MemberAdmin(httpx.AsyncClient()))
    footprints.refresh(["m"])
    assert footprints.of("m", build_pools(config.pools)[0]) == (100 * MB, "estimate")


@pytest.mark.integration
async def test_footprints_remeasure_replaces_each_resident_figure_when_the_member_is_local(
        tmp_path: Path, admin: MemberAdmin) -> None:
    repo = tmp_path / "model_repo"
    for name in (TINY_MODEL_NAME, "other", "idle"):
        build_tiny_model(repo, name)
    config = gateway_config({})
    pool = build_pools(config.pools)[0]
    footprints = Footprints(config, admin)
    footprints.measured(TINY_MODEL_NAME, 10 * GB)  # an earlier figure, far too large
    footprints.measured("idle", 7 * MB)  # measured once, unloaded since
    with started_triton(triton_settings(repo, tmp_path, TINY_MODEL_NAME, "other")) as server:
        e = server.endpoints
        assert e is not None
        member = PoolMember("p", MemberSpec(host=e.host, http_port=e.http_port,
                                            grpc_port=e.grpc_port,
                                            metrics_port=e.metrics_port))
        await footprints.remeasure(member, [TINY_MODEL_NAME, "other", "idle"])
    tiny, source = footprints.of(TINY_MODEL_NAME, pool)
    assert source == "measured" and 5 * MB < tiny < 1 * GB  # the latest, not the largest
    other = footprints.of("other", pool)
    assert other[1] == "measured" and abs(other[0] - tiny) < 0.2 * tiny  # a stub alike
    assert footprints.of("idle", pool) == (7 * MB, "measured")  # not resident: kept


async def test_footprints_remeasure_leaves_the_figures_when_the_member_is_remote(
        admin: MemberAdmin) -> None:
    config = gateway_config({})
    footprints = Footprints(config, admin)
    footprints.measured("m", 5 * MB)
    remote = PoolMember("p", MemberSpec(host="10.1.2.3", http_port=8000))
    await footprints.remeasure(remote, ["m"])
    assert footprints.of("m", build_pools(config.pools)[0]) == (5 * MB, "measured")
    assert admin._channels == {}  # nothing asked of it
