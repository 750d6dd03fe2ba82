"""Golden files: the whole rendered ``haproxy.cfg`` and map files of four representative
snapshots, compared byte for byte, and each configuration accepted by ``haproxy -c``.

The cases: ``open`` (no auth, no rate limits, one pool, one member), ``tenants``
(tenants and priority classes, one with a rate and one with an in-flight limit, a model
with Triton priority levels), ``gated`` (predict
auth with two token digests, a default rate class and a per-key one, a canary split of
one model over two pools, a model not ready, a default route, a pool without members)
and ``versions`` (members on Triton 2.51.0 and 2.57.0 under ``GrpcReuse.AUTO``, the
layout's ``tune.*`` settings). Each renders into the fixed run directory
:data:`RUN_DIR`, so the text does not depend on where the tests run;
``golden/<case>.cfg`` holds the configuration, ``golden/<case>.maps.json`` the maps
(map name -> key -> value).

A deliberate change to the rendering changes these files: rewrite them with

    INFERGATE_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/gateway/haproxy/test_golden.py

and review the diff of ``tests/gateway/haproxy/golden/`` like any other change.
"""

from __future__ import annotations

import difflib
import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from gateway.haproxy.process import write_files
from gateway.haproxy.render import Rendered, render
from gateway.haproxy.snapshot import (
    Layout,
    MemberState,
    PoolState,
    RouteState,
    Snapshot,
    TenancyState,
    TenantState,
    server_name,
    snapshot_from_dict,
    snapshot_to_dict,
)
from gateway.policy.access import key_digest
from gateway.policy.rate import RateClass
from gateway.policy.routing import queue_weight
from gateway.upstream.triton_version import GrpcReuse
from tests.gateway.haproxy.conftest import haproxy_check

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("INFERGATE_UPDATE_GOLDEN") == "1"
RUN_DIR = Path("/run/infergate")


def _layout(run_dir: Path, **changes: object) -> Layout:
    base = Layout("0.0.0.0:8000", "0.0.0.0:8001", "127.0.0.1:8080", "127.0.0.1:8081",
                  run_dir, "127.0.0.1:8082")
    return replace(base, **changes)  # type: ignore[arg-type]


def _member(host: str, version: str | None = None, **changes: object) -> MemberState:
    base = MemberState(server_name(f"{host}:8000"), host, 8000, 8001, True,
                       triton_version=version)
    return replace(base, **changes)  # type: ignore[arg-type]


def _open() -> tuple[Snapshot, dict[str, object]]:
    return Snapshot(pools=(PoolState("main", (_member("10.0.0.11"),)),),
                    routes=(RouteState("resnet50", (("main", 1.0),), 24),)), {}


def _gated() -> tuple[Snapshot, dict[str, object]]:
    return Snapshot(
        pools=(PoolState("main", (_member("10.0.0.11"),
                                  _member("10.0.0.12", weight=queue_weight(1)))),
               PoolState("canary", (_member("10.0.1.11"),)),
               PoolState("spare", ())),
        routes=(RouteState("resnet50", (("main", 0.9), ("canary", 0.1)), 48),
                RouteState("bert", (("main", 1.0),), 12,
                           not_ready="loading on 10.0.0.12:8000 (warming up)")),
        default_route=RouteState("", (("main", 1.0),), 32),
        rate_default=RateClass(100, 200),
        rate_keys=((key_digest("batch-jobs-key"), RateClass(20, 20)),),
        tokens=((key_digest("alice-token-0123456789"), "predict;alice"),
                (key_digest("ops-token-0123456789"), "admin;ops")),
        predict_gated=True,
    ), {}


def _versions() -> tuple[Snapshot, dict[str, object]]:
    return Snapshot(
        pools=(PoolState("main", (_member("10.0.0.11", "2.51.0"),
                                  _member("10.0.0.12", "2.57.0"))),),
        routes=(RouteState("resnet50", (("main", 1.0),), 24),),
    ), {"grpc_upstream_reuse": GrpcReuse.AUTO,
        "tune": (("tune.bufsize", "65536"), ("tune.h2.initial-window-size", "1048576"))}


