"""HAProxy's variables in the rendered configurations: each read is of a variable set in
the same scope (a read in the other scope would be empty, silently), and a variable of
the ``req`` scope, which HAProxy frees when the response begins, is read only by the
frontends' request rules, their ACLs and their ``use_backend`` rules: what the log line,
the response rules, the backends and the Lua filters read is in ``txn``
(gateway/haproxy/frontend.py)."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import pytest

from gateway.haproxy.render import render
from gateway.haproxy.snapshot import MemberState, PoolState, RouteState, Snapshot, server_name
from tests.gateway.haproxy.test_golden import CASES, _layout

LUA = Path(__file__).parents[3] / "gateway" / "haproxy"
FETCHES = {"req": {"body", "hdr", "fhdr"}, "txn": set()}  # sample fetches, not variables
SET = re.compile(r"set-var\((txn|req)\.(\w+)\)")
NAMED = re.compile(r"\b(txn|req)\.([a-z_0-9]+)\b(?!\()")
REQUEST_SIDE = {"http-request", "use_backend", "acl"}


def _resident() -> Snapshot:
    """Managed models, each with its own backends (residency: ``req.rb``)."""
    member = MemberState(server_name("10.0.0.11:8000"), "10.0.0.11", 8000, 8001, True)
    return Snapshot(pools=(PoolState("main", (member,)),), routes=(
        RouteState("hot", (("main", 1.0),), 24, holders=(("main", (member.name,)),)),
        RouteState("cold", (("main", 1.0),), 24, holders=(("main", ()),))))


def _configs() -> dict[str, str]:
    configs = {"resident": render(_resident(), _layout(Path("/run/infergate"))).config}
    for case, build in CASES.items():
        snapshot, changes = build()
        configs[case] = render(snapshot, _layout(Path("/run/infergate"), **changes)).config
    return configs


def _uses(config: str) -> tuple[set[str], dict[str, set[str]]]:
    """The variables set, and each variable read with the places (section and
    directive) that read it."""
    set_: set[str] = set()
    reads: dict[str, set[str]] = defaultdict(set)
    section = ""
    for line in config.splitlines():
        if line and not line[0].isspace():
            section = line.split()[0]
            continue
        directive = (line.split() or [""])[0]
        set_.update(f"{scope}.{name}" for scope, name in SET.findall(line))
        for scope, name in NAMED.findall(SET.sub("", line)):
            if name not in FETCHES[scope]:
                reads[f"{scope}.{name}"].add(f"{section} {directive}")
    return set_, reads


def _lua_reads() -> set[str]:
    return {name for path in LUA.glob("*.lua")
            for name in re.findall(r'get_var\("([a-z]+\.\w+)"\)', path.read_text())}


@pytest.mark.parametrize("case", [*CASES, "resident"])
def test_every_variable_read_is_set_in_its_scope_and_req_stays_with_the_request(
        case: str) -> None:
    set_, reads = _uses(_configs()[case])
    # the ACLs are declared, and the log line names its fields, whatever the snapshot
    # sets: read there, a variable this configuration never sets is empty by design
    required = {name for name, where in reads.items()
                if {p.split()[1] for p in where} - {"acl", "log-format"}}
    assert required <= set_, sorted(required - set_)
    for name, where in reads.items():
        if name.startswith("req."):
            outside = {p for p in where
                       if not (p.startswith("frontend ") and p.split()[1] in REQUEST_SIDE)}
            assert not outside, (name, sorted(outside))
    assert all(name.startswith("txn.") for name in _lua_reads())


def test_every_variable_read_is_set_in_its_scope_by_some_configuration() -> None:
    """The ACLs, the log line and the Lua filters included."""
    everything = [_uses(config) for config in _configs().values()]
    set_ = set().union(*(s for s, _ in everything))
    reads = set().union(*(r for _, r in everything)) | _lua_reads()
    assert reads <= set_, sorted(reads - set_)
