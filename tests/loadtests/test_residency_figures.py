"""The residency benchmark's figures (loadtests/residency_figures.py): failures by
cause, hit/miss, the figures (p99 per protocol, recovery after each reshuffle, held and
failed), the arms, the summary per phase, the tables and the goals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from loadtests import residency_figures as rf
from loadtests import residency_models as rm
from loadtests import residency_trace as rt

# -- outcomes -------------------------------------------------------------------------

def outcome(t: float, kind: str, phase: int = 0, latency_ms: float = 10.0,
            protocol: str = "http", model: str = "m00") -> rf.Outcome:
    code = "503" if kind == "failed" else "200"
    wait = 1500.0 if kind == "miss" else None
    message = "model 'm00' is being loaded, and the waiting room of pool 'cpu' is full" \
        if kind == "failed" else ""
    return rf.Outcome(t, model, phase, protocol, code, latency_ms, wait, message)


@pytest.mark.parametrize(("code", "message", "cause"), [
    ("503", "model 'm1' is being loaded, and the waiting room of pool 'cpu' is full (64 "
            "requests wait for models being loaded): retry shortly", "room_full"),
    ("UNAVAILABLE", "model 'm1' is resident nowhere and no member of pool 'cpu' has room "
                    "for it now (their budgets hold models loaded within the last 5 s, "
                    "or loading): retry", "no_room"),
    ("503", "model 'm1' needs 9 bytes, more than any member of pool 'cpu' may hold (5 "
            "bytes)", "no_room"),
    ("503", "model 'm1' is being loaded on member 127.0.0.1:8001 (loading, 2.1 s so far), "
            "longer than this request may wait (2.0 s): retry", "load_too_long"),
    ("UNAVAILABLE", "model 'm1' is being loaded on member x (queued behind 2 loads there, "
                    "9.9 s so far), longer than this request may wait (10.0 s): retry",
     "load_too_long"),
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
    assert rf.cause_of(code, message) == cause


def test_cause_of_an_answer_is_none_unless_another_models() -> None:
    assert rf.cause_of("200", "") is None
    assert rf.cause_of("OK", "") is None
    assert rf.cause_of("200", "", right=False) == "wrong_model"
    assert rf.cause_of("OK", "", right=False) == "wrong_model"


def test_outcome_is_a_hit_miss_or_failed_by_its_answer_and_the_load_wait_mark() -> None:
    assert outcome(1, "hit").kind == "hit"
    assert outcome(1, "miss").kind == "miss"
    assert outcome(1, "failed").kind == "failed"
    assert rf.Outcome(1, "m", 0, "grpc", "OK", 5.0, None, right=False).kind == "failed"
    assert rf.Outcome(1, "m", 0, "grpc", "OK", 5.0, 0.0).kind == "miss"
    assert rf.Outcome(1, "m", 0, "grpc", "UNAVAILABLE", 5.0, 300.0, "x").kind == "failed"


def test_load_wait_reads_the_mark_from_a_header_value() -> None:
    assert rf.load_wait("1234") == 1234.0
    assert rf.load_wait(b"12") == 12.0
    assert rf.load_wait("soon") == 0.0
    assert rf.load_wait(None) is None


def test_figures_count_hits_failures_by_cause_and_p99_per_protocol() -> None:
    runs = ([outcome(i, "hit", latency_ms=float(i + 1)) for i in range(100)]
            + [outcome(i, "hit", latency_ms=500.0, protocol="grpc") for i in range(10)]
            + [outcome(100 + i, "miss", latency_ms=1000.0 + i) for i in range(10)]
            + [rf.Outcome(120, "m00", 1, "grpc", "DEADLINE_EXCEEDED", 15000.0, None,
                          "Deadline Exceeded"), outcome(121, "failed", latency_ms=3.0)])
    assert rf.hit_share(runs) == pytest.approx(110 / 122)
    assert rf.failed_share(runs) == pytest.approx(2 / 122)
    assert rf.hits_p99(runs, "http") == 99.0
    assert rf.hits_p99(runs, "grpc") == 500.0
    assert rf.hits_p99([], "http") is None and rf.hit_share([]) is None
    assert rf.causes(runs) == {"room_full": 1, "deadline": 1}
    assert list(rf.causes([*runs, rf.Outcome(1, "m", 0, "http", "404", 1, None)])) == [
        "room_full", "deadline", "not_found"]  # in CAUSES order
    assert rf.held_then_failed(runs) == 1  # the deadline; the quick refusal was not held
    series = rf.hit_series(runs, bin_s=50)
    assert series[0] == (25.0, 1.0) and series[2] == (125.0, 0.0)


def test_failed_after_load_counts_failures_that_carry_the_load_wait_mark() -> None:
    runs = [rf.Outcome(1, "m", 0, "http", "404", 900.0, 850.0, "Request for unknown model"),
            rf.Outcome(2, "m", 0, "grpc", "UNAVAILABLE", 5.0, None, "no room"),
            outcome(3, "miss")]
    assert rf.failed_after_load(runs) == 1


def test_messages_keep_the_words_of_each_cause_most_frequent_first() -> None:
    runs = [rf.Outcome(1, "m", 0, "http", "500", 1, None, "boom"),
            rf.Outcome(2, "m", 0, "http", "500", 1, None, "boom"),
            rf.Outcome(3, "m", 0, "grpc", "INTERNAL", 1, None, "bang"), outcome(4, "failed")]
    assert rf.messages(runs) == {"500: boom": 2, "INTERNAL: bang": 1}
    assert list(rf.messages(runs, "room_full")) == [f"503: {runs[-1].message}"]


def test_recovery_is_the_first_window_back_to_90_percent_of_the_best_placement() -> None:
    best = [frozenset({"m00"})] * 4
    # misses for 25 s after a reshuffle at 100 s, then hits only (one request a second)
    runs = [outcome(t, "hit" if t < 100 or t >= 125 else "miss", t // 100)
            for t in range(0, 300)]
    # 9 hits of 10 is 90 %: back at the window [24, 34) s after it, with one miss
    assert rf.recovery_s(runs, best, 100.0, 200.0) == 34.0
    # every hit: once the window holds no miss, end - 10 >= 125
    assert rf.recovery_s(runs, best, 100.0, 200.0, threshold=1.0) == 35.0
    assert rf.recovery_s(runs, best, 100.0, 200.0, threshold=0.8) == 33.0
    assert rf.recovery_s([outcome(t, "miss", 1) for t in range(100, 200)], best, 100.0,
                         200.0) is None
    assert rf.recovery_s(runs, best, 100.0, 120.0) is None  # stopped before it recovered


def test_recovery_is_measured_against_what_the_best_placement_would_hit() -> None:
    # the best placement holds only m00: requests for m01 are misses for it too
    best = [frozenset({"m00"})] * 2
    runs = [outcome(t, "hit" if t % 2 else "miss", 1, model="m00" if t % 2 else "m01")
            for t in range(100, 200)]
    assert rf.recovery_s(runs, best, 100.0, 200.0) == 10.0
    assert rf.recovery_s(runs, [frozenset({"m00", "m01"})] * 2, 100.0, 200.0) is None


# -- arms -----------------------------------------------------------------------------

def test_arms_run_all_resident_first_then_each_kind_at_each_budget() -> None:
    arms = rf.arms_of(["residency", "all"], ["half", "quarter"])
    assert [a.title for a in arms] == ["all resident", "residency, half",
                                       "residency, quarter"]
    assert [a.title for a in rf.arms_of(["static", "residency"], ["half"])] == [
        "static, half", "residency, half"]
    other = Path("/elsewhere")
    assert [a.title for a in rf.arms_of(["residency"], ["half"], other)] == [
        "residency (before), half", "residency, half"]
    assert [a.title for a in rf.arms_of(["residency"], ["half"], other, source_last=True)] == [
        "residency, half", "residency (before), half"]


# -- the figures and the report -------------------------------------------------------

def setup_of(phase_s: float = 100.0) -> rf.Setup:
    models = [rm.BenchModel(m, "1MB", 10, 10) for m in ("m00", "m01", "m02", "m03")]
    return rf.Setup(models, Path("/nowhere"), 1.0, phase_s, 0, 15_000, {"min_resident_s": 5})


def test_summarise_gives_each_phase_its_figures_and_moves_per_minute() -> None:
    setup = setup_of()
    names = setup.names
    footprints = dict.fromkeys(names, 10)
    best = rt.placements(names, footprints, 10, seed=0)
    runs = [outcome(t + 0.5, "hit", t // 100, model=sorted(best[t // 100])[0])
            for t in range(400)]
    runs[150] = rf.Outcome(150.5, runs[150].model, 1, "grpc", "UNAVAILABLE", 2000.0, None,
                           "no member of pool 'cpu' has room for it now")
    moves = [{"loads": 10 * k, "evictions": 5 * k} for k in range(5)]
    run = rf.ArmRun(runs, [{"t": 1, "member": 0, "stubs_uss": 9, "stubs_anon": 7,
                            "rss_above_idle": 20, "used_bytes": 8, "models": 1}], moves, {})
    row = rf.summarise(rf.Arm("residency", "quarter"), run, setup, 10, footprints)
    assert [p["phase"] for p in row["phases"]] == [p.label for p in rt.PHASES]
    one = row["phases"][1]
    assert one["requests"] == 100 and one["hit_share"] == 0.99
    assert one["best_fixed_share"] == 1.0
    # a room of 10 kept for the models the best fixed placement leaves out
    serving = rt.placements(names, footprints, 10, seed=0,
                             placer=rt.serving_placement)[1]
    assert one["serving_share"] == sum(o.model in serving for o in runs[100:200]) / 100
    assert one["causes"] == {"no_room": 1} and one["held_then_failed"] == 1
    assert one["loads_per_min"] == pytest.approx(6.0)  # 10 loads in 100 s
    assert one["evictions_per_min"] == pytest.approx(3.0)
    assert row["failed_share"] == {"flat": 1 / 200, "steep": 0.0}
    assert row["max_used_bytes"] == 8 and row["max_stubs_uss"] == 9
    assert row["max_stubs_anon"] == 7
    assert [r["at_s"] for r in row["recovery"]] == [100.0, 300.0]
    assert [r["span_s"] for r in row["recovery"]] == [200.0, 100.0]
    assert [r["s"] for r in row["recovery"]] == [10.0, 10.0]
    # no moves measured at every mark: none said
    run.moves = moves[:2]
    assert rf.summarise(rf.Arm("residency", "quarter"), run, setup, 10,
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
        "phases": [phase(p.label) for p in rt.PHASES],
        "hits_p99_ms": {"http": 10.0, "grpc": 12.0}, "failed": 0, "causes": {},
        "failed_share": {"flat": 0.0, "steep": 0.0}, "held_then_failed": 0,
        "failed_after_load": 0, "load_waits": {"http": 10, "grpc": 9},
        "max_used_bytes": 400_000_000, "max_stubs_uss": 510_000_000,
        "max_stubs_anon": 480_000_000, "max_rss_above_idle": 600_000_000,
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
    rf.add_p99_ratios(rows)
    assert rows[1]["hits_p99_x"] == {"http": 1.2, "grpc": 0.5}
    assert rows[1]["phases"][2]["hits_p99_x"] == {"http": 2.0, "grpc": None}
    assert rows[0]["hits_p99_x"] == {"http": 1.0, "grpc": 1.0}
    alone = [row("residency, half")]
    rf.add_p99_ratios(alone)
    assert alone[0]["hits_p99_x"] == {"http": None, "grpc": None}


def goals_of(r: dict[str, Any]) -> dict[str, tuple[bool | None, str]]:
    rf.add_p99_ratios([all_resident(), r])
    return {goal.split(" (")[0]: (met, fig) for goal, met, fig in rf.arm_goals(r)}


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
    assert "keeping one member a room" not in verdicts[
        "hit ratio >= best fixed placement - 0.02 in every phase"][1]
    bad["phases"] = [phase(ph["phase"], serving_share=0.9) for ph in bad["phases"]]
    assert verdicts != goals_of(bad)
    assert ("(the best fixed placement keeping one member a room for the models it leaves "
            "out: flat: 90.0 %; flat, reshuffled: 90.0 %") in goals_of(bad)[
        "hit ratio >= best fixed placement - 0.02 in every phase"][1]
    assert "| 95.0 % / 96.0 % (90.0 %) |" in rf.phase_table([bad])
    assert verdicts["hits' p99 <= 1.2x all-resident, HTTP and gRPC"][1] == (
        "HTTP 1.25x (12.5 ms), gRPC 1.00x (12.0 ms)")
    # the anonymous part of the USS said beside it: what the kernel cannot drop
    assert verdicts["real memory"][1] == (
        "peak 526 MB (1.05x) (anonymous 480 MB (0.96x); tree RSS above idle 600 MB)")
    assert "| 526 MB (1.05x) | 480 MB (0.96x) | 600 MB |" in rf.arm_table([bad])


def test_recovery_not_seen_within_a_span_shorter_than_the_goal_is_not_judged() -> None:
    short = [{"at_s": 30.0, "span_s": 60.0, "s": 20.0},
             {"at_s": 90.0, "span_s": 30.0, "s": None}]
    assert rf._recovery_goal(row("r", recovery=short))[1] is None
    long = [{"at_s": 60.0, "span_s": 120.0, "s": None}, short[1]]
    assert rf._recovery_goal(row("r", recovery=long))[1] is False
    assert rf._recovery_goal(row("r", recovery=short[:1]))[1] is True


def test_markdown_gives_each_arm_and_phase_then_the_goals_judged() -> None:
    rows = [all_resident(), row("residency, half", failed=3,
                                causes={"room_full": 2, "deadline": 1})]
    rows[1]["phases"][0] = phase("flat", failed=3, causes={"room_full": 2, "deadline": 1})
    rf.add_p99_ratios(rows)
    text = rf.markdown(rows)
    assert ("| arm | phase | requests | hits / best fixed (keeping a room for the rest) | "
            "failed (by cause) | hits p99 HTTP, ms (x all) | hits p99 gRPC, ms (x all) | "
            "loads / evictions per min |") in text
    assert ("| residency, half | flat | 1000 | 95.0 % / 96.0 % | 3 (0.3 %: room_full 2, "
            "deadline 1) | 10.0 (1.00x) | 12.0 (1.00x) | 6.0 / 4.0 |") in text
    assert "| all resident | none | 400 MB | 510 MB | 480 MB | 600 MB |" in text
    assert "| residency, half | 500 MB | 400 MB (0.80x) | 510 MB (1.02x) |" in text
    assert "at 60 s: 20 s, at 180 s: 30 s" in text
    assert "Goals (residency, half):" in text and "Goals (all resident)" not in text
    assert "- MET: 0 404 / NOT_FOUND for a registered model: 0" in text
    assert "budgets per member: half 500 MB" in text
    assert "half HTTP, half gRPC, 15 s deadline" in text
    assert "stubs start" not in text  # at their server's priority: nothing said
    rows[0]["stub_nice"] = 10
    assert "; stubs start 10 below their member's server (nice), where it may bring " \
        "them back." in rf.markdown(rows)


def test_notes_say_how_long_each_residency_arm_settled_before_its_traffic() -> None:
    rows = [all_resident(), row("residency, half", settled={"s": 7.8, "models": 33}),
            row("residency, quarter", budget="quarter", settled={"s": 4.5, "models": 21})]
    [note] = [n for n in rf.notes(rows) if "settled" in n]
    assert "residency, half 7.8 s (33 models held); residency, quarter 4.5 s (21 " \
        "models held)" in note
    assert not any("settled" in n for n in rf.notes([all_resident()]))


def test_notes_say_when_grpc_answers_never_carry_the_load_wait_mark() -> None:
    rows = [row("residency, half", load_waits={"http": 40, "grpc": 0})]
    assert any("no gRPC answer carried the load-wait mark" in n for n in rf.notes(rows))
    assert not any("no gRPC" in n for n in rf.notes([row("residency, half")]))


def test_plot_writes_one_png(tmp_path: Path) -> None:
    paths = rf.plot([all_resident(), row("residency, half")], tmp_path)
    assert [p.name for p in paths] == ["bench_residency.png"]
    assert paths[0].stat().st_size > 10_000


def test_arm_table_gives_each_parts_cpu_in_cores_or_says_it_was_not_measured() -> None:
    measured = row("residency, quarter", cpu_cores={
        "members": 0.82, "control_plane": 0.41, "replica": 0.13, "haproxy": 0.03,
        "load_generator": 0.131})
    table = rf.arm_table([all_resident(), measured])
    assert ("CPU, cores: members / control plane / replica / HAProxy / load generator |"
            in table)
    assert "| 0.82 / 0.41 / 0.13 / 0.03 / 0.13 |" in table
    assert table.splitlines()[2].endswith("| n/a |")  # the all-resident row: none given
    assert rf.cpu_cell({"members": 1.0}) == "1.00 / n/a / n/a / n/a / n/a"

