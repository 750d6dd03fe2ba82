"""The residency benchmark's pure parts: the phases' popularity and reshuffles, the
schedule (protocols included), the best fixed placement, failures by cause, hit/miss,
the figures (p99 per protocol, recovery after each reshuffle, held and failed), answers
checked against the model's weights, budgets, the stub's model, the models' sizes, the
tables and the goals."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from infergate.triton.local import TritonEndpoints
from loadtests import bench_residency as br
from loadtests import residency_models as rm

MODELS = [f"m{i:02d}" for i in range(36)]


def outcome(t: float, kind: str, phase: int = 0, latency_ms: float = 10.0,
            protocol: str = "http", model: str = "m00") -> br.Outcome:
    code = "503" if kind == "failed" else "200"
    wait = 1500.0 if kind == "miss" else None
    message = "model 'm00' is being loaded, and the waiting room of pool 'cpu' is full" \
        if kind == "failed" else ""
    return br.Outcome(t, model, phase, protocol, code, latency_ms, wait, message)


# -- the schedule ---------------------------------------------------------------------

def test_zipf_weights_fall_as_rank_to_the_minus_s_and_sum_to_one() -> None:
    for s in (br.FLAT_S, br.STEEP_S):
        w = br.zipf_weights(36, s)
        assert w.sum() == pytest.approx(1.0)
        assert w[0] / w[1] == pytest.approx(2 ** s)
        assert np.all(np.diff(w) < 0)
    # steep: the top ten take more than when flat
    assert br.zipf_weights(36, 1.3)[:10].sum() > br.zipf_weights(36, 0.9)[:10].sum() + 0.1


def test_phases_are_flat_then_steep_with_two_reshuffles() -> None:
    assert len(br.PHASES) >= 4
    assert [p.s for p in br.PHASES] == [0.9, 0.9, 1.3, 1.3]
    assert br.reshuffles(60.0) == [60.0, 180.0]
    assert br.reshuffles(30.0) == [30.0, 90.0]


def test_rankings_turn_by_half_at_each_reshuffle_so_the_popular_set_moves() -> None:
    orders = br.rankings(MODELS, seed=1, count=3)
    assert all(sorted(o) == MODELS for o in orders)
    assert orders[0] != MODELS  # shuffled by the seed
    for before, after in zip(orders, orders[1:], strict=False):
        assert set(after[:18]) == set(before[18:])  # the least popular half leads
        assert after[:18] != before[18:]  # each half shuffled again
    assert br.rankings(MODELS, seed=1, count=3) == orders
    assert br.rankings(MODELS, seed=2, count=3)[0] != orders[0]


def test_popularity_keeps_the_ranking_when_only_the_exponent_changes() -> None:
    p = br.popularity(MODELS, seed=1)
    top = [max(phase, key=lambda m: phase[m]) for phase in p]
    assert top[1] == top[2] != top[0]  # steep phase: same ranking as the one before
    assert top[3] != top[2]
    assert p[2][top[2]] > p[1][top[1]]  # steeper: the top model takes more


def test_schedule_is_poisson_at_the_rate_and_the_same_for_the_same_seed() -> None:
    arrivals = br.schedule(MODELS, rate=40, phase_s=50, seed=3)
    assert arrivals == br.schedule(MODELS, rate=40, phase_s=50, seed=3)
    assert arrivals != br.schedule(MODELS, rate=40, phase_s=50, seed=4)
    assert len(arrivals) == pytest.approx(8000, rel=0.05)
    times = [a.t for a in arrivals]
    assert times == sorted(times) and times[0] > 0 and times[-1] < 200
    gaps = np.diff(times)
    assert gaps.mean() == pytest.approx(1 / 40, rel=0.05)
    assert gaps.std() == pytest.approx(gaps.mean(), rel=0.1)  # exponential: std = mean
    assert all(a.phase == int(a.t // 50) for a in arrivals)


def test_schedule_sends_half_http_half_grpc_drawn_by_the_seed() -> None:
    arrivals = br.schedule(MODELS, rate=40, phase_s=50, seed=3)
    protocols = Counter(a.protocol for a in arrivals)
    assert set(protocols) == {"http", "grpc"}
    assert protocols["http"] / len(arrivals) == pytest.approx(0.5, abs=0.03)
    # not alternating: runs of one protocol occur
    assert any(a.protocol == b.protocol == c.protocol
               for a, b, c in zip(arrivals, arrivals[1:], arrivals[2:], strict=False))


def test_schedule_draws_models_by_each_phases_popularity() -> None:
    arrivals = br.schedule(MODELS, rate=200, phase_s=100, seed=5)
    for phase, p in enumerate(br.popularity(MODELS, seed=5)):
        counts = Counter(a.model for a in arrivals if a.phase == phase)
        n = sum(counts.values())
        order = sorted(p, key=lambda m: -p[m])
        assert counts[order[0]] / n == pytest.approx(p[order[0]], rel=0.1)
        top = sum(counts[m] for m in order[:10]) / n
        assert top == pytest.approx(sum(p[m] for m in order[:10]), abs=0.02)


# -- the best fixed placement ---------------------------------------------------------

def test_best_placement_packs_the_most_requested_per_byte_into_each_budget() -> None:
    p = {"a": 0.4, "b": 0.3, "c": 0.2, "d": 0.1}
    even = dict.fromkeys(p, 10)
    assert br.best_placement(p, even, budget=20) == set(p)  # room for all
    assert br.best_placement(p, even, budget=10) == {"a", "b"}  # one on each member
    assert br.best_placement(p, even, budget=10, members=1) == {"a"}
    assert br.best_placement(p, dict.fromkeys(p, 11), budget=10) == set()  # none fits
    # per byte: two small ones beat one large one more popular
    sizes = {"a": 20, "b": 10, "c": 10, "d": 10}
    assert br.best_placement(p, sizes, budget=20, members=1) == {"b", "c"}
    assert br.best_placement(p, sizes, budget=None) == set(p)


def test_placements_and_ideal_share_follow_each_phases_popularity() -> None:
    names = [f"m{i}" for i in range(4)]
    even = dict.fromkeys(names, 10)
    best = br.placements(names, even, budget=10, seed=0)
    pops = br.popularity(names, seed=0)
    assert len(best) == len(br.PHASES)
    for held, p in zip(best, pops, strict=True):
        assert held == set(sorted(p, key=lambda m: -p[m])[:2])
    shares = br.ideal_hit_share(names, even, budget=10, seed=0)
    assert shares[0] == pytest.approx(br.zipf_weights(4, 0.9)[:2].sum())
    assert shares[2] == pytest.approx(br.zipf_weights(4, 1.3)[:2].sum())
    assert br.ideal_hit_share(names, even, budget=None, seed=0) == pytest.approx([1.0] * 4)


# -- outcomes -------------------------------------------------------------------------

@pytest.mark.parametrize(("code", "message", "cause"), [
    ("503", "model 'm1' is being loaded, and the waiting room of pool 'cpu' is full (64 "
            "requests wait for models being loaded): retry shortly", "room_full"),
    ("UNAVAILABLE", "model 'm1' is resident nowhere and no member of pool 'cpu' has room "
                    "for it now (their budgets hold models loaded within the last 5 s, "
                    "or loading): retry", "no_room"),
    ("503", "model 'm1' needs 9 bytes, more than any member of pool 'cpu' may hold (5 "
            "bytes)", "no_room"),
    ("503", "model 'm1' is being loaded on member 127.0.0.1:8001 (2.1 s so far), longer "
            "than this request may wait (2.0 s): retry", "load_too_long"),
    ("UNAVAILABLE", "model 'm1' is being loaded on member x (9.9 s so far), longer than "
                    "this request may wait (10.0 s): retry", "load_too_long"),
    ("DEADLINE_EXCEEDED", "Deadline Exceeded", "deadline"),
    ("504", "deadline exceeded", "deadline"),
    ("timeout", "no answer within 15000 ms", "deadline"),
    ("404", "Request for unknown model: 'm1' is not found", "not_found"),
    ("NOT_FOUND", "Request for unknown model: 'm1' is not found", "not_found"),
    ("500", "boom", "other"),
    ("error", "ClientConnectorError: refused", "other"),
])
def test_cause_of_names_each_failure_by_its_status_and_the_gateways_words(
        code: str, message: str, cause: str) -> None:
    assert br.cause_of(code, message) == cause


def test_cause_of_an_answer_is_none_unless_another_models() -> None:
    assert br.cause_of("200", "") is None
    assert br.cause_of("OK", "") is None
    assert br.cause_of("200", "", right=False) == "wrong_model"
    assert br.cause_of("OK", "", right=False) == "wrong_model"


def test_outcome_is_a_hit_miss_or_failed_by_its_answer_and_the_load_wait_mark() -> None:
    assert outcome(1, "hit").kind == "hit"
    assert outcome(1, "miss").kind == "miss"
    assert outcome(1, "failed").kind == "failed"
    assert br.Outcome(1, "m", 0, "grpc", "OK", 5.0, None, right=False).kind == "failed"
    assert br.Outcome(1, "m", 0, "grpc", "OK", 5.0, 0.0).kind == "miss"
    assert br.Outcome(1, "m", 0, "grpc", "UNAVAILABLE", 5.0, 300.0, "x").kind == "failed"


def test_load_wait_reads_the_mark_from_a_header_or_metadata() -> None:
    assert br.load_wait("1234") == 1234.0
    assert br.load_wait(b"12") == 12.0
    assert br.load_wait("soon") == 0.0
    assert br.load_wait(None) is None
    trailing = (("content-type", "x"), ("infergate-load-wait-ms", "880"))
    assert br.metadata_wait(trailing, None) == 880.0
    assert br.metadata_wait(None, (("infergate-load-wait-ms", "7"),)) == 7.0
    assert br.metadata_wait((("other", "1"),), None) is None


def test_figures_count_hits_failures_by_cause_and_p99_per_protocol() -> None:
    runs = ([outcome(i, "hit", latency_ms=float(i + 1)) for i in range(100)]
            + [outcome(i, "hit", latency_ms=500.0, protocol="grpc") for i in range(10)]
            + [outcome(100 + i, "miss", latency_ms=1000.0 + i) for i in range(10)]
            + [br.Outcome(120, "m00", 1, "grpc", "DEADLINE_EXCEEDED", 15000.0, None,
                          "Deadline Exceeded"), outcome(121, "failed", latency_ms=3.0)])
    assert br.hit_share(runs) == pytest.approx(110 / 122)
    assert br.failed_share(runs) == pytest.approx(2 / 122)
    assert br.hits_p99(runs, "http") == 99.0
    assert br.hits_p99(runs, "grpc") == 500.0
    assert br.hits_p99([], "http") is None and br.hit_share([]) is None
    assert br.causes(runs) == {"room_full": 1, "deadline": 1}
    assert list(br.causes([*runs, br.Outcome(1, "m", 0, "http", "404", 1, None)])) == [
        "room_full", "deadline", "not_found"]  # in CAUSES order
    assert br.held_then_failed(runs) == 1  # the deadline; the quick refusal was not held
    series = br.hit_series(runs, bin_s=50)
    assert series[0] == (25.0, 1.0) and series[2] == (125.0, 0.0)


def test_failed_after_load_counts_failures_that_carry_the_load_wait_mark() -> None:
    runs = [br.Outcome(1, "m", 0, "http", "404", 900.0, 850.0, "Request for unknown model"),
            br.Outcome(2, "m", 0, "grpc", "UNAVAILABLE", 5.0, None, "no room"),
            outcome(3, "miss")]
    assert br.failed_after_load(runs) == 1


def test_messages_keep_the_words_of_each_cause_most_frequent_first() -> None:
    runs = [br.Outcome(1, "m", 0, "http", "500", 1, None, "boom"),
            br.Outcome(2, "m", 0, "http", "500", 1, None, "boom"),
            br.Outcome(3, "m", 0, "grpc", "INTERNAL", 1, None, "bang"), outcome(4, "failed")]
    assert br.messages(runs) == {"500: boom": 2, "INTERNAL: bang": 1}
    assert list(br.messages(runs, "room_full")) == [f"503: {runs[-1].message}"]


def test_recovery_is_the_first_window_back_to_90_percent_of_the_best_placement() -> None:
    best = [frozenset({"m00"})] * 4
    # misses for 25 s after a reshuffle at 100 s, then hits only (one request a second)
    runs = [outcome(t, "hit" if t < 100 or t >= 125 else "miss", t // 100)
            for t in range(0, 300)]
    # 9 hits of 10 is 90 %: back at the window [24, 34) s after it, with one miss
    assert br.recovery_s(runs, best, 100.0, 200.0) == 34.0
    # every hit: once the window holds no miss, end - 10 >= 125
    assert br.recovery_s(runs, best, 100.0, 200.0, threshold=1.0) == 35.0
    assert br.recovery_s(runs, best, 100.0, 200.0, threshold=0.8) == 33.0
    assert br.recovery_s([outcome(t, "miss", 1) for t in range(100, 200)], best, 100.0,
                         200.0) is None
    assert br.recovery_s(runs, best, 100.0, 120.0) is None  # stopped before it recovered


def test_recovery_is_measured_against_what_the_best_placement_would_hit() -> None:
    # the best placement holds only m00: requests for m01 are misses for it too
    best = [frozenset({"m00"})] * 2
    runs = [outcome(t, "hit" if t % 2 else "miss", 1, model="m00" if t % 2 else "m01")
            for t in range(100, 200)]
    assert br.recovery_s(runs, best, 100.0, 200.0) == 10.0
    assert br.recovery_s(runs, [frozenset({"m00", "m01"})] * 2, 100.0, 200.0) is None


# -- answers checked ------------------------------------------------------------------

def test_right_answer_checks_the_name_and_the_output_against_the_weights() -> None:
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal(s).astype(np.float32) for s in ((4, 3), (3, 3), (3, 2))]
    x = rng.standard_normal((1, 4)).astype(np.float32)
    y = br.mlp_output(weights, x)
    assert y.shape == (1, 2)
    assert br.right_answer("m", "m", y.ravel(), y)
    assert not br.right_answer("m", "other", y.ravel(), y)
    assert not br.right_answer("m", "m", y.ravel() + 1, y)
    assert not br.right_answer("m", "m", None, y)
    assert br.right_answer("m", "m", None, None)  # no output known: the name only


def test_expected_outputs_run_the_models_weights(tmp_path: Path) -> None:
    (tmp_path / "a" / "1").mkdir(parents=True)
    rm.mlp_onnx(tmp_path / "a" / "1" / "model.onnx", 8, seed=1)
    x = br.input_of(rm.request_body())
    assert x.shape == (1, rm.INPUT_WIDTH)
    out = br.expected_outputs(tmp_path, ["a"], x)
    graph = onnx.load(str(tmp_path / "a" / "1" / "model.onnx")).graph
    w = [onnx.numpy_helper.to_array(i) for i in graph.initializer]
    assert out["a"].shape == (1, rm.OUTPUT_WIDTH)
    assert np.allclose(out["a"], br.mlp_output(w, x))


def test_grpc_request_carries_the_same_input_as_the_json_body() -> None:
    x = br.input_of(rm.request_body())
    request = br.grpc_request("m07", x)
    assert request.model_name == "m07"
    assert list(request.inputs[0].shape) == [1, rm.INPUT_WIDTH]
    assert request.inputs[0].datatype == "FP32"
    assert np.array_equal(np.frombuffer(request.raw_input_contents[0], np.float32), x[0])


def test_parse_knob_reads_the_value_as_yaml() -> None:
    assert br.parse_knob("min_resident_s=10") == ("min_resident_s", 10)
    assert br.parse_knob("waiting_room={max_requests: 128}") == (
        "waiting_room", {"max_requests": 128})
    with pytest.raises(Exception, match="NAME=VALUE"):
        br.parse_knob("min_resident_s")


# -- budgets, arms and members --------------------------------------------------------

def test_budget_of_and_first_fit_take_the_catalogue_in_order() -> None:
    footprints = {"a": 40, "b": 10, "c": 30, "d": 5, "e": 15}
    assert br.budget_of(footprints, 0.25) == 25  # ceil(100 / 4)
    assert br.budget_of(footprints, 0.5) == 50
    assert br.first_fit(list(footprints), footprints, 25) == ["b", "d"]
    assert br.first_fit(list(footprints), footprints, 60) == ["a", "b", "d"]
    assert br.first_fit(list(footprints), footprints, 1) == []


def test_arms_run_all_resident_first_then_each_kind_at_each_budget() -> None:
    arms = br.arms_of(["residency", "all"], ["half", "quarter"])
    assert [a.title for a in arms] == ["all resident", "residency, half",
                                       "residency, quarter"]
    assert [a.title for a in br.arms_of(["static", "residency"], ["half"])] == [
        "static, half", "residency, half"]
    assert br.DEFAULT_ARMS == ("all", "residency") and list(br.BUDGETS) == ["half", "quarter"]


def test_stub_model_reads_the_model_from_the_stubs_command_line() -> None:
    stub = ["/x/backends/python/triton_python_backend_stub", "/repo/m07_32mb/1/model.py",
            "triton_python_backend_shm_region_3", "1048576", "1048576", "4242", "/x/python",
            "54", "m07_32mb_0_0", "DEFAULT"]
    assert br.stub_model(stub) == "m07_32mb"
    assert br.stub_model(["/x/bin/tritonserver", "--model-repository=/repo"]) is None
    assert br.stub_model([]) is None


def test_counters_sum_loads_and_evictions_over_their_labels() -> None:
    text = "\n".join([
        "# TYPE infergate_model_loads counter",
        'infergate_model_loads_total{model="a",reason="miss"} 3',
        'infergate_model_loads_total{model="b",reason="plan"} 2',
        "# TYPE infergate_model_evictions counter",
        'infergate_model_evictions_total{model="a",reason="room"} 1', ""])
    assert br.counters(text) == {"loads": 5.0, "evictions": 1.0}
    assert br.counters("") == {"loads": 0.0, "evictions": 0.0}


def test_model_sizes_aim_at_their_weights_and_names_carry_the_size() -> None:
    names = rm.model_names()
    assert len(names) == 36 and len({n for n, _ in names}) == 36
    assert {size.label for _, size in names} == {"1MB", "32MB", "100MB"}
    assert names[0][0] == "m00_1mb" and names[-1][0] == "m35_100mb"
    assert rm.catalogue_name() == "14x1mb-12x32mb-10x100mb"
    assert br.MODELS.name == "models-14x1mb-12x32mb-10x100mb"
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


def test_member_view_finds_the_member_by_its_grpc_or_http_address() -> None:
    member = TritonEndpoints("127.0.0.1", 8000, 8001, 8002)
    view = [{"key": "127.0.0.1:9001", "used_bytes": 1},
            {"key": "127.0.0.1:8001", "used_bytes": 2}]
    assert br.member_view(view, member) == view[1]
    assert br.member_view([{"key": "cpu/127.0.0.1:8000", "used_bytes": 3}], member) == {
        "key": "cpu/127.0.0.1:8000", "used_bytes": 3}
    assert br.member_view(view[:1], member) is None


# -- the figures and the report -------------------------------------------------------

def setup_of(phase_s: float = 100.0) -> br.Setup:
    models = [rm.BenchModel(m, "1MB", 10, 10) for m in ("m00", "m01", "m02", "m03")]
    return br.Setup(models, Path("/nowhere"), 1.0, phase_s, 0, 15_000, {"min_resident_s": 5})


def test_summarise_gives_each_phase_its_figures_and_moves_per_minute() -> None:
    setup = setup_of()
    names = setup.names
    footprints = dict.fromkeys(names, 10)
    best = br.placements(names, footprints, 10, seed=0)
    runs = [outcome(t + 0.5, "hit", t // 100, model=sorted(best[t // 100])[0])
            for t in range(400)]
    runs[150] = br.Outcome(150.5, runs[150].model, 1, "grpc", "UNAVAILABLE", 2000.0, None,
                           "no member of pool 'cpu' has room for it now")
    moves = [{"loads": 10 * k, "evictions": 5 * k} for k in range(5)]
    run = br.ArmRun(runs, [{"t": 1, "member": 0, "stubs_uss": 9, "rss_above_idle": 20,
                            "used_bytes": 8, "models": 1}], moves, {})
    row = br.summarise(br.Arm("residency", "quarter"), run, setup, 10, footprints)
    assert [p["phase"] for p in row["phases"]] == [p.label for p in br.PHASES]
    one = row["phases"][1]
    assert one["requests"] == 100 and one["hit_share"] == 0.99
    assert one["best_fixed_share"] == 1.0
    assert one["causes"] == {"no_room": 1} and one["held_then_failed"] == 1
    assert one["loads_per_min"] == pytest.approx(6.0)  # 10 loads in 100 s
    assert one["evictions_per_min"] == pytest.approx(3.0)
    assert row["failed_share"] == {"flat": 1 / 200, "steep": 0.0}
    assert row["max_used_bytes"] == 8 and row["max_stubs_uss"] == 9
    assert [r["at_s"] for r in row["recovery"]] == [100.0, 300.0]
    assert [r["span_s"] for r in row["recovery"]] == [200.0, 100.0]
    assert [r["s"] for r in row["recovery"]] == [10.0, 10.0]
    # no moves measured at every mark: none said
    run.moves = moves[:2]
    assert br.summarise(br.Arm("residency", "quarter"), run, setup, 10,
                        footprints)["phases"][0]["loads_per_min"] is None


def phase(label: str, **figures: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "phase": label, "requests": 1000, "hit_share": 0.95, "best_fixed_share": 0.96,
        "failed": 0, "causes": {}, "held_then_failed": 0,
        "hits_p99_ms": {"http": 10.0, "grpc": 12.0}, "loads_per_min": 6.0,
        "evictions_per_min": 4.0}
    base.update(figures)
    return base


def row(arm: str, kind: str = "residency", budget: str | None = "half",
        **figures: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "arm": arm, "kind": kind, "budget": budget,
        "budget_bytes": 500_000_000 if budget else None, "models": 36,
        "footprints_bytes": 2_000_000_000, "requests": 4000, "offered_rps": 30.0,
        "phase_s": 60.0, "deadline_ms": 15_000, "residency_knobs": {},
        "phases": [phase(p.label) for p in br.PHASES],
        "hits_p99_ms": {"http": 10.0, "grpc": 12.0}, "failed": 0, "causes": {},
        "failed_share": {"flat": 0.0, "steep": 0.0}, "held_then_failed": 0,
        "failed_after_load": 0, "load_waits": {"http": 10, "grpc": 9},
        "max_used_bytes": 400_000_000, "max_stubs_uss": 510_000_000,
        "max_rss_above_idle": 600_000_000,
        "recovery": [{"at_s": 60.0, "span_s": 120.0, "s": 20.0},
                     {"at_s": 180.0, "span_s": 60.0, "s": 30.0}],
        "other_messages": {}, "hit_series": [(2.5, 0.5), (7.5, 1.0)],
        "memory": [{"t": 1.0, "member": m, "stubs_uss": 1, "rss_above_idle": 2,
                    "used_bytes": 3, "models": 1} for m in (0, 1)]}
    base.update(figures)
    return base


def all_resident(**figures: Any) -> dict[str, Any]:
    return row("all resident", kind="all", budget=None, **figures)


def test_p99_ratios_are_against_the_all_resident_arm_per_protocol_and_phase() -> None:
    rows = [all_resident(), row("residency, half", hits_p99_ms={"http": 12.0, "grpc": 6.0})]
    rows[1]["phases"][2]["hits_p99_ms"] = {"http": 20.0, "grpc": None}
    br.add_p99_ratios(rows)
    assert rows[1]["hits_p99_x"] == {"http": 1.2, "grpc": 0.5}
    assert rows[1]["phases"][2]["hits_p99_x"] == {"http": 2.0, "grpc": None}
    assert rows[0]["hits_p99_x"] == {"http": 1.0, "grpc": 1.0}
    alone = [row("residency, half")]
    br.add_p99_ratios(alone)
    assert alone[0]["hits_p99_x"] == {"http": None, "grpc": None}


def goals_of(r: dict[str, Any]) -> dict[str, tuple[bool | None, str]]:
    br.add_p99_ratios([all_resident(), r])
    return {goal.split(" (")[0]: (met, fig) for goal, met, fig in br.arm_goals(r)}


def test_goals_are_met_by_a_run_within_every_bound() -> None:
    verdicts = goals_of(row("residency, half"))
    assert len(verdicts) == 9
    assert all(met for met, _ in verdicts.values()), verdicts


def test_goals_are_missed_by_their_figures() -> None:
    bad = row("residency, quarter", budget="quarter",
              causes={"not_found": 2}, failed_after_load=1, held_then_failed=3,
              failed_share={"flat": 0.005, "steep": 0.02},
              hits_p99_ms={"http": 12.5, "grpc": 12.0},
              max_used_bytes=500_000_001, max_stubs_uss=526_000_000,
              recovery=[{"at_s": 60.0, "span_s": 120.0, "s": 70.0},
                        {"at_s": 180.0, "span_s": 60.0, "s": 10.0}])
    bad["phases"][3] = phase("steep, reshuffled", hit_share=0.93, best_fixed_share=0.96)
    verdicts = goals_of(bad)
    assert [met for met, _ in verdicts.values()] == [False] * 9, verdicts
    assert verdicts["failed <= 1% with a 15 s deadline, flat and steep"][1] == (
        "flat 0.5 %, steep 2.0 %")
    assert "steep, reshuffled: 93.0 % vs 96.0 %" in verdicts[
        "hit ratio >= best fixed placement - 0.02 in every phase"][1]
    assert verdicts["hits' p99 <= 1.2x all-resident, HTTP and gRPC"][1] == (
        "HTTP 1.25x (12.5 ms), gRPC 1.00x (12.0 ms)")


def test_recovery_not_seen_within_a_span_shorter_than_the_goal_is_not_judged() -> None:
    short = [{"at_s": 30.0, "span_s": 60.0, "s": 20.0},
             {"at_s": 90.0, "span_s": 30.0, "s": None}]
    assert br._recovery_goal(row("r", recovery=short))[1] is None
    long = [{"at_s": 60.0, "span_s": 120.0, "s": None}, short[1]]
    assert br._recovery_goal(row("r", recovery=long))[1] is False
    assert br._recovery_goal(row("r", recovery=short[:1]))[1] is True


def test_markdown_gives_each_arm_and_phase_then_the_goals_judged() -> None:
    rows = [all_resident(), row("residency, half", failed=3,
                                causes={"room_full": 2, "deadline": 1})]
    rows[1]["phases"][0] = phase("flat", failed=3, causes={"room_full": 2, "deadline": 1})
    br.add_p99_ratios(rows)
    text = br.markdown(rows)
    assert ("| arm | phase | requests | hits / best fixed | failed (by cause) | hits p99 HTTP,"
            " ms (x all) | hits p99 gRPC, ms (x all) | loads / evictions per min |") in text
    assert ("| residency, half | flat | 1000 | 95.0 % / 96.0 % | 3 (0.3 %: room_full 2, "
            "deadline 1) | 10.0 (1.00x) | 12.0 (1.00x) | 6.0 / 4.0 |") in text
    assert "| all resident | none | 400 MB | 510 MB | 600 MB |" in text
    assert "| residency, half | 500 MB | 400 MB (0.80x) | 510 MB (1.02x) |" in text
    assert "at 60 s: 20 s, at 180 s: 30 s" in text
    assert "Goals (residency, half):" in text and "Goals (all resident)" not in text
    assert "- MET: 0 404 / NOT_FOUND for a registered model: 0" in text
    assert "budgets per member: half 500 MB" in text
    assert "half HTTP, half gRPC, 15 s deadline" in text


def test_notes_say_when_grpc_answers_never_carry_the_load_wait_mark() -> None:
    rows = [row("residency, half", load_waits={"http": 40, "grpc": 0})]
    assert any("no gRPC answer carried the load-wait mark" in n for n in br.notes(rows))
    assert not any("no gRPC" in n for n in br.notes([row("residency, half")]))


def test_plot_writes_one_png(tmp_path: Path) -> None:
    paths = br.plot([all_resident(), row("residency, half")], tmp_path)
    assert [p.name for p in paths] == ["bench_residency.png"]
    assert paths[0].stat().st_size > 10_000
