"""The benchmarks stand side by side: what two of them share lives in the harness
(loadtests/harness.py, h2load.py, benchkit.py), so no bench_*.py imports another."""

from __future__ import annotations

import ast
from pathlib import Path

LOADTESTS = Path(__file__).resolve().parents[2] / "loadtests"


def imported_modules(path: Path) -> set[str]:
    """The ``loadtests`` modules a file imports (``import loadtests.x``,
    ``from loadtests.x import y``, ``from loadtests import x``, ``from . import x``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name.removeprefix("loadtests.") for a in node.names
                      if a.name.startswith("loadtests.")}
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative: within loadtests
                module = f"loadtests.{module}".rstrip(".")
            if module == "loadtests":
                found |= {a.name for a in node.names}
            elif module.startswith("loadtests."):
                found.add(module.removeprefix("loadtests."))
    return found


def test_no_benchmark_imports_another() -> None:
    benches = {p.stem: p for p in LOADTESTS.glob("bench_*.py")}
    assert len(benches) >= 10
    crossing = {name: sorted(imported_modules(path) & set(benches) - {name})
                for name, path in benches.items()}
    assert {name: found for name, found in crossing.items() if found} == {}


def test_the_import_reader_sees_every_form_of_import(tmp_path: Path) -> None:
    source = tmp_path / "bench_x.py"
    source.write_text("import loadtests.bench_a\nfrom loadtests.bench_b import f\n"
                      "from loadtests import bench_c, harness\nfrom . import bench_d\n"
                      "from .bench_e import g\nimport os\n")
    assert imported_modules(source) == {"bench_a", "bench_b", "bench_c", "harness",
                                        "bench_d", "bench_e"}
