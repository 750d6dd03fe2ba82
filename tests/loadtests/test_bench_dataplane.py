"""The data plane benchmark's own arithmetic: h2load's output, CPU ticks of a process
tree, Triton's success counts, the medians and the goals beside them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from loadtests import bench_dataplane as bd

H2LOAD_OUT = """\
starting benchmark...
spawning thread #0: 4 total client(s). Timing-based test with 0s of warm-up time and 2s of main duration for measurements.
Application protocol: h2c
Main benchmark duration is over for thread #0. Stopping all clients.

finished in 2.00s, 12621.00 req/s, 1.59MB/s
requests: 25242 total, 25258 started, 25242 done, 25240 succeeded, 2 failed, 0 errored, 0 timeout
status codes: 25240 2xx, 0 3xx, 2 4xx, 0 5xx
traffic: 3.18MB (3332102) total, 74.24KB (76026) headers (space savings 96.28%), 2.29MB (2397990) data
                     min         max         mean         sd        +/- sd
time for request:      242us      6.13ms      1.25ms       384us    83.41%
time for connect:      329us       362us       349us        14us    75.00%
time to 1st byte:     3.52ms      3.58ms      3.56ms        26us    75.00%
req/s           :    3132.81     3166.34     3154.07       15.95    75.00%
"""  # noqa: E501 - h2load's own lines


def stat_line(pid: int, comm: str, ppid: int, utime: int, stime: int, cutime: int = 0,
              cstime: int = 0) -> str:
    return (f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194560 100 0 0 0 "
            f"{utime} {stime} {cutime} {cstime} 20 0 3 0 12345 1000 200\n")


def test_parse_h2load_reads_rate_counts_and_mean_when_output_is_real() -> None:
    h2 = bd.parse_h2load(H2LOAD_OUT)
    assert h2.seconds == pytest.approx(2.0)
    assert h2.req_per_s == pytest.approx(12621.0)
    assert (h2.started, h2.done, h2.succeeded, h2.failed) == (25258, 25242, 25240, 2)
    assert h2.mean_us == pytest.approx(1250.0)


def test_parse_h2load_raises_when_the_summary_is_missing() -> None:
    with pytest.raises(ValueError, match="unexpected h2load output"):
        bd.parse_h2load("starting benchmark...\nconnect: Connection refused\n")


@pytest.mark.parametrize(("text", "us"), [("242us", 242.0), ("6.13ms", 6130.0),
                                          ("1.5s", 1.5e6)])
def test_duration_us_converts_every_unit_h2load_prints(text: str, us: float) -> None:
    assert bd.duration_us(text) == pytest.approx(us)


def test_parse_log_reads_status_and_time_when_lines_are_tab_separated() -> None:
    log = bd.parse_log("1796117577143390\t200\t2839\n1796117577143391\t503\t120\n\n"
                       "1796117577143392\t200\t99\n")
    assert log == [(200, 2839.0), (503, 120.0), (200, 99.0)]
    assert bd.status_counts(log) == {200: 2, 503: 1}


def test_h2load_gist_keeps_counts_and_error_lines_when_a_run_fails() -> None:
    out = ("starting benchmark...\nprogress: 10% done\n"
           "requests: 8 total, 16 started, 8 done, 4 succeeded, 4 failed, 4 errored, 0 timeout\n")
    err = "Stream was reset\nStream was reset\nconnect: Connection refused\n"
    assert bd.h2load_gist(out, err) == (
        "requests: 8 total, 16 started, 8 done, 4 succeeded, 4 failed, 4 errored, 0 timeout"
        " | Stream was reset | connect: Connection refused")
    assert bd.h2load_gist("", "") == "(h2load said nothing)"


def test_last_words_skips_the_box_a_cli_error_is_drawn_in() -> None:
    tail = "Usage: gateway serve\n╭─ Error ─╮\n│ No such option: --nope │\n╰─────────╯\n"
    assert bd.last_words(tail) == "No such option: --nope"


def test_parse_proc_stat_sums_four_tick_fields_when_the_name_has_parentheses() -> None:
    s = bd.parse_proc_stat(stat_line(42, "haproxy (worker) x", 7, 10, 5, 3, 1))
    assert (s.pid, s.ppid, s.name, s.ticks) == (42, 7, "haproxy (worker) x", 19)


def test_parse_proc_stat_reads_this_process_when_given_the_real_file() -> None:
    s = bd.parse_proc_stat(Path(f"/proc/{os.getpid()}/stat").read_text())
    assert s.pid == os.getpid() and s.ppid == os.getppid() and s.ticks >= 0


def test_tree_ticks_counts_live_descendants_but_not_other_processes() -> None:
    stats = [bd.ProcStat(12, 11, "haproxy", 300),  # worker: a grandchild, listed first
             bd.ProcStat(10, 1, "python", 100),    # the gateway
             bd.ProcStat(11, 10, "haproxy", 20),   # master
             bd.ProcStat(20, 1, "tritonserver", 999),  # not the gateway's
             bd.ProcStat(21, 20, "stub", 50)]
    assert [s.pid for s in bd.process_tree(10, stats)] == [10, 11, 12]
    assert bd.tree_ticks(10, stats) == 420
    assert bd.ticks_by_name(10, stats) == {"python": 100, "haproxy": 320}
    assert bd.tree_ticks(99, stats) == 0


def test_tree_ticks_difference_keeps_a_reaped_child_once_when_it_exited_between_reads() -> None:
    before = [bd.ProcStat(10, 1, "gw", 100), bd.ProcStat(11, 10, "m", 40),
              bd.ProcStat(12, 11, "w", 30)]
    # worker 12 burnt 5 more ticks, exited and was reaped: its 35 land in 11's cutime
    after = [bd.ProcStat(10, 1, "gw", 110), bd.ProcStat(11, 10, "m", 40 + 2 + 35),
             bd.ProcStat(13, 11, "w", 7)]  # its replacement
    assert bd.tree_ticks(10, after) - bd.tree_ticks(10, before) == 10 + 2 + 5 + 7


def test_tree_ticks_sees_a_live_child_burning_cpu_when_read_from_proc() -> None:
    clock = os.sysconf("SC_CLK_TCK")
    before = bd.tree_ticks(os.getpid(), bd.read_proc_stats())
    burn = ("import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
            "print('burnt', flush=True)\ntime.sleep(30)\n")
    child = subprocess.Popen([sys.executable, "-c", burn], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "burnt"
        after = bd.tree_ticks(os.getpid(), bd.read_proc_stats())
    finally:
        child.kill()
        child.wait(timeout=10)
    assert after - before >= 0.25 * clock  # alive: in no cutime, only in its own stat


def test_cpu_us_per_request_divides_ticks_by_requests_when_clock_is_100hz() -> None:
    assert bd.cpu_us_per_request(150, 30_000, 100) == pytest.approx(50.0)
    assert bd.cpu_us_per_request(1, 0, 100) != bd.cpu_us_per_request(1, 0, 100)  # nan


def test_success_count_sums_versions_when_triton_reports_several() -> None:
    stats = {"model_stats": [
        {"name": "tiny", "version": "1", "inference_stats": {"success": {"count": 5}}},
        {"name": "tiny", "version": "2", "inference_stats": {"success": {"count": 7}}},
    ]}
    assert bd.success_count(stats) == 12


def test_served_check_flags_grpc_errors_when_triton_served_fewer_than_h2load_counted() -> None:
    h2 = bd.parse_h2load(H2LOAD_OUT.replace("2 failed", "0 failed"))
    assert bd.served_check(h2, 25250, {200: 25242}) == ""
    assert "Triton served 100 < 25240" in bd.served_check(h2, 100, {200: 25242})
    assert bd.served_check(h2, 30000, {200: 25242}) == ""  # others' warm-up: not an error
    assert bd.extra_served(h2, 30000) == 30000 - 25258 and bd.extra_served(h2, 25250) == 0
    problem = bd.served_check(bd.parse_h2load(H2LOAD_OUT), 25250, {200: 25240, 429: 2})
    assert "2 failed" in problem and "{200: 25240, 429: 2}" in problem


def test_h2load_command_multiplexes_grpc_and_opens_one_http1_connection_per_request(
    tmp_path: Path,
) -> None:
    work = bd.Workload("tiny", tmp_path / "t.grpc", tmp_path / "t.bin", 123)
    target = bd.Target("direct", type("E", (), {"grpc_url": "127.0.0.1:1",
                                                 "http_url": "127.0.0.1:2"})(), None)
    grpc = bd.h2load_command(work, "grpc", target.endpoints, 16, "3000ms", None)
    assert grpc[grpc.index("-c") + 1] == "4" and grpc[grpc.index("-m") + 1] == "4"
    assert grpc[-1] == "http://127.0.0.1:1/inference.GRPCInferenceService/ModelInfer"
    http = bd.h2load_command(work, "http", target.endpoints, 16, "3000ms", tmp_path / "l")
    assert "--h1" in http and http[http.index("-c") + 1] == "16"
    assert "Inference-Header-Content-Length: 123" in http
    assert http[-1] == "http://127.0.0.1:2/v2/models/tiny/infer"


def sample(rps: float, p50: float, cpu: float | None = None, problem: str = "") -> bd.Sample:
    split = {} if cpu is None else {"haproxy": cpu * 0.75, "python": cpu * 0.25}
    return bd.Sample(rps, p50, p50 * 2, 1000, cpu, problem, split)


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
                        {"haproxy": 3.25})
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
    assert "| tiny | grpc | 16 | haproxy |" in table and "90 (haproxy 68, python 22)" in table
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


def test_goal_verdicts_apply_each_goal_where_the_issue_sets_it() -> None:
    assert bd.goal_verdicts("efficientnet_lite0", 16, 0.99, None, 900.0) == {
        "throughput_goal": ">=0.98x met"}  # no CPU goal for EfficientNet
    assert bd.goal_verdicts("efficientnet_lite0", 1, 0.5, 0.51, None) == {
        "latency_goal": "<=0.5 ms MISSED"}
    assert bd.goal_verdicts("tiny", 1, None, None, None) == {
        "latency_goal": "<=0.25 ms n/a", "cpu_goal": "<=100 us n/a"}
