"""The overload benchmark's own arithmetic (goodput within the deadline, gRPC bounds, the
share of Triton's work wasted, the open-loop schedule and its h2load command, the
counters read from Triton and the gateway, the rows, table and plot), and its quick
mode run for real (h2load's output itself: test_h2load.py)."""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from loadtests import bench_overload as bo
from loadtests.h2load import Workload, complete_log

D = 100  # ms, the deadline of the synthetic runs


def h2load_log(rows: list[tuple[int, float]]) -> str:
    """h2load's --log-file: start us since the epoch, status, us to the end."""
    return "".join(f"{1796117577000000 + i * 1000}\t{status}\t{us:.0f}\n"
                   for i, (status, us) in enumerate(rows))


# 6 answers in time, 2 late successes, 3 shed at once, 1 late 504, 1 that never came
LOG = ([(200, 20_000.0)] * 5 + [(200, 100_000.0)] + [(200, 150_000.0), (200, 400_000.0)]
       + [(504, 300.0)] * 3 + [(504, 101_000.0), (-1, 0.0)])


# -- goodput and waste ----------------------------------------------------------------

def test_deadline_is_five_alone_p50s_and_never_under_the_floor() -> None:
    assert bo.deadline_ms(17.3) == 87  # 86.5 rounded up
    assert bo.deadline_ms(30.0) == 150
    assert bo.deadline_ms(2.0) == bo.DEADLINE_FLOOR_MS == 50


def test_answered_within_counts_200s_up_to_the_deadline_inclusive() -> None:
    log = complete_log(h2load_log(LOG))
    assert len(log) == len(LOG)
    assert bo.answered_within(log, D) == 6  # the 504s are fast or late, never answers
    assert bo.answered_within(log, 10) == 0 and bo.answered_within(log, 1000) == 8


def test_grpc_answers_in_time_are_bounded_by_sheds_and_successes() -> None:
    latencies = [us for _, us in LOG if us > 0]  # every gRPC answer is HTTP 200
    within = sum(1 for us in latencies if us <= D * 1e3)  # 6 answers + 3 shed
    assert within == 9
    assert bo.grpc_within_bound(latencies, D, successes=8, shed=3) == 6
    assert bo.grpc_within_bound(latencies, D, successes=4, shed=3) == 4  # at most successes
    assert bo.grpc_within_bound(latencies, D, successes=8, shed=12) == 0  # never negative
    # a shed request h2load logged no answer for is not among the 200s within D
    assert bo.grpc_within_bound(latencies, D, successes=8, shed=3, unanswered=3) == 8


def test_slowest_keeps_the_successes_latencies_at_worst() -> None:
    assert bo.slowest([5.0, 1.0, 4.0, 2.0, 3.0], 2) == [4.0, 5.0]
    assert bo.slowest([1.0, 2.0], 5) == [1.0, 2.0]
    assert bo.slowest([1.0, 2.0], 0) == []


def test_wasted_share_is_executions_not_answered_in_time_over_executions() -> None:
    assert bo.wasted_share(200, 150) == 0.25
    assert bo.wasted_share(100, 100) == 0.0
    assert bo.wasted_share(100, 120) == 0.0  # counts that did not settle: never negative
    assert bo.wasted_share(0, 0) is None


# -- the open-loop schedule and its command -------------------------------------------

@pytest.mark.parametrize("rate", [20.0, 58.5, 123.4, 240.0, 628.0, 1500.0])
def test_schedule_offers_the_rate_within_tolerance_in_whole_milliseconds(rate: float) -> None:
    plan = bo.schedule(rate, 3.0)
    assert abs(plan.offered_per_s / rate - 1) <= bo.RATE_TOLERANCE
    assert plan.period_ms >= 1 and plan.burst >= 1
    assert plan.requests == round(plan.offered_per_s * 3.0)
    assert plan.seconds == pytest.approx(3.0, abs=1 / plan.offered_per_s)


def test_schedule_takes_the_smallest_burst_and_refuses_nothing_to_offer() -> None:
    assert (bo.schedule(50.0, 2.0).burst, bo.schedule(50.0, 2.0).period_ms) == (1, 20)
    plan = bo.schedule(628.0, 2.0)  # 1 per 2 ms is 500/s, 2 per 3 ms 667/s, ...
    assert (plan.burst, plan.period_ms) == (5, 8)
    with pytest.raises(ValueError, match="nothing to offer"):
        bo.schedule(0.0, 2.0)


