"""Snapshots, layouts and ``haproxy -c`` shared by the rendering tests (``test_maps``,
``test_answers``, ``test_config``, ``test_changes``, ``test_render``, ``test_golden``)."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

from gateway.haproxy.process import find_haproxy
from gateway.haproxy.snapshot import (
    Layout,
    MemberState,
    PoolState,
    RouteState,
    Snapshot,
    server_name,
)
from gateway.policy.access import key_digest
from gateway.policy.rate import RateClass


def layout_in(tmp: Path) -> Layout:
    return Layout("127.0.0.1:18000", "127.0.0.1:18001", "127.0.0.1:18002", "127.0.0.1:18003",
                  tmp, tmp / "log.sock")


def member(port: int, routable: bool = True, weight: int = 256) -> MemberState:
    return MemberState(server_name(f"127.0.0.1:{port + 1}"), "127.0.0.1", port, port + 1,
                       routable, weight)


def snapshot(**changes: object) -> Snapshot:
    """Two pools (``main``: two members, ``canary``: one), a 90/10 canary split, a
    default route and rate limits (a default class and one key's)."""
    base = Snapshot(
        pools=(PoolState("main", (member(9000), member(9010))),
               PoolState("canary", (member(9020),))),
        routes=(RouteState("resnet", (("main", 0.9), ("canary", 0.1)), 48),
                RouteState("tiny", (("main", 1.0),), 24)),
        default_route=RouteState("", (("main", 1.0),), 48),
        rate_default=RateClass(100, 200),
        rate_keys=((key_digest("batch-jobs"), RateClass(20, 20)),),
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def haproxy_check(config: Path) -> subprocess.CompletedProcess[str]:
    """``haproxy -c -f config`` with the real HAProxy (its maps and error files must be
    where the configuration names them)."""
    binary = find_haproxy()
    assert binary is not None, "make test installs Debian's haproxy"
    return subprocess.run([binary, "-c", "-f", str(config)],
                          capture_output=True, text=True, check=False)
