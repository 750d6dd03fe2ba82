"""The soak script's pure parts: percentiles, the per-window tally, samples, summary,
CSV and plot files (no gateway)."""

from __future__ import annotations

import csv
from pathlib import Path

from loadtests.soak import Sample, Window, is_fault, percentile, plot, sample, summarize, write_csv


def test_percentile_is_nearest_rank_and_zero_when_empty() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 99) == 99.0
    assert percentile(values, 50) == 50.0
    assert percentile([3.0], 99) == 3.0
    assert percentile([], 99) == 0.0


def test_is_fault_only_for_server_errors() -> None:
    assert is_fault("500") and is_fault("503") and is_fault("INTERNAL") and is_fault("UNKNOWN")
    assert not any(is_fault(a) for a in ("200", "400", "404", "429", "OK", "INVALID_ARGUMENT"))


def test_window_counts_faults_and_unexpected_answers() -> None:
    window = Window()
    window.record(True, "200", 0.002)
    window.record(True, "OK", 0.004)
    window.record(False, "400", 0.001)  # a client mistake answered as one
    window.record(False, "200", 0.001)  # a bad request accepted: unexpected
    window.record(True, "500", 0.010)  # a fault, and unexpected
    assert (window.requests, window.faults, window.unexpected) == (5, 1, 2)
    assert window.latencies_s == [0.002, 0.004]


def test_sample_and_summary_show_growth_over_second_half() -> None:
    samples = [sample(5.0 * i, Window(latencies_s=[0.001 * i], requests=50), 5.0,
                      (100 + i) << 20, 40 + (i // 2)) for i in range(1, 9)]
    assert samples[0] == Sample(5.0, 101.0, 40, 10.0, 1.0, 1.0, 0, 0)
    summary = summarize(samples)
    assert summary["rss_mb"] == {"first": 101.0, "last": 108.0, "max": 108.0,
                                 "second_half_growth": 3.0}
    assert summary["open_fds"]["second_half_growth"] == 2  # type: ignore[index]
    assert summary["faults"] == 0 and summarize([]) == {}


def test_csv_and_plot_written(tmp_path: Path) -> None:
    samples = [sample(5.0 * i, Window(latencies_s=[0.002], requests=10), 5.0, 1 << 27, 30)
               for i in range(1, 4)]
    write_csv(tmp_path / "soak.csv", samples)
    rows = list(csv.DictReader((tmp_path / "soak.csv").open()))
    assert len(rows) == 3 and rows[0]["rss_mb"] == "128.0"
    plot(tmp_path / "soak.png", samples, "test")
    assert (tmp_path / "soak.png").read_bytes()[:4] == b"\x89PNG"