def test_open_loop_command_opens_one_connection_per_request_at_the_rate(
    tmp_path: Path,
) -> None:
    work = Workload("m", tmp_path / "m.grpc", tmp_path / "m.bin", 12)
    endpoints = bo.TritonEndpoints("127.0.0.1", 1, 2, 3)
    plan = bo.Schedule(requests=300, burst=5, period_ms=8)
    for protocol in ("http", "grpc"):
        headers = bo.deadline_headers(protocol, 87)
        cmd = bo.open_loop_command(work, protocol, endpoints, plan, tmp_path / "l.tsv",
                                   headers)
        assert "-D" not in cmd and "--rps" not in cmd
        assert cmd[cmd.index("-c") + 1] == cmd[cmd.index("-n") + 1] == "300"
        assert cmd[cmd.index("-r") + 1] == "5" and "8ms" in cmd
        assert cmd[cmd.index(headers[0]) - 1] == "-H" and cmd[-1].startswith("http://")
    assert bo.deadline_headers("http", 87) == ("X-Request-Timeout-Ms: 87",)
    assert bo.deadline_headers("grpc", 87) == ("grpc-timeout: 87m",)
    assert bo.deadline_headers("grpc", None) == ()


def test_written_config_is_one_pool_of_one_member_with_the_models_bound(
    tmp_path: Path,
) -> None:
    from gateway.config import GatewayConfig

    member = bo.TritonEndpoints("127.0.0.1", 1, 2, 3)
    setup = bo.MODELS["tiny"]
    path = bo.write_config(tmp_path / "gateway.yaml", member, setup)
    config = GatewayConfig.model_validate(yaml.safe_load(path.read_text()))
    [pool] = config.pools
    assert pool.capacity_per_member == setup.capacity_per_member == 1
    assert len(pool.members) == 1 and config.queue_factor == 2.0  # the default
    assert config.models[setup.name].max_queue == setup.max_queue


# -- Triton's and the gateway's counters ----------------------------------------------

TRITON_PAGE = """\
# HELP nv_inference_request_success Number of successful inference requests
# TYPE nv_inference_request_success counter
nv_inference_request_success{{model="m",version="1"}} {success}
nv_inference_request_success{{model="other",version="1"}} 999
# TYPE nv_inference_request_failure counter
nv_inference_request_failure{{model="m",reason="REJECTED",version="1"}} 2
nv_inference_request_failure{{model="m",reason="OTHER",version="1"}} 1
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{{model="m",version="1"}} {pending}
"""

GATEWAY_PAGE = """\
# TYPE infergate_requests_total counter
infergate_requests_total{{model="m",outcome="success",pool="p",protocol="http",traffic="user"}} {ok}
infergate_requests_total{{model="m",outcome="deadline",pool="p",protocol="http",traffic="user"}} {dl}
infergate_requests_total{{model="m",outcome="success",pool="p",protocol="http",traffic="warmup"}} 5
infergate_requests_total{{model="other",outcome="success",pool="p",protocol="http",traffic="user"}} 7
# TYPE infergate_rejected_requests_total counter
infergate_rejected_requests_total{{model="m",reason="deadline"}} {shed}
infergate_rejected_requests_total{{model="m",reason="rejected"}} 4
# TYPE infergate_in_flight_requests gauge
infergate_in_flight_requests{{model="m",pool="p"}} {in_flight}
"""  # noqa: E501 - Prometheus lines as the gateway writes them


def pages(success: int, pending: int, ok: int, dl: int, shed: int, in_flight: int
          ) -> tuple[str, str]:
    return (TRITON_PAGE.format(success=success, pending=pending),
            GATEWAY_PAGE.format(ok=ok, dl=dl, shed=shed, in_flight=in_flight))


def test_counts_read_the_models_counters_from_both_pages() -> None:
    counts = bo.parse_counts(*pages(300, 2, 290, 10, 6, 3), "m")
    assert (counts.executed, counts.failed, counts.pending) == (300.0, 3.0, 2.0)
    assert counts.outcomes == {("http", "success"): 290.0, ("http", "deadline"): 10.0}
    assert (counts.shed, counts.in_flight) == (6.0, 3.0)
    assert counts.outcome("http", "success") == 290 and counts.outcome("grpc", "success") == 0


def test_counts_over_a_run_are_after_minus_before_with_the_gauges_of_after() -> None:
    before = bo.parse_counts(*pages(300, 2, 290, 10, 6, 3), "m")
    after = bo.parse_counts(*pages(500, 0, 400, 60, 46, 0), "m")
    delta = after.minus(before)
    assert (delta.executed, delta.failed, delta.shed) == (200.0, 0.0, 40.0)
    assert delta.outcome("http", "success") == 110 and delta.outcome("http", "deadline") == 50
    assert (delta.pending, delta.in_flight) == (0.0, 0.0)
    assert before.counters() != after.counters()
    assert bo.parse_counts("", "", "m") == bo.Counts()


