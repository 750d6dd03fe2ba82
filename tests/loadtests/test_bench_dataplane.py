"""The data plane benchmark's own arithmetic: Triton's success counts, the medians and
the goals beside them (h2load's output: test_h2load.py; CPU ticks: test_proc_cpu.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtests import bench_dataplane as bd
from loadtests.h2load import parse_h2load
from tests.loadtests.test_h2load import H2LOAD_OUT


def test_success_count_sums_versions_when_triton_reports_several() -> None:
    stats = {"model_stats": [
        {"name": "tiny", "version": "1", "inference_stats": {"success": {"count": 5}}},
        {"name": "tiny", "version": "2", "inference_stats": {"success": {"count": 7}}},
    ]}
    assert bd.success_count(stats) == 12


def test_served_check_flags_grpc_errors_when_triton_served_fewer_than_h2load_counted() -> None:
    h2 = parse_h2load(H2LOAD_OUT.replace("2 failed", "0 failed"))
    assert bd.served_check(h2, 25250, {200: 25242}) == ""
    assert "Triton served 100 < 25240" in bd.served_check(h2, 100, {200: 25242})
    assert bd.served_check(h2, 30000, {200: 25242}) == ""  # others' warm-up: not an error
    assert bd.extra_served(h2, 30000) == 30000 - 25258 and bd.extra_served(h2, 25250) == 0
    problem = bd.served_check(parse_h2load(H2LOAD_OUT), 25250, {200: 25240, 429: 2})
    assert "2 failed" in problem and "{200: 25240, 429: 2}" in problem


def sample(rps: float, p50: float, cpu: float | None = None, problem: str = "") -> bd.Sample:
    split = {} if cpu is None else {"haproxy": cpu * 0.75, "python": cpu * 0.25}
    return bd.Sample(rps, p50, p50 * 2, 1000, cpu, problem, split, seconds=0.5)


def test_summarise_reports_median_ratio_added_latency_and_goals_per_data_plane() -> None:
    samples = {
        ("tiny", "grpc", 16, "direct"): [sample(10_000, 1.0), sample(9_000, 1.2),
                                         sample(11_000, 0.9)],
        ("tiny", "grpc", 16, "haproxy"): [sample(9_000, 1.1, 80), sample(8_000, 1.3, 90),
                                          sample(100, 9.0, 500)],
        ("tiny", "grpc", 1, "direct"): [sample(4_000, 0.25)],
        ("tiny", "grpc", 1, "haproxy"): [sample(3_000, 0.6, 120, "Triton served 1 < 2")],
    }
    rows = bd.summarise(samples, ["haproxy", "python"],  # python did not start: no rows
                        {"haproxy": {"python": 3.0, "haproxy": 0.25}})
    assert [(r["in_flight"], r["data_plane"]) for r in rows] == [(16, "haproxy"),
                                                                 (1, "haproxy")]
    c16, c1 = rows
    # each round's gateway run against the same round's direct run; median, not mean
    assert c16["throughput_ratio"] == pytest.approx(8_000 / 9_000)
    assert c16["throughput_ratio_range"] == pytest.approx([100 / 11_000, 9_000 / 10_000])
    assert c16["gateway_rps"] == 8_000 and c16["direct_rps"] == 10_000
    assert c16["throughput_goal"] == ">=0.85x met" and "latency_goal" not in c16
    assert c16["gateway_cpu_us_per_request"] == 90 and c16["cpu_goal"] == "<=100 us met"
    assert c16["verified"] is True and "problems" not in c16
    assert c1["added_p50_ms"] == pytest.approx(0.35)
    assert c1["latency_goal"] == "<=0.25 ms MISSED" and "throughput_goal" not in c1
    assert c1["verified"] is False and c1["problems"] == ["haproxy: Triton served 1 < 2"]
    assert c16["gateway_cpu_split_us"] == {"haproxy": 67.5, "python": 22.5}
    table = bd.markdown(rows)
    # idle burn over the run's 0.5 s, per 1000 requests: python 15 us, haproxy 1.25 us
    assert c16["gateway_cpu_split_above_idle_us"] == {"haproxy": pytest.approx(66.25),
                                                      "python": pytest.approx(7.5)}
    assert "| tiny | grpc | 16 | haproxy |" in table
    assert "90 (haproxy 68 [66], python 22 [8])" in table
    assert c16["gateway_idle_cpu_pct"] == 3.25 and "haproxy 3.2" in table


def test_summarise_counts_a_failed_run_as_no_throughput_and_no_latency() -> None:
    samples = {
        ("tiny", "http", 1, "direct"): [sample(4_000, 0.2), sample(4_000, 0.2),
                                        sample(4_000, 0.2)],
        ("tiny", "http", 1, "haproxy"): [sample(3_000, 0.3, 100), bd.Sample.failed("x"),
                                         bd.Sample.failed("y")],
        ("tiny", "http", 16, "direct"): [sample(9_000, 1.0)],
        ("tiny", "http", 16, "haproxy"): [bd.Sample.failed("no request succeeded")],
    }
    c1, c16 = bd.summarise(samples, ["haproxy"])
    assert c1["gateway_rps"] == 0.0 and c1["throughput_ratio"] == 0.0  # 2 of 3 runs failed
    assert c1["added_p50_ms"] == pytest.approx(0.1)  # from the run that answered
    assert c1["latency_goal"] == "<=0.25 ms met"
    assert c1["verified"] is False and c1["problems"] == ["haproxy: x", "haproxy: y"]
    assert c16["gateway_p50_ms"] is None and c16["gateway_cpu_us_per_request"] is None
    assert c16["throughput_goal"] == ">=0.85x MISSED" and c16["cpu_goal"] == "<=100 us n/a"
    assert "latency_goal" not in c16
    assert "n/a" in bd.markdown([c16])
    assert "NO: haproxy: x (+1 more in the JSON)" in bd.markdown([c1])


def test_plot_writes_a_png_when_a_data_plane_has_no_figures(tmp_path: Path) -> None:
    samples = {("tiny", "http", 16, "direct"): [sample(9_000, 1.0)],
               ("tiny", "http", 16, "haproxy"): [bd.Sample.failed("no request succeeded")],
               ("tiny", "http", 1, "direct"): [sample(4_000, 0.2)],
               ("tiny", "http", 1, "haproxy"): [bd.Sample.failed("no request succeeded")]}
    (path,) = bd.plot(bd.summarise(samples, ["haproxy"]), tmp_path)
    assert path.read_bytes().startswith(b"\x89PNG")


def test_parse_plane_maps_a_name_to_the_flag_and_allows_no_flag_at_all() -> None:
    assert bd.parse_plane("haproxy") == ("haproxy", ("--data-plane", "haproxy"))
    assert bd.parse_plane("python=") == ("python", ())
    assert bd.parse_plane("py=--data-plane python --log-level 'info'") == (
        "py", ("--data-plane", "python", "--log-level", "info"))
    with pytest.raises(ValueError):
        bd.parse_plane("=--data-plane haproxy")


def test_default_planes_falls_back_to_the_plain_gateway_when_it_lacks_the_flag() -> None:
    assert bd.default_planes("--pools <file>\n--data-plane <str> haproxy or python") == [
        ("haproxy", ("--data-plane", "haproxy")), ("python", ("--data-plane", "python"))]
    assert bd.default_planes("--pools <file>\n--http-port <int>") == [("python", ())]
    both_modes = bd.default_planes("--data-plane <str>\n--grpc-upstream-reuse "
                                   "[auto|shared|per-request]")
    assert both_modes == [
        ("haproxy", ("--data-plane", "haproxy")),
        ("haproxy-shared", ("--data-plane", "haproxy", "--grpc-upstream-reuse", "shared")),
        ("python", ("--data-plane", "python"))]


def test_goal_verdicts_apply_each_goal_where_the_issue_sets_it() -> None:
    assert bd.goal_verdicts("efficientnet_lite0", 16, 0.99, None, 900.0) == {
        "throughput_goal": ">=0.98x met"}  # no CPU goal for EfficientNet
    assert bd.goal_verdicts("efficientnet_lite0", 1, 0.5, 0.51, None) == {
        "latency_goal": "<=0.5 ms MISSED"}
    assert bd.goal_verdicts("tiny", 1, None, None, None) == {
        "latency_goal": "<=0.25 ms n/a", "cpu_goal": "<=100 us n/a"}
