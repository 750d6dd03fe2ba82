"""State with one owner: no module of the gateway writes another's fields. A member's
live state changes through :class:`~gateway.pools.PoolMember`'s methods only, and what
the gateway knows through :class:`~gateway.state.GatewayState`'s. Checked on the source
itself (every assignment in ``gateway/``), so a shortcut taken tomorrow fails here."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from gateway.pools import PoolMember
from tests.procs import ROOT

GATEWAY = ROOT / "gateway"
# fields set at construction, never changed: anyone may read them
FIXED = {"pool", "spec"}
MEMBER_FIELDS = {f.name for f in dataclasses.fields(PoolMember)} - FIXED
OWNERS = {"members": {"gateway/pools.py"}, "state": {"gateway/state.py"}}


def _assigned_attributes(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, attribute) of every ``x.attr = ...``, ``x.attr += ...``, ``x.attr[...] =``."""
    found: list[tuple[int, str]] = []

    def targets(node: ast.AST) -> list[ast.AST]:
        if isinstance(node, ast.Assign):
            return list(node.targets)
        if isinstance(node, ast.AugAssign | ast.AnnAssign):
            return [node.target]
        return []

    def visit(target: ast.AST) -> None:
        if isinstance(target, ast.Tuple | ast.List):
            for element in target.elts:
                visit(element)
        elif isinstance(target, ast.Subscript):
            visit(target.value)
        elif isinstance(target, ast.Attribute) and not (
                isinstance(target.value, ast.Name) and target.value.id in ("self", "cls")):
            found.append((target.lineno, target.attr))

    for node in ast.walk(tree):
        for target in targets(node):
            visit(target)
    return found


def _writes(attributes: set[str], owners: set[str]) -> list[str]:
    bad = []
    for path in sorted(GATEWAY.rglob("*.py")):
        name = str(path.relative_to(ROOT))
        if name in owners:
            continue
        for line, attr in _assigned_attributes(ast.parse(path.read_text())):
            if attr in attributes:
                bad.append(f"{name}:{line} writes .{attr}")
    return bad


def test_no_module_writes_a_members_fields_but_pools() -> None:
    assert {"healthy", "in_flight", "ejected_until", "restoring"} <= MEMBER_FIELDS
    assert not _writes(MEMBER_FIELDS, OWNERS["members"])


def test_no_module_writes_the_gateways_state_or_pool_lists_but_state() -> None:
    assert not _writes({"members", "pools", "config"}, OWNERS["state"] | OWNERS["members"])


def test_the_check_finds_a_write_when_one_is_there(tmp_path: Path) -> None:
    source = "def f(m, d):\n    m.healthy = False\n    d.x.in_flight += 1\n    self.ok = 1\n" \
             "    a, m.restoring = 1, True\n    p.members[:] = []\n"
    found = {attr for _, attr in _assigned_attributes(ast.parse(source))}
    assert found == {"healthy", "in_flight", "restoring", "members"}
