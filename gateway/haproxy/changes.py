"""Moving a running HAProxy from one snapshot to the next (pure, no I/O).

:func:`runtime_commands` gives the admin-socket commands that take a process rendered
from one snapshot (:mod:`gateway.haproxy.render`) to the next: map entries
(:mod:`gateway.haproxy.maps`), member weights and states, and a managed model's
holders (its backend's servers and map ``resident``), the same for the gRPC backends' pin
twins (:func:`gateway.haproxy.backends.pin_backends`). It gives ``None`` when the
change is structural (:func:`structure`: pools, members, a member's gRPC connection
mode, rate classes, the default route, predict auth turned on or off, the number of
split ranks, tenancy turned on or off, its refusal delay (the frontends' ``timeout
tarpit``) and refusals a second (a constant of the rules), the set of models under
residency, Triton's priority levels turned on or off) and needs a seamless reload.

Holders move without a gap: a model backend's servers are made ready before the map
sends requests to them, and the map turns to ``miss`` (the control plane) before the
servers it leaves go to maintenance (requests already at them finish there).
"""

from __future__ import annotations

from gateway.haproxy import priority_rules, queueing
from gateway.haproxy.backends import PIN, grpc_shared
from gateway.haproxy.maps import route_maps
from gateway.haproxy.snapshot import Layout, Resident, Snapshot


def _cli_word(text: str) -> str:
    """One argument of the runtime API: spaces and ``;`` escaped with a backslash."""
    return text.replace("\\", "\\\\").replace(" ", "\\ ").replace(";", "\\;")


def structure(snapshot: Snapshot, layout: Layout) -> tuple[object, ...]:
    """What only a reload can change: listeners, backends, servers (a member's gRPC
    connection mode among them), tables, defaults."""
    return (
        tuple((p.name,
               tuple((m.name, m.host, m.http_port, m.grpc_port, grpc_shared(m, layout))
                     for m in p.members), p.member_slots, p.max_wait_ms, p.lane_slots)
              for p in snapshot.pools),
        snapshot.default_route.pools if snapshot.default_route else None,
        snapshot.default_route.max_in_system if snapshot.default_route else None,
        snapshot.rate_classes(),
        snapshot.rate_default,
        snapshot.predict_gated,
        snapshot.split_ranks(),
        snapshot.tenancy is not None,
        snapshot.tenancy.refusal_delay_ms if snapshot.tenancy is not None else None,
        snapshot.tenancy.refusals_per_s if snapshot.tenancy is not None else None,
        tuple((r.pool, r.model) for r in snapshot.residents()),
        priority_rules.levels_on(snapshot),
    )


def runtime_commands(old: Snapshot, new: Snapshot, layout: Layout) -> list[str] | None:
    """Admin-socket commands taking a process rendered from ``old`` to ``new``; ``None``
    when only a reload can (see :func:`structure`)."""
    if structure(old, layout) != structure(new, layout):
        return None
    old_held = {(r.pool, r.model): r for r in old.residents()}
    now_held = new.residents()
    # holders gained first: the map may point at them next
    commands = _holder_states(old_held, now_held, ready=True)
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
    backends: dict[str, list[str]] = {}  # pool -> its model backends
    for r in now_held:
        backends.setdefault(r.pool, []).append(r.backend)
    for pool in new.pools:
        for m in pool.members:
            was = old_members[(pool.name, m.name)]
            for proto in ("http", "grpc"):
                server = f"{proto}_{pool.name}/{m.name}"
                if was.weight != m.weight:
                    commands.append(f"set server {server} weight {m.weight}")
                    commands += [f"set server {proto}_{b}/{m.name} weight {m.weight}"
                                 for b in backends.get(pool.name, ())]
                    # the pin twins (backends.pin_backends) weigh the same
                    commands += [f"set server grpc_{b}{PIN}/{m.name} weight {m.weight}"
                                 for b in (pool.name, *backends.get(pool.name, ()))
                                 if proto == "grpc"]
                    # and a queueing pool's twins (large gRPC messages, the lane)
                    commands += [f"set server {b}/{m.name} weight {m.weight}"
                                 for b, _ in queueing.twins(pool, proto)]
                if was.routable != m.routable:  # the model backends' servers track it
                    commands.append(f"set server {server} state "
                                    f"{'ready' if m.routable else 'maint'}")
    # holders lost last: the map no longer sends requests to them
    return commands + _holder_states(old_held, now_held, ready=False)


def _holder_states(old: dict[tuple[str, str], Resident], new: tuple[Resident, ...],
                   ready: bool) -> list[str]:
    """``set server <model backend>/<member> state ready`` for the holders each managed
    model gained (``ready``), else ``maint`` for those it lost."""
    commands = []
    for r in new:
        before = old[(r.pool, r.model)].holders
        moved = r.holders - before if ready else before - r.holders
        commands += [f"set server {backend}/{name} state {'ready' if ready else 'maint'}"
                     for name in sorted(moved)
                     for backend in (f"http_{r.backend}", f"grpc_{r.backend}",
                                     f"grpc_{r.backend}{PIN}")]
    return commands
