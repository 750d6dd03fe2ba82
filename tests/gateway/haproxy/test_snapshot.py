"""A rollout's lease in the snapshot: what the control plane publishes (on a grid, so the
snapshot changes once per LEASE_STEP_S, not at every verdict), what it costs a replica
to follow (no HAProxy command), and :func:`fail_safe`, the replica's rule: a share with
a stale lease goes to stable."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from gateway.auth import TokenTable
from gateway.config import GatewayConfig
from gateway.config.pools import MemberSpec, PoolSpec
from gateway.core import Core
from gateway.haproxy import snapshot as snapshot_module
from gateway.haproxy.changes import runtime_commands
from gateway.haproxy.controller import snapshot_of
from gateway.haproxy.snapshot import (
    LEASE_S,
    LEASE_STEP_S,
    RouteState,
    Snapshot,
    Versions,
    fail_safe,
    published_lease,
    snapshot_from_dict,
    snapshot_to_dict,
    snapshot_version,
)
from gateway.policy.rollout import Shadow, Split
from tests.gateway.haproxy.conftest import layout_in, snapshot

T0 = 1_700_000_000.0  # on the grid


def _rolled(percent: int = 50, verdict_at: float | None = T0, shadow: int | None = None
            ) -> Snapshot:
    """``resnet`` rolled out (1 -> 2), ``tiny`` not."""
    base = snapshot()
    resnet = replace(base.routes[0], split=(1, 2, percent), shadow=shadow,
                     verdict_at=verdict_at)
    return replace(base, routes=(resnet, base.routes[1]))


def test_fail_safe_returns_the_same_snapshot_when_every_lease_is_fresh() -> None:
    rolled = _rolled()
    assert fail_safe(rolled, T0 + LEASE_S) is rolled  # at the bound: still fresh
    assert fail_safe(rolled, T0 - 60) is rolled  # a clock behind: fresh, not stale
    plain = snapshot()
    assert fail_safe(plain, math.inf) is plain  # no rollout, no lease


def test_fail_safe_pins_stable_when_the_lease_is_older_than_the_bound() -> None:
    rolled = _rolled(percent=50)
    safe = fail_safe(rolled, T0 + LEASE_S + 0.1)
    assert safe is not rolled
    resnet, tiny = safe.routes
    # pinned as recover() pins: versioned requests to either version still work
    assert resnet.split == (1, 2, 0) and resnet.shadow is None
    assert not resnet.candidate_share
    assert replace(resnet, split=(1, 2, 50)) == rolled.routes[0]  # nothing else moved
    assert tiny is rolled.routes[1]
    assert fail_safe(safe, math.inf) is safe  # once safe, stays put


def test_fail_safe_ends_a_shadow_step_when_its_lease_is_stale() -> None:
    shadowed = _rolled(percent=0, shadow=10)
    assert shadowed.routes[0].candidate_share
    safe = fail_safe(shadowed, T0 + 16, lease_s=15)
    assert safe.routes[0].split == (1, 2, 0) and safe.routes[0].shadow is None
    assert fail_safe(shadowed, T0 + 16, lease_s=30) is shadowed  # the bound is the caller's


def test_fail_safe_leaves_a_share_without_lease_when_promoting() -> None:
    promoting = _rolled(percent=100, verdict_at=None)  # the verdict is final
    assert fail_safe(promoting, math.inf) is promoting


def test_fail_safe_moves_every_leased_share_when_replica_has_no_estimate() -> None:
    base = _rolled()
    other = replace(base.routes[1], split=(4, 5, 10), verdict_at=T0 + 1000)
    both = replace(base, routes=(base.routes[0], other))
    safe = fail_safe(both, math.inf)  # started from its saved snapshot, no answer yet
    assert [r.split for r in safe.routes] == [(1, 2, 0), (4, 5, 0)]
    only_old = fail_safe(both, T0 + 100)
    assert [r.split for r in only_old.routes] == [(1, 2, 0), (4, 5, 10)]


def test_lease_survives_the_wire_form_and_changes_the_version() -> None:
    rolled = _rolled(verdict_at=T0 + 5)
    back = snapshot_from_dict(snapshot_to_dict(rolled))
    assert back == rolled and back.routes[0].verdict_at == T0 + 5
    assert snapshot_version(rolled) != snapshot_version(_rolled(verdict_at=T0 + 10))
    older = snapshot_to_dict(rolled)  # a control plane that predates leases
    for route in older["routes"]:  # type: ignore[attr-defined]
        del route["verdict_at"]
    assert snapshot_from_dict(older).routes[0].verdict_at is None


def test_lease_renewal_costs_a_replica_no_haproxy_command(tmp_path: Path) -> None:
    before, after = _rolled(verdict_at=T0), _rolled(verdict_at=T0 + LEASE_STEP_S)
    assert runtime_commands(before, after, layout_in(tmp_path)) == []
    stale = fail_safe(after, math.inf)  # failing safe is a map change, not a reload
    commands = runtime_commands(after, stale, layout_in(tmp_path))
    assert commands and all(c.startswith(("set map", "del map", "add map"))
                            for c in commands), commands


def test_published_lease_rounds_down_to_the_grid() -> None:
    assert published_lease(T0) == T0
    assert published_lease(T0 + LEASE_STEP_S - 0.01) == T0
    assert published_lease(T0 + LEASE_STEP_S) == T0 + LEASE_STEP_S


def _core() -> Core:
    return Core.for_config(GatewayConfig(pools=(
        PoolSpec(name="p", members=(MemberSpec(),), models=("m",)),)))


def _route(core: Core) -> RouteState:
    return next(r for r in snapshot_of(core.state, TokenTable(), 0.0).routes
                if r.model == "m")


def test_snapshot_carries_the_lease_only_while_the_candidate_has_a_share() -> None:
    core = _core()
    state = core.state
    state.set_split("m", Split(1, 2, 0))
    state.note_verdict("m", T0 + 3)
    assert _route(core).verdict_at is None  # 0 %: nothing to fail safe from
    state.set_shadow("m", Shadow(1, 2, 10))
    assert _route(core).verdict_at == T0  # on the grid
    state.set_shadow("m", None)
    state.set_split("m", Split(1, 2, 50))
    assert _route(core).verdict_at == T0
    state.note_verdict("m", None)  # promoting: the share is the verdict
    assert _route(core).verdict_at is None
    state.note_verdict("m", T0)
    state.set_split("m", None)  # the rollout ended: no split, no lease
    state.set_split("m", Split(1, 2, 50))
    assert _route(core).verdict_at is None


def test_snapshot_version_changes_once_per_lease_step_when_verdicts_come_every_tick() -> None:
    core = _core()
    core.state.set_split("m", Split(1, 2, 50))
    versions = []
    for tick in range(240):  # 60 s of verdicts every 0.25 s (the rollout's TICK_S)
        core.state.note_verdict("m", T0 + 0.3 + tick * 0.25)
        versions.append(snapshot_version(snapshot_of(core.state, TokenTable(), 0.0)))
    changes = sum(a != b for a, b in zip(versions, versions[1:], strict=False))
    assert changes == 60 / LEASE_STEP_S  # 12 over 60 s, not one per verdict (239)


def test_versions_hash_each_snapshot_object_once_and_remember_the_last_few(
        monkeypatch: pytest.MonkeyPatch) -> None:
    hashed: list[int] = []

    def counted(shot: Snapshot, wire: dict[str, object] | None = None) -> str:
        hashed.append(shot.routes[0].split[2] if shot.routes[0].split else -1)
        return snapshot_version(shot, wire)

    monkeypatch.setattr(snapshot_module, "snapshot_version", counted)
    versions = Versions(kept=2)
    one, two, three = _rolled(10), _rolled(20), _rolled(30)
    assert versions(one) == versions(one) == snapshot_version(one)
    assert versions(two, snapshot_to_dict(two)) == snapshot_version(two)  # its wire form
    assert versions(one) == snapshot_version(one) and hashed == [10, 20]
    versions(three)  # the third: the first seen of the two kept goes
    assert versions(one) == snapshot_version(one) and hashed == [10, 20, 30, 10]
