"""Moving a running HAProxy from one snapshot to the next (pure, no I/O).

:func:`runtime_commands` gives the admin-socket commands that take a process rendered
from one snapshot (:mod:`gateway.haproxy.render`) to the next: map entries
(:mod:`gateway.haproxy.maps`), member weights and states. It gives ``None`` when the
change is structural (:func:`structure`: pools, members, a member's gRPC connection
mode, rate classes, the default route, predict auth turned on or off, the number of
split ranks, tenancy turned on or off) and needs a seamless reload.
"""

from __future__ import annotations

from gateway.haproxy.config import grpc_shared
from gateway.haproxy.maps import route_maps
from gateway.haproxy.snapshot import Layout, Snapshot


def _cli_word(text: str) -> str:
    """One argument of the runtime API: spaces and ``;`` escaped with a backslash."""
    return text.replace("\\", "\\\\").replace(" ", "\\ ").replace(";", "\\;")


def structure(snapshot: Snapshot, layout: Layout) -> tuple[object, ...]:
    """What only a reload can change: listeners, backends, servers (a member's gRPC
    connection mode among them), tables, defaults."""
    return (
        tuple((p.name,
               tuple((m.name, m.host, m.http_port, m.grpc_port, grpc_shared(m, layout))
                     for m in p.members))
              for p in snapshot.pools),
        snapshot.default_route.pools if snapshot.default_route else None,
        snapshot.default_route.max_in_system if snapshot.default_route else None,
        snapshot.rate_classes(),
        snapshot.rate_default,
        snapshot.predict_gated,
        snapshot.split_ranks(),
        snapshot.tenancy is not None,
    )


def runtime_commands(old: Snapshot, new: Snapshot, layout: Layout) -> list[str] | None:
    """Admin-socket commands taking a process rendered from ``old`` to ``new``; ``None``
    when only a reload can (see :func:`structure`)."""
    if structure(old, layout) != structure(new, layout):
        return None
    commands: list[str] = []
    old_maps, new_maps = route_maps(old), route_maps(new)
    for name, entries in new_maps.items():
        before = old_maps.get(name, {})
        path = layout.map_path(name)
        for key in sorted(before.keys() - entries.keys()):
            commands.append(f"del map {path} {_cli_word(key)}")
        for key, value in sorted(entries.items()):
            if key not in before:
                commands.append(f"add map {path} {_cli_word(key)} {_cli_word(value)}")
            elif before[key] != value:
                commands.append(f"set map {path} {_cli_word(key)} {_cli_word(value)}")
    old_members = {(p.name, m.name): m for p in old.pools for m in p.members}
    for pool in new.pools:
        for m in pool.members:
            was = old_members[(pool.name, m.name)]
            for proto in ("http", "grpc"):
                server = f"{proto}_{pool.name}/{m.name}"
                if was.weight != m.weight:
                    commands.append(f"set server {server} weight {m.weight}")
                if was.routable != m.routable:
                    commands.append(f"set server {server} state "
                                    f"{'ready' if m.routable else 'maint'}")
    return commands