def test_settled_waits_for_quiet_once_when_read_back_to_back() -> None:
    reads: list[bo.Counts] = []

    def reader(counts: bo.Counts) -> Callable[[], bo.Counts]:
        def read() -> bo.Counts:
            reads.append(counts)
            return counts
        return read

    idle = bo.parse_counts(*pages(300, 0, 290, 10, 6, 0), "m")
    assert bo.settled(reader(idle), quiet_s=0.05, timeout_s=5) == (idle, True)
    assert len(reads) > 1  # read until quiet for quiet_s
    reads.clear()
    assert bo.settled(reader(idle), quiet_s=0.05, timeout_s=5, last=idle) == (idle, True)
    assert len(reads) == 1  # nothing moved since the last settled reading: no wait
    moved = bo.parse_counts(*pages(301, 0, 291, 10, 6, 0), "m")
    busy = bo.parse_counts(*pages(300, 1, 290, 10, 6, 1), "m")  # same counters, in flight
    for counts, still in ((moved, True), (busy, False)):
        reads.clear()
        assert bo.settled(reader(counts), quiet_s=0.05, timeout_s=0.2, last=idle) == (
            counts, still)
        assert len(reads) > 1, counts  # waited for quiet again


# -- one run's figures, the rows ------------------------------------------------------

def arm_run(protocol: str, load_x: int, arm: str, round_: int, log: list[tuple[int, float]],
            executed: int, shed: int, successes: int = 0, requests: int = 0) -> bo.ArmRun:
    plan = bo.Schedule(requests=requests or len(log), burst=1, period_ms=500)  # 2 per s
    counted = bo.Counts(executed=float(executed), shed=float(shed),
                        outcomes={(protocol, "success"): float(successes)})
    return bo.ArmRun(protocol, load_x, arm, round_, D, plan, tuple(log), counted)


def test_http_figures_count_answers_in_time_and_waste_from_the_log() -> None:
    f = bo.figures(arm_run("http", 4, bo.ON, 0, LOG, executed=9, shed=3))
    seconds = len(LOG) / 2
    assert f.exact and f.in_time == 6 and f.successes == 8
    assert f.goodput_per_s == pytest.approx(6 / seconds)
    assert f.shed_per_s == pytest.approx(3 / seconds)
    assert f.unanswered_per_s == pytest.approx(1 / seconds)  # the -1
    assert f.wasted_share == pytest.approx(3 / 9)  # 2 late successes + 1 late 504
    assert f.p50_ms == 20.0 and f.p99_ms == 400.0  # over the 8 successes


def test_grpc_figures_take_successes_from_the_gateway_and_are_bounds() -> None:
    grpc_log = [(200, us) for _, us in LOG if us > 0]  # every gRPC answer is HTTP 200
    f = bo.figures(arm_run("grpc", 4, bo.ON, 0, grpc_log, executed=9, shed=3, successes=8))
    assert not f.exact and f.successes == 8 and f.in_time == 6
    assert f.wasted_share == pytest.approx(3 / 9)
    assert (f.p50_ms, f.p99_ms) == (20.0, 400.0)  # the 8 slowest: 4 x 20, 100, 101, ...
    exact = bo.figures(arm_run("grpc", 1, bo.ON, 0, [(200, 10_000.0)] * 4, executed=4,
                               shed=0, successes=4))
    assert exact.exact and exact.in_time == 4 and exact.wasted_share == 0.0


def synthetic_runs() -> list[bo.ArmRun]:
    """Two rounds of 48 requests per run: the 4x shedding-on goodput 0.9 and then 1.1 of
    the same round's 1x."""
    runs = []
    for r, four_x in enumerate((9, 11)):
        in_time = [(200, 10_000.0)]
        runs += [
            arm_run("http", 1, bo.ON, r, in_time * 10 + [(504, 200.0)] * 2, 10, 2,
                    requests=48),
            arm_run("http", 1, bo.OFF, r, in_time * 6 + [(200, 500_000.0)] * 6, 12, 0,
                    requests=48),
            arm_run("http", 4, bo.ON, r, in_time * four_x + [(504, 200.0)] * 37, four_x, 37,
                    requests=48),
            arm_run("http", 4, bo.OFF, r, in_time + [(200, 900_000.0)] * 47, 48, 0,
                    requests=48),
        ]
    return runs