def _tenants() -> tuple[Snapshot, dict[str, object]]:
    """Tenants (gateway/policy/tenancy.py): a sheddable one with a rate of its own, a
    critical one with an in-flight limit only and weight 2, the default; a per-key rate
    class; the model's measured service time (the deadline rule); the pool queues in the
    gateway (gateway/policy/queueing.py: maxconn, priority class and offset, the queue's
    bound and its answers, a light tenant's lane of one slot a member); the model's
    dynamic batcher has three priority levels (gateway/haproxy/priority_rules.py: the
    class's level, the Lua filters that put it in)."""
    tenants = (TenantState("default", "standard"),
               TenantState("batch", "sheddable", None, RateClass(50, 100)),
               TenantState("app", "critical", 64, weight=2.0))
    return Snapshot(
        pools=(PoolState("main", (_member("10.0.0.11"),), capacity=8, elsewhere=2,
                         member_slots=8, max_wait_ms=5000, lane_slots=1),),
        routes=(RouteState("resnet50", (("main", 1.0),), 24, service=(("main", 4200, 900),)),),
        levels=(("resnet50", 3),),
        rate_keys=((key_digest("batch-jobs-key"), RateClass(20, 20)),),
        tenancy=TenancyState(
            tenants=tenants,
            keys=((key_digest("app-key-0123456789"), "app"),
                  (key_digest("batch-key-0123456789"), "batch")),
            # the pool queues in the gateway: sheddable waits up to 1.5x (Tenancy.in_pool)
            ceilings=(("main", "sheddable", 12), ("main", "standard", 16),
                      ("main", "critical", 24)),
            shares=(("main", "default", 16), ("main", "batch", 12), ("main", "app", 12)),
            bounds=(("sheddable", 334), ("standard", 667), ("critical", 1000)),
            pool_bounds=(("main", "sheddable", 500), ("main", "standard", 667),
                         ("main", "critical", 1000))),
    ), {}


def _rollout() -> tuple[Snapshot, dict[str, object]]:
    """Rollouts (gateway/policy/rollout.py): version 4 takes 25 % of resnet50's
    unversioned requests beside version 3; bert's version 2 is in its shadow step
    beside version 1 (20 % of its unversioned requests to the control plane)."""
    return Snapshot(pools=(PoolState("main", (_member("10.0.0.11"),)),),
                    routes=(RouteState("resnet50", (("main", 1.0),), 24, split=(3, 4, 25)),
                            RouteState("bert", (("main", 1.0),), 12, split=(1, 2, 0),
                                       shadow=20))), {}


def _replica() -> tuple[Snapshot, dict[str, object]]:
    """A data-plane replica (gateway/replica.py): what HAProxy cannot route, and every
    call that is not the control plane's, to its own forwarder (backends ``local_``);
    the control plane's calls fail within a second when it is away, saying so; the
    shadow share to the control plane while it is up, else to the replica."""
    snapshot, _ = _rollout()
    return snapshot, {"local_http": "127.0.0.1:8090", "local_grpc": "127.0.0.1:8091"}


CASES = {"open": _open, "gated": _gated, "versions": _versions, "tenants": _tenants,
         "rollout": _rollout, "replica": _replica}


def _rendered(case: str, run_dir: Path) -> Rendered:
    snapshot, layout_changes = CASES[case]()
    return render(snapshot, _layout(run_dir, **layout_changes))


def _maps_text(rendered: Rendered) -> str:
    return json.dumps(rendered.maps, indent=2, sort_keys=True) + "\n"


def _compare(path: Path, actual: str) -> None:
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual)
        return
    assert path.exists(), f"{path} missing: run with INFERGATE_UPDATE_GOLDEN=1 to write it"
    expected = path.read_text()
    if actual != expected:
        diff = "".join(difflib.unified_diff(
            expected.splitlines(keepends=True), actual.splitlines(keepends=True),
            fromfile=f"{path.name} (golden)", tofile=f"{path.name} (rendered)"))
        pytest.fail(f"rendered output differs from {path} (INFERGATE_UPDATE_GOLDEN=1 "
                    f"rewrites it):\n{diff}", pytrace=False)


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_config_matches_its_golden_file(case: str) -> None:
    _compare(GOLDEN / f"{case}.cfg", _rendered(case, RUN_DIR).config)


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_maps_match_their_golden_file(case: str) -> None:
    _compare(GOLDEN / f"{case}.maps.json", _maps_text(_rendered(case, RUN_DIR)))


@pytest.mark.integration  # runs the real HAProxy (haproxy -c): make test installs it
@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_config_passes_haproxy_check_when_written(case: str, tmp_path: Path) -> None:
    """The golden configuration itself, its run directory moved to ``tmp_path`` (where
    its maps and error files are written), is one HAProxy accepts without a warning (an
    operator reads those at every start: rules in an order HAProxy does not run them,
    settings it ignores)."""
    rendered = _rendered(case, tmp_path)
    layout = _layout(tmp_path, **CASES[case]()[1])
    write_files(rendered, layout)
    golden = (GOLDEN / f"{case}.cfg").read_text()
    assert layout.config_path.read_text() == golden.replace(str(RUN_DIR), str(tmp_path))
    assert json.loads((GOLDEN / f"{case}.maps.json").read_text()) == rendered.maps
    checked = haproxy_check(layout.config_path)
    assert checked.returncode == 0, checked.stderr
    assert "[WARNING]" not in checked.stdout + checked.stderr, checked.stderr


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_golden_snapshot_survives_the_wire_form(case: str) -> None:
    """What a data-plane replica follows is what the control plane rendered: every
    field, the tenancy's per-pool bounds of a pool that queues included."""
    snapshot = CASES[case]()[0]
    wire = json.loads(json.dumps(snapshot_to_dict(snapshot)))
    assert snapshot_from_dict(wire) == snapshot
