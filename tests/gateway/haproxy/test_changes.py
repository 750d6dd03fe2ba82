"""Moving a running HAProxy to the next snapshot (``gateway/haproxy/changes.py``): the
admin-socket commands when they can, ``None`` (a reload) when the change is structural."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from pathlib import Path

from gateway.haproxy.changes import runtime_commands
from gateway.haproxy.render import render
from gateway.haproxy.snapshot import (
    PoolState,
    RouteState,
    Snapshot,
    TenancyState,
    TenantState,
)
from gateway.policy.rate import RateClass
from gateway.policy.routing import queue_weight
from gateway.upstream.triton_version import GrpcReuse
from tests.gateway.haproxy.conftest import layout_in, member, snapshot


def test_runtime_commands_change_weights_states_and_maps_when_structure_same(
    tmp_path: Path,
) -> None:
    layout = layout_in(tmp_path)
    old = snapshot()
    main = old.pools[0]
    new = replace(
        old,
        pools=(replace(main, members=(replace(main.members[0], weight=queue_weight(3)),
                                      replace(main.members[1], routable=False))),
               old.pools[1]),
        routes=(*old.routes, RouteState("bert", (("canary", 1.0),), 12, not_ready="loading")),
    )
    commands = runtime_commands(old, new, layout)
    assert commands is not None
    first, second = main.members[0].name, main.members[1].name
    assert f"set server http_main/{first} weight 64" in commands
    assert f"set server grpc_main/{first} weight 64" in commands
    assert f"set server http_main/{second} state maint" in commands
    assert f"add map {layout.map_path('route0')} bert canary" in commands
    assert f"add map {layout.map_path('notready')} bert loading" in commands
    back = runtime_commands(new, old, layout)
    assert back is not None  # and back again
    assert f"del map {layout.map_path('notready')} bert" in back
    assert f"set server grpc_main/{second} state ready" in back


def test_runtime_commands_escape_spaces_and_semicolons_when_a_value_has_them(
        tmp_path: Path) -> None:
    layout = layout_in(tmp_path)
    old = snapshot()
    new = replace(old, routes=(*old.routes, RouteState("bert", (("main", 1.0),), 12,
                                                       not_ready="loading; 2 of 3")))
    assert runtime_commands(old, new, layout) == [
        f"add map {layout.map_path(name)} bert {value}"
        for name, value in (("route0", "main"), ("route1", "main"), ("cut1", "1000"),
                            ("limits", "12"), ("notready", "loading\\;\\ 2\\ of\\ 3"))]


def test_runtime_commands_ask_for_reload_when_member_added(tmp_path: Path) -> None:
    old = snapshot()
    grown = replace(old.pools[1], members=(*old.pools[1].members, member(9030)))
    assert runtime_commands(old, replace(old, pools=(old.pools[0], grown)),
                            layout_in(tmp_path)) is None
    assert runtime_commands(old, replace(old, rate_default=RateClass(1, 1)),
                            layout_in(tmp_path)) is None


def test_member_restarted_on_another_version_needs_a_reload_when_moved(tmp_path: Path) -> None:
    """max-reuse is no runtime-API setting: a mode change is structural (a seamless
    reload); a new patch release of an already fixed Triton changes nothing."""
    layout = layout_in(tmp_path)

    def on(version: str | None) -> Snapshot:
        return snapshot(pools=(PoolState("main", (replace(member(9000),
                                                          triton_version=version),)),))
    assert runtime_commands(on("2.51.0"), on("2.57.0"), layout) is None
    assert runtime_commands(on("2.57.0"), on(None), layout) is None
    assert runtime_commands(on("2.57.0"), on("2.58.0"), layout) == []
    shared = dataclasses.replace(layout, grpc_upstream_reuse=GrpcReuse.SHARED)
    assert runtime_commands(on("2.51.0"), on("2.57.0"), shared) == []


def test_a_new_refusal_delay_needs_a_reload_and_tenancy_off_keeps_the_default(
        tmp_path: Path) -> None:
    """The delay sets the tarpits' backends (their ``timeout tarpit``), no runtime-API
    setting; tenancy turned off keeps its rules with the default delay, so off and on
    again is no reload."""
    layout = layout_in(tmp_path)
    rules = TenancyState(tenants=(TenantState("default", "standard"),))
    on = replace(snapshot(), tenancy=rules)
    assert runtime_commands(on, replace(on, tenancy=replace(rules, refusal_delay_ms=20)),
                            layout) is None
    off = replace(on, tenancy=TenancyState(tenants=(), enabled=False))
    assert runtime_commands(on, off, layout) is not None
    assert runtime_commands(off, on, layout) is not None


def test_the_first_model_with_triton_levels_reloads_and_its_levels_then_move_by_map(
        tmp_path: Path) -> None:
    """The filters that put a level in (gateway/haproxy/priority_rules.py) exist only while
    some model has levels and tenants have classes: their coming and going is a reload;
    a model's levels changing after that is map ``tprio``."""
    layout = layout_in(tmp_path)
    rules = TenancyState(tenants=(TenantState("default", "standard"),))
    base = replace(snapshot(), tenancy=rules)
    route = base.routes[0]

    def leveled(levels: int) -> Snapshot:
        return replace(base, levels=((route.model, levels),))

    assert runtime_commands(base, leveled(3), layout) is None
    assert runtime_commands(leveled(3), base, layout) is None
    commands = runtime_commands(leveled(3), leveled(2), layout)
    assert commands is not None
    assert any("tprio.map" in c and f"{route.model}/sheddable 2" in c for c in commands), \
        commands
    # the tenancy's triton_levels off: no level is given, the filters go
    off = replace(leveled(3), tenancy=replace(rules, triton_levels=False))
    assert runtime_commands(leveled(3), off, layout) is None
    assert "filter lua.priority_http" not in render(off, layout).config
    assert "filter lua.priority_http" in render(leveled(3), layout).config
