"""`make bench`'s report: every benchmark that exists runs, missing ones are noted, a
failing one does not hide the others, and every ratio reaches the summary table."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from loadtests import bench


def fake_benchmark(monkeypatch: pytest.MonkeyPatch, name: str, run: object,
                   **extra: object) -> None:
    module = types.ModuleType(f"loadtests.{name}")
    module.run = run  # type: ignore[attr-defined]
    for key, value in extra.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, f"loadtests.{name}", module)


def test_bench_report_lists_ratios_and_skips_missing_modules(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    rows = [{"model": "tiny", "concurrency": 16, "throughput_ratio": 0.75, "p50_ms": 1.5}]

    def plot(rows: list[dict[str, object]], out: Path) -> list[Path]:
        path = out / "fake.png"
        path.write_bytes(b"png")
        return [path]

    fake_benchmark(monkeypatch, "bench_ok", lambda: rows, plot=plot)
    fake_benchmark(monkeypatch, "bench_broken", lambda: 1 / 0)
    known = (("bench_ok", "works"), ("bench_broken", "raises"),
             ("bench_not_written_yet", "absent"))
    monkeypatch.setattr(bench, "BENCHMARKS", known)
    monkeypatch.setattr(bench, "discovered", lambda k: list(k))
    code = bench.main(["--out", str(tmp_path)])
    text = (tmp_path / "BENCHMARKS.md").read_text()
    assert code == 1  # a failed benchmark fails `make bench`, after writing the report
    assert "| bench_ok | throughput_ratio | 0.75x | model=tiny, concurrency=16 |" in text
    assert "| bench_broken | failed |" in text and "ZeroDivisionError" in text
    assert "| bench_not_written_yet | skipped |" in text
    assert "![fake](fake.png)" in text
    assert (tmp_path / "bench_ok.json").is_file()


def test_bench_main_rejects_unknown_names(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        bench.main(["--out", str(tmp_path), "--only", "bench_nope"])


def test_bench_discovers_benchmark_modules_beyond_the_known_list() -> None:
    names = [name for name, _ in bench.discovered((("bench_batching", "b"),))]
    assert names[0] == "bench_batching"
    assert "bench_coldstart" in names and "bench" not in names and "benchkit" not in names
