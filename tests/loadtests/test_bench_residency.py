"""The residency benchmark's pure parts: Zipf popularity, the schedule and its step,
hit/miss classification, the figures (steady state, recovery after the step, failures),
budgets, the stub's model, the models' sizes, the table and its goals."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

from infergate.triton.local import TritonEndpoints
from loadtests import bench_residency as br
from loadtests import residency_models as rm

MODELS = [f"m{i:02d}" for i in range(40)]


def outcome(t: float, kind: str, phase: int = 0, latency_ms: float = 10.0) -> br.Outcome:
    status = 503 if kind == "failed" else 200
    wait = 1500.0 if kind == "miss" else None
    return br.Outcome(t, "m00", phase, status, latency_ms, wait)


# -- traffic --------------------------------------------------------------------------

def test_zipf_weights_fall_as_rank_to_the_minus_s_and_sum_to_one() -> None:
    w = br.zipf_weights(40, 1.1)
    assert w.sum() == pytest.approx(1.0)
    assert w[0] / w[1] == pytest.approx(2 ** 1.1)
    assert w[0] / w[9] == pytest.approx(10 ** 1.1)
    assert np.all(np.diff(w) < 0)


def test_rankings_turn_by_half_at_the_step_so_the_popular_set_moves() -> None:
    before, after = br.rankings(MODELS, seed=1)
    assert sorted(before) == sorted(after) == MODELS
    assert before != MODELS  # shuffled by the seed
    assert set(before[:20]).isdisjoint(after[:20])  # the top half is new after the step
    assert after[:20] == before[20:]
    assert br.rankings(MODELS, seed=1) == (before, after)
    assert br.rankings(MODELS, seed=2)[0] != before


def test_schedule_is_poisson_at_the_rate_and_the_same_for_the_same_seed() -> None:
    arrivals = br.schedule(MODELS, rate=40, phase_s=100, seed=3)
    assert arrivals == br.schedule(MODELS, rate=40, phase_s=100, seed=3)
    assert arrivals != br.schedule(MODELS, rate=40, phase_s=100, seed=4)
    assert len(arrivals) == pytest.approx(8000, rel=0.05)
    times = [a.t for a in arrivals]
    assert times == sorted(times) and times[0] > 0 and times[-1] < 200
    gaps = np.diff(times)
    assert gaps.mean() == pytest.approx(1 / 40, rel=0.05)
    assert gaps.std() == pytest.approx(gaps.mean(), rel=0.1)  # exponential: std = mean
    assert all(a.phase == int(a.t >= 100) for a in arrivals)


def test_schedule_draws_models_by_zipf_over_each_phases_ranking() -> None:
    arrivals = br.schedule(MODELS, rate=200, phase_s=100, seed=5)
    before, after = br.rankings(MODELS, seed=5)
    weights = br.zipf_weights(40)
    for phase, order in ((0, before), (1, after)):
        counts = Counter(a.model for a in arrivals if a.phase == phase)
        n = sum(counts.values())
        assert counts[order[0]] / n == pytest.approx(weights[0], rel=0.1)
        assert counts[order[1]] / n == pytest.approx(weights[1], rel=0.15)
        top = sum(counts[m] for m in order[:10]) / n
        assert top == pytest.approx(weights[:10].sum(), abs=0.02)
    assert max(Counter(a.model for a in arrivals if a.phase == 1).items(),
               key=lambda kv: kv[1])[0] == after[0] != before[0]


# -- outcomes -------------------------------------------------------------------------

def test_classify_tells_hit_miss_and_failed_by_status_and_the_load_wait_header() -> None:
    assert br.classify(200, None) == "hit"
    assert br.classify(200, 0.0) == "miss"
    assert br.classify(200, 2300.0) == "miss"
    assert br.classify(503, None) == "failed"
    assert br.classify(503, 900.0) == "failed"
    assert br.classify(-1, None) == "failed"


def test_load_wait_reads_the_header_and_is_none_without_it() -> None:
    assert br.load_wait({"infergate-load-wait-ms": "1234"}) == 1234.0
    assert br.load_wait({"infergate-load-wait-ms": "soon"}) == 0.0
    assert br.load_wait({"content-type": "application/json"}) is None


def test_steady_keeps_the_second_half_of_each_phase() -> None:
    runs = [outcome(t, "hit", int(t >= 100)) for t in (10, 49.9, 50, 99, 100, 149, 150, 199)]
    assert [o.t for o in br.steady(runs, 100)] == [50, 99, 150, 199]


def test_recovery_is_the_first_window_after_the_step_above_the_threshold() -> None:
    # misses for 25 s after a step at 100 s, then hits only (one request a second)
    runs = [outcome(t, "hit" if t < 100 or t >= 125 else "miss", int(t >= 100))
            for t in range(0, 200)]
    # the window [t - 10, t) is > 90 % hits once it holds at most 0 misses: t - 10 >= 125
    assert br.recovery_s(runs, 100.0) == 35.0
    # a window of 10 requests with one miss is exactly 90 %: not above
    assert br.recovery_s(runs, 100.0, threshold=0.85) == 34.0
    assert br.recovery_s([outcome(t, "hit", 1) for t in range(100, 200)], 100.0) == 10.0
    assert br.recovery_s([outcome(t, "miss", 1) for t in range(100, 200)], 100.0) is None
    assert br.recovery_s([outcome(t, "hit") for t in range(0, 100)], 100.0) is None


def test_figures_count_hits_misses_failures_and_their_latencies() -> None:
    runs = ([outcome(i, "hit", latency_ms=float(i + 1)) for i in range(100)]
            + [outcome(100 + i, "miss", latency_ms=1000.0 + i) for i in range(10)]
            + [br.Outcome(120, "m00", 1, -1, 15000.0, None), outcome(121, "failed")])
    assert br.hit_share(runs) == pytest.approx(100 / 112)
    assert br.latency(runs, "hit", 50) == 50.0 and br.latency(runs, "hit", 99) == 99.0
    assert br.latency(runs, "miss", 50) == 1004.0
    assert br.latency([], "miss", 50) is None and br.hit_share([]) is None
    assert br.failures(runs) == {"none": 1, "503": 1}
    series = br.hit_series(runs, bin_s=50)
    assert series[0] == (25.0, 1.0) and series[2] == (125.0, 0.0)


def test_ideal_hit_share_packs_the_most_requested_per_byte_into_the_budgets() -> None:
    names = [f"m{i}" for i in range(4)]
    even = dict.fromkeys(names, 10)
    # room for everything: every request hits
    assert br.ideal_hit_share(names, even, budget=20, seed=0) == pytest.approx(1.0)
    # room for one model on each of two members: the two most popular, in both phases
    w = br.zipf_weights(4)
    assert br.ideal_hit_share(names, even, budget=10, seed=0) == pytest.approx(w[:2].sum())
    assert br.ideal_hit_share(names, even, budget=10, seed=0, members=1) == pytest.approx(w[0])
    # a model larger than any budget is never counted
    huge = dict.fromkeys(names, 11)
    assert br.ideal_hit_share(names, huge, budget=10, seed=0) == 0.0


def test_parse_knob_reads_the_value_as_yaml() -> None:
    assert br.parse_knob("min_resident_s=10") == ("min_resident_s", 10)
    assert br.parse_knob("waiting_room={max_requests: 128}") == (
        "waiting_room", {"max_requests": 128})
    with pytest.raises(Exception, match="NAME=VALUE"):
        br.parse_knob("min_resident_s")


# -- budgets and members --------------------------------------------------------------

def test_quarter_budget_and_first_fit_take_the_catalogue_in_order() -> None:
    footprints = {"a": 40, "b": 10, "c": 30, "d": 5, "e": 15}
    budget = br.quarter_budget(footprints)
    assert budget == 25  # ceil(100 / 4)
    assert br.first_fit(list(footprints), footprints, budget) == ["b", "d"]
    assert br.first_fit(list(footprints), footprints, 60) == ["a", "b", "d"]
    assert br.first_fit(list(footprints), footprints, 1) == []


def test_stub_model_reads_the_model_from_the_stubs_command_line() -> None:
    stub = ["/x/backends/python/triton_python_backend_stub", "/repo/m07_10mb/1/model.py",
            "triton_python_backend_shm_region_3", "1048576", "1048576", "4242", "/x/python",
            "54", "m07_10mb_0_0", "DEFAULT"]
    assert br.stub_model(stub) == "m07_10mb"
    assert br.stub_model(["/x/bin/tritonserver", "--model-repository=/repo"]) is None
    assert br.stub_model([]) is None


def test_model_sizes_aim_at_their_weights_and_names_carry_the_size() -> None:
    names = rm.model_names()
    assert len(names) == 40 and len({n for n, _ in names}) == 40
    assert {size.label for _, size in names} == {"1MB", "10MB", "40MB"}
    assert names[0][0] == "m00_1mb" and names[-1][0] == "m39_40mb"
    for size in rm.SIZES:
        h = size.hidden
        assert 4 * h * (rm.INPUT_WIDTH + h + rm.OUTPUT_WIDTH) == pytest.approx(
            size.weight_bytes, rel=0.01)


def test_mlp_onnx_writes_the_weights_it_reports_and_seeds_differ(tmp_path: Path) -> None:
    a = rm.mlp_onnx(tmp_path / "a.onnx", 32, seed=1)
    rm.mlp_onnx(tmp_path / "b.onnx", 32, seed=2)
    assert a == 4 * 32 * (256 + 32 + 16)
    one, two = (onnx.load(str(tmp_path / f"{n}.onnx")) for n in "ab")
    assert [i.name for i in one.graph.input] == [rm.INPUT_NAME]
    assert sum(onnx.numpy_helper.to_array(w).nbytes for w in one.graph.initializer) == a
    assert not np.array_equal(onnx.numpy_helper.to_array(one.graph.initializer[0]),
                              onnx.numpy_helper.to_array(two.graph.initializer[0]))


# -- the report -----------------------------------------------------------------------

def row(arm: str, **figures: object) -> dict[str, object]:
    base: dict[str, object] = {
        "arm": arm, "models": 40, "loaded_at_start": 0, "requests": 1000, "offered_rps": 40.0,
        "phase_s": 100.0, "ideal_hit_share": 0.87,
        "hit_share": 0.9, "steady_hit_share": 0.96, "hits_p50_ms": 3.0, "hits_p99_ms": 10.0,
        "misses": 50, "misses_p50_ms": 900.0, "misses_p99_ms": 2500.0,
        "throughput_rps": 40.0, "failed": 0, "failed_by_status": {}, "loads_per_min": 6.0,
        "evictions_per_min": 4.0, "recovery_s": 30.0, "budget_bytes": 500_000_000,
        "max_used_bytes": 400_000_000, "max_stubs_uss": 450_000_000,
        "max_rss_above_idle": 600_000_000, "hit_series": [(2.5, 0.5), (7.5, 1.0)],
        "memory": [{"t": 1.0, "member": m, "stubs_uss": 1, "rss_above_idle": 2,
                    "used_bytes": 3, "models": 1} for m in (0, 1)]}
    base.update(figures)
    return base


def test_goals_are_met_or_missed_by_their_figures() -> None:
    rows = [row("all resident", hits_p99_ms=9.5, steady_hit_share=1.0),
            row("residency")]
    verdicts = {goal: met for goal, met, _ in br.goals(rows)}
    assert all(verdicts.values()), verdicts
    worse = [rows[0], row("residency", steady_hit_share=0.94, hits_p99_ms=11.0, failed=2,
                          max_stubs_uss=500_000_001, recovery_s=None)]
    assert [met for _, met, _ in br.goals(worse)] == [False] * 5
    assert br.goals(worse)[-1][2] == "never in the 100 s after it"
    alone = {goal: (met, text) for goal, met, text in br.goals([rows[1]])}
    assert alone["hits' p99 within 1.1x of all-resident"] == (None, "n/a (no all-resident arm)")
    assert br.goals([rows[0]]) == []  # no residency arm, no goals


def test_markdown_puts_the_arms_side_by_side_with_each_goal_judged() -> None:
    rows = [row("all resident", recovery_s=None),
            row("residency", failed=3, failed_by_status={"503": 2, "none": 1})]
    text = br.markdown(rows)
    assert "| figure | all resident | residency |" in text
    assert "| hit ratio at steady state | 96.0 % | 96.0 % |" in text
    assert "| failed requests | 0 | 3 (503: 2, none: 1) |" in text
    assert "| back above 90 % hits after the step | never | 30 s |" in text
    assert "- MISSED: 0 failed requests: 3" in text
    assert "- MET: hits' p99 within 1.1x of all-resident: 1.00x" in text
    assert "budget 500 MB per member" in text
    assert "would take 87.0 % of the requests" in text


def test_plot_writes_one_png(tmp_path: Path) -> None:
    paths = br.plot([row("all resident"), row("residency")], tmp_path)
    assert [p.name for p in paths] == ["bench_residency.png"]
    assert paths[0].stat().st_size > 10_000


def test_member_view_finds_the_member_by_its_grpc_or_http_address() -> None:
    member = TritonEndpoints("127.0.0.1", 8000, 8001, 8002)
    view = [{"key": "127.0.0.1:9001", "used_bytes": 1},
            {"key": "127.0.0.1:8001", "used_bytes": 2}]
    assert br.member_view(view, member) == view[1]
    assert br.member_view([{"key": "cpu/127.0.0.1:8000", "used_bytes": 3}], member) == {
        "key": "cpu/127.0.0.1:8000", "used_bytes": 3}
    assert br.member_view(view[:1], member) is None