def test_summary_pairs_each_ratio_with_its_rounds_1x_shedding_on() -> None:
    bases = {"http": bo.Baseline(alone_p50_ms=20.0, capacity_per_s=5.0)}
    rows = bo.summarise(synthetic_runs(), bases, "m", "haproxy", 2.0)
    by = {(r["offered_x"], r["arm"]): r for r in rows}
    assert len(rows) == 4 and by[(1, bo.ON)]["goodput_ratio"] == 1.0
    four = by[(4, bo.ON)]
    assert four["goodput_ratio"] == pytest.approx(1.0)  # median of 0.9 and 1.1
    assert four["goodput_ratio_range"] == pytest.approx([0.9, 1.1])
    assert four["deadline_ms"] == D and four["rounds"] == 2 and four["latency"] == bo.EXACT
    assert four["wasted_share"] == 0.0 and four["met"] == "yes"
    assert "ratio >= 0.9" in four["goal"] and by[(1, bo.ON)]["goal"] == "wasted < 1%"
    off = by[(4, bo.OFF)]
    assert off["goodput_ratio"] == pytest.approx(0.1) and off["goal"] == off["met"] == ""
    assert off["wasted_share"] == pytest.approx(47 / 48) and off["shed_per_s"] == 0.0


def test_verdict_names_what_missed_and_what_was_not_measured() -> None:
    row = {"arm": bo.ON, "offered_x": 4, "goodput_ratio": 0.5, "wasted_share": 0.2,
           "latency": bo.EXACT}
    assert bo.verdict(row)[1] == "NO (ratio >= 0.9, wasted < 1%)"
    assert bo.verdict({**row, "goodput_ratio": None, "wasted_share": 0.0})[1] == (
        "n/a (ratio >= 0.9)")
    bounded = bo.verdict({**row, "goodput_ratio": 1.0, "wasted_share": 0.0,
                          "latency": bo.UPPER_BOUND})
    assert bounded[1] == "yes (bounds)"
    assert bo.verdict({**row, "arm": bo.OFF}) == ("", "")


def test_markdown_and_plot_show_every_row(tmp_path: Path) -> None:
    bases = {"http": bo.Baseline(alone_p50_ms=20.0, capacity_per_s=5.0)}
    rows = bo.summarise(synthetic_runs(), bases, "m", "haproxy", 2.0)
    table = bo.markdown(rows)
    assert table.count("\n| m |") == len(rows)
    assert "deadline D = 100 ms" in table and "1.00 (0.90..1.10)" in table
    assert bo.markdown([]) == "(nothing measured)"
    grpc = [{**r, "protocol": "grpc", "latency": bo.UPPER_BOUND} for r in rows]
    assert "| <=" in bo.markdown(grpc) and "| >=" in bo.markdown(grpc)
    [png] = bo.plot(rows, tmp_path)
    assert png.name == "bench_overload.png" and png.stat().st_size > 1000


# -- the quick mode, for real ---------------------------------------------------------

@pytest.mark.integration
@pytest.mark.slow
def test_quick_run_gives_consistent_rows_for_every_load_and_arm() -> None:
    if shutil.which("h2load") is None:
        pytest.fail("h2load not found: install Debian's nghttp2-client (make system-deps)")
    # the lowest and the highest load (where the goals are judged): 2x adds no case;
    # half-second schedules (4x still sheds within its first few requests) and one run
    # per baseline figure: the rows' consistency does not need the best of two
    rows = bo.run(model="tiny", protocols=("http",), rounds=1, seconds=0.5, loads=(1, 4),
                  baseline_runs=1)
    assert [(r["offered_x"], r["arm"]) for r in rows] == [
        (1, bo.ON), (1, bo.OFF), (4, bo.OFF), (4, bo.ON)]
    for r in rows:
        assert r["model"] == bo.TINY_WORK_NAME and r["latency"] == bo.EXACT
        assert r["capacity_per_s"] > 0 and r["deadline_ms"] >= bo.DEADLINE_FLOOR_MS
        assert r["offered_per_s"] == pytest.approx(r["offered_x"] * r["capacity_per_s"],
                                                   rel=bo.RATE_TOLERANCE)
        # every answer in time was executed by Triton, and a shed request is not answered
        assert 0 <= r["goodput_per_s"] <= r["triton_executed_per_s"]
        assert r["goodput_per_s"] + r["shed_per_s"] <= r["offered_per_s"] * 1.0001
        if r["triton_executed_per_s"] > 0:
            assert 0.0 <= r["wasted_share"] <= 1.0
        if r["arm"] == bo.ON:  # shed by the deadline long before the model's bound
            assert r["refused_per_s"] == 0.0
        assert r["goodput_ratio"] is None or math.isfinite(r["goodput_ratio"])
    by = {(r["offered_x"], r["arm"]): r for r in rows}
    if by[(1, bo.ON)]["goodput_per_s"] > 0:
        assert by[(1, bo.ON)]["goodput_ratio"] == 1.0
    assert all(by[(x, bo.OFF)]["shed_per_s"] == 0.0 for x in (1, 4))  # no deadline sent
    assert by[(4, bo.ON)]["shed_per_s"] > 0  # 4x capacity: the deadline rule shed some
    assert "| tiny_work | http | 4x | on |" in bo.markdown(rows)
