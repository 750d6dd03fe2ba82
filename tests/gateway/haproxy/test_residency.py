"""Model residency on HAProxy (``RouteState.holders``): a managed model's own backend per
pool, whose servers track the pool's and are ready only on its holders; map
``resident`` sends its requests there, or to the control plane on a miss; holder
changes move by the runtime API in an order that leaves no gap; HAProxy's counts read
per model backend. The last test runs a real HAProxy in front of two HTTP servers."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from gateway.haproxy.changes import runtime_commands
from gateway.haproxy.config import render_config
from gateway.haproxy.maps import route_maps
from gateway.haproxy.process import HAProxyProcess, write_files
from gateway.haproxy.proxy import SnapshotProxy
from gateway.haproxy.render import render
from gateway.haproxy.snapshot import (
    Layout,
    MemberState,
    PoolState,
    RouteState,
    Snapshot,
    TenancyState,
    TenantState,
    residency_suffix,
    snapshot_from_dict,
    snapshot_to_dict,
    snapshot_version,
)
from gateway.netaddr import free_port
from gateway.telemetry import read_haproxy
from tests.gateway.haproxy.conftest import (
    as_member,
    haproxy_check,
    layout_in,
    member,
    serving,
    snapshot,
)
from tests.procs import wait_until

A, B = member(9000).name, member(9010).name  # snapshot()'s pool main
RESNET = f"main.{residency_suffix('resnet')}"  # resnet's backend in main


def _held(main: tuple[str, ...], canary: tuple[str, ...] = ()) -> Snapshot:
    """snapshot() with resnet (main and canary) managed, tiny not."""
    base = snapshot()
    resnet = replace(base.routes[0], holders=(("main", main), ("canary", canary)))
    return replace(base, routes=(resnet, base.routes[1]))


def _sections(text: str) -> dict[str, list[str]]:
    """Section header ("backend http_main") -> its lines."""
    sections: dict[str, list[str]] = {}
    for block in text.split("\n\n"):
        for part in ("\n" + block).split("\nbackend ")[1:]:
            head, *lines = part.splitlines()
            sections[f"backend {head}"] = lines
        for part in ("\n" + block).split("\nfrontend ")[1:]:
            head, *lines = part.splitlines()
            sections[f"frontend {head}"] = lines
    return sections


def test_suffix_is_stable_and_identifier_safe_when_model_names_differ() -> None:
    names = ["resnet", "Resnet", "a/b c;d", "x" * 200]
    suffixes = [residency_suffix(n) for n in names]
    assert len(set(suffixes)) == len(names)
    assert all(s.startswith("r") and len(s) == 11 and s[1:].isalnum() for s in suffixes)
    assert residency_suffix("resnet") == residency_suffix("resnet")


def test_managed_model_gets_a_backend_per_pool_with_servers_ready_on_holders(
        tmp_path: Path) -> None:
    text = render_config(_held((A,)), layout_in(tmp_path))
    sections = _sections(text)
    canary = f"canary.{residency_suffix('resnet')}"
    assert {s for s in sections if ".r" in s} == {
        f"backend {p}_{b}" for p in ("http", "grpc") for b in (RESNET, canary)} | {
        f"backend grpc_{b}.pin" for b in (RESNET, canary)}  # backends.pin_backends
    twin = [line for line in sections[f"backend grpc_{RESNET}.pin"]
            if line.strip().startswith("server ")]
    assert twin[0].split()[1] == A and " disabled" not in twin[0]
    assert twin[1].split()[1] == B and twin[1].endswith(" disabled")
    servers = {line.split()[1]: line for line in sections[f"backend http_{RESNET}"]
               if line.strip().startswith("server ")}
    assert servers[A].endswith(f"track http_main/{A} weight 256")
    assert servers[B].endswith(f"track http_main/{B} weight 256 disabled")
    grpc = [line for line in sections[f"backend grpc_{RESNET}"]
            if line.strip().startswith("server ")]
    assert len(grpc) == 2 and all(" proto h2" in line and " check" not in line
                                  for line in grpc)
    # the pool backend's settings, without checks of its own
    model, pool = sections[f"backend http_{RESNET}"], sections["backend http_main"]
    def settings(lines: list[str]) -> list[str]:
        return [x for x in lines if not x.strip().startswith("server ")]
    assert [x for x in settings(pool) if "httpchk" not in x and "http-check" not in x] == \
        settings(model)
    assert route_maps(_held((A,)))["resident"] == {"main/resnet": RESNET,
                                                   "canary/resnet": "miss"}


def test_nothing_of_residency_rendered_when_no_model_is_managed(tmp_path: Path) -> None:
    layout = layout_in(tmp_path)
    plain = render(snapshot(), layout)
    assert "resident" not in plain.maps and "req.rb" not in plain.config
    # only the pools' pin twins (backends.pin_backends) have a dot
    assert [s for s in _sections(plain.config) if "." in s] == [
        "backend grpc_main.pin", "backend grpc_canary.pin"]


def test_residency_lookup_is_the_last_request_rule_and_decides_the_backend_first(
        tmp_path: Path) -> None:
    sections = _sections(render_config(_held((A,)), layout_in(tmp_path)))
    for proto in ("http", "grpc"):
        lines = sections[f"frontend {proto}"]
        requests = [x for x in lines if x.startswith("  http-request ")]
        assert "set-var(req.rb) var(txn.pool),concat(/,txn.model,)," \
               "map(" in requests[-2]
        assert "set-log-level silent" in requests[-1] and "-m str miss" in requests[-1]
        uses = [x.strip() for x in lines if x.startswith("  use_backend ")]
        # gRPC: a request pinned here goes to the backend's pin twin
        pinned = "{ var(txn.ver) -m found }"
        assert uses[-5 if proto == "grpc" else -3:] == [
            f"use_backend control_{proto} if {{ var(req.rb) -m str miss }}",
            *([f"use_backend grpc_%[var(req.rb)].pin if {pinned} {{ var(req.rb) -m found }}"]
              if proto == "grpc" else []),
            f"use_backend {proto}_%[var(req.rb)] if {{ var(req.rb) -m found }}",
            *([f"use_backend grpc_%[var(txn.pool)].pin if {pinned} "
               "{ var(txn.pool) -m found }"] if proto == "grpc" else []),
            f"use_backend {proto}_%[var(txn.pool)] if {{ var(txn.pool) -m found }}"]


def test_pool_load_counts_the_model_backends_when_tenancy_rules_read_it(
        tmp_path: Path) -> None:
    tenancy = TenancyState(tenants=(TenantState("default", "standard"),))
    text = render_config(replace(_held((A,)), tenancy=tenancy), layout_in(tmp_path))
    for proto in ("http", "grpc"):
        assert f"set-var(txn.pl) be_conn({proto}_{RESNET}),add(txn.pl) if " \
               "{ var(txn.pool) -m str main } { var(req.inf) -m found }" in text


def test_holder_moves_ready_the_new_before_the_map_and_the_map_before_maint(
        tmp_path: Path) -> None:
    layout = layout_in(tmp_path)
    resident = layout.map_path("resident")
    backends = [f"http_{RESNET}", f"grpc_{RESNET}", f"grpc_{RESNET}.pin"]  # and its twin
    ready = [f"set server {b}/{B} state ready" for b in backends]
    maint = [f"set server {b}/{A} state maint" for b in backends]
    # A -> B: the map keeps pointing at the backend, B ready before A leaves
    assert runtime_commands(_held((A,)), _held((B,)), layout) == [*ready, *maint]
    # A -> none: the control plane first, then A leaves
    assert runtime_commands(_held((A,)), _held(()), layout) == [
        f"set map {resident} main/resnet miss", *maint]
    # none -> B: B ready before the map sends requests there
    assert runtime_commands(_held(()), _held((B,)), layout) == [
        *ready, f"set map {resident} main/resnet {RESNET}"]


def test_member_weight_follows_into_model_backends_when_it_changes(tmp_path: Path) -> None:
    old = _held((A,))
    main = old.pools[0]
    heavier = replace(old, pools=(replace(main, members=(replace(main.members[0], weight=64),
                                                         main.members[1])), old.pools[1]))
    commands = runtime_commands(old, heavier, layout_in(tmp_path))
    assert commands == [*(f"set server http_{b}/{A} weight 64" for b in ("main", RESNET)),
                        *(f"set server grpc_{b}/{A} weight 64" for b in ("main", RESNET)),
                        *(f"set server grpc_{b}.pin/{A} weight 64" for b in ("main", RESNET))]


def test_managed_set_is_structure_and_holders_never_are(tmp_path: Path) -> None:
    layout = layout_in(tmp_path)
    assert runtime_commands(snapshot(), _held((A,)), layout) is None  # new backends
    assert runtime_commands(_held((A,)), snapshot(), layout) is None
    assert runtime_commands(_held((A,), (member(9020).name,)), _held((), ()), layout) \
        is not None


def test_holders_survive_the_wire_form_when_published_to_replicas() -> None:
    held = _held((A, B))
    wire = json.loads(json.dumps(snapshot_to_dict(held)))
    assert snapshot_from_dict(wire) == held
    assert snapshot_version(held) != snapshot_version(_held((A,)))
    unmanaged = json.loads(json.dumps(snapshot_to_dict(snapshot())))
    for route in unmanaged["routes"]:
        del route["holders"]  # a snapshot published before residency
    assert snapshot_from_dict(unmanaged) == snapshot()


def test_counts_read_model_backends_toward_their_pool_and_per_model_server() -> None:
    s = residency_suffix("resnet")
    stats = f"""# pxname,svname,qcur,qmax,scur,smax,slim,stot,bin,bout,dreq,dresp,ereq,econ,eresp
