"""The project's import graph: no circle anywhere, and the Python data plane is a leaf
that only the assemblers import (``gateway/server.py``; ``gateway/replica.py``, a
data-plane replica's own forwarder). Every import counts, those
under ``TYPE_CHECKING`` and inside functions included: a circle held together by a
late import is still a circle."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.procs import ROOT

PACKAGES = ("gateway", "converters", "scheduler", "infergate", "loadtests")
DATA_PLANE = "gateway.python"
ASSEMBLERS = {"gateway.server", "gateway.replica"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES
            for p in (ROOT / package).rglob("*.py")}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules ``name`` imports (``from a import b`` is ``a.b`` when that is
    a module, else ``a``; the packages above a module imported are not counted)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            for alias in node.names:
                module = f"{base}.{alias.name}"
                found.add(module if module in known else base)
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports_of(name, path, set(mods)) for name, path in mods.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_project_has_no_import_circle() -> None:
    assert cycles(graph()) == []


def test_only_the_assemblers_import_the_python_data_plane() -> None:
    importers = {name for name, deps in graph().items()
                 if not name.startswith(DATA_PLANE)
                 and any(d == DATA_PLANE or d.startswith(DATA_PLANE + ".") for d in deps)}
    assert importers <= ASSEMBLERS


def test_the_checks_can_fail() -> None:
    """The two checks above see a circle and a stray importer when there is one."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    edges = graph()
    assert "gateway.pools" in edges and "gateway.policy.upstream" in edges["gateway.pools"]