http_main,{A},0,0,1,1,,,,,,,,0,0
http_main,BACKEND,0,0,1,1,,,,,,,,0,0
http_main.{s},{A},0,0,2,2,,,,,,,,1,0
http_main.{s},{B},0,0,0,0,,,,,,,,0,0
http_main.{s},BACKEND,1,1,2,2,,,,,,,,1,0
grpc_main.{s},{A},0,0,1,1,,,,,,,,0,0
grpc_main.{s},BACKEND,0,0,1,1,,,,,,,,0,0
"""
    counts = read_haproxy(stats, "", tenancy_rules=False)
    assert counts.held == {"main": 4} and counts.queued == {"main": 1}
    assert counts.at_server == {("main", A): 4, ("main", B): 0}
    assert counts.errors == {("main", A): 1, ("main", B): 0}
    assert counts.at_model_server == {("main", s, A): 3, ("main", s, B): 0}


@pytest.mark.integration  # haproxy -c: make test installs it
def test_residency_config_passes_haproxy_check_when_written(tmp_path: Path) -> None:
    layout = layout_in(tmp_path)
    write_files(render(_held((A,)), layout), layout)
    checked = haproxy_check(layout.config_path)
    assert checked.returncode == 0, checked.stderr


# -- a real HAProxy in front of two HTTP servers and a stand-in control plane

@pytest.mark.integration  # runs the real HAProxy: make test installs it
def test_haproxy_routes_a_managed_model_to_its_holders_and_moves_them_live(
        tmp_path: Path) -> None:
    with serving("a") as a, serving("b") as b, serving("control") as control:
        ma, mb = as_member(a), as_member(b)

        def held(*holders: MemberState) -> Snapshot:
            names = tuple(m.name for m in holders)
            return Snapshot(pools=(PoolState("p", (ma, mb)),), routes=(
                RouteState("hot", (("p", 1.0),), 64, holders=(("p", names),)),
                RouteState("cold", (("p", 1.0),), 64, holders=(("p", ()),)),
                RouteState("free", (("p", 1.0),), 64)))

        layout = Layout(f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}",
                        f"127.0.0.1:{control.port}", f"127.0.0.1:{free_port()}",
                        tmp_path / "run", f"127.0.0.1:{free_port()}")
        proxy = SnapshotProxy(layout, HAProxyProcess(layout))
        proxy.start(held(ma))

        def by(model: str, n: int = 12) -> set[str]:
            url = f"http://{layout.http_bind}/v2/models/{model}/infer"
            answers = [httpx.post(url, content=b"{}", timeout=10) for _ in range(n)]
            assert all(r.status_code == 200 for r in answers), [r.text for r in answers]
            return {r.json()["by"] for r in answers}

        try:
            assert by("hot") == {"a"}
            assert by("cold") == {"control"}  # a miss: the control plane holds it
            assert by("free") == {"a", "b"}  # not managed: the whole pool

            # a request in flight at the holder counts toward the pool and the model
            url = f"http://{layout.http_bind}/v2/models/hot/infer"
            with httpx.Client(timeout=30) as client:
                pending = threading.Thread(
                    target=client.post, args=(url,), kwargs={"content": b"{}",
                                                             "headers": {"x-hold": "1"}})
                pending.start()
                suffix = residency_suffix("hot")

                def counted() -> bool:
                    counts = read_haproxy(proxy.api.query("show stat"), "", False)
                    return (counts.at_model_server.get(("p", suffix, ma.name)) == 1
                            and counts.at_server.get(("p", ma.name)) == 1
                            and counts.held.get("p") == 1)
                assert wait_until(counted, 5)
                a.release.set()
                pending.join(10)

            assert proxy.move(held(mb)) == "runtime"  # holders move: no reload
            assert by("hot") == {"b"}
            assert proxy.move(held()) == "runtime"
            assert by("hot") == {"control"}
            assert proxy.move(held(ma, mb)) == "runtime"
            assert by("hot") == {"a", "b"}
            assert proxy.reloads == 0
        finally:
            proxy.process.stop(2)
