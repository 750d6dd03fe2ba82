"""The rollout benchmark's own arithmetic: step starts from the verdicts, the
candidate's share over time, each scenario's row, the detour's paired ratios, the
gateway's counts, the table and the plot (no servers)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from loadtests import bench_rollout as br

T0 = 1_000_000.0  # a wall-clock origin for synthetic timelines


def decision(step: int, percent: int, at: float, seconds: float, verdict: str = "promote",
             **extra: Any) -> dict[str, Any]:
    return {"at": T0 + at, "decision": verdict, "reason": f"{verdict} at {step}",
            "step": step, "percent": percent, "seconds": seconds, **extra}


def job(state: str, decisions: list[dict[str, Any]], rollout_state: str,
        started_at: float = -4.0) -> dict[str, Any]:
    return {"state": state, "rollout": {
        "model": "roll_x", "stable": 1, "candidate": 2, "state": rollout_state,
        "started_at": T0 + started_at, "spec": {"steps": [10, 50, 100]},
        "decisions": decisions}}


# -- step starts ------------------------------------------------------------------------

def test_step_starts_are_each_steps_first_verdict_minus_its_seconds() -> None:
    decisions = [decision(1, 10, 5.0, 5.0), decision(2, 50, 10.2, 5.1),
                 decision(3, 100, 15.3, 5.0)]
    starts = br.step_starts(decisions)
    assert [p for _, p in starts] == [10, 50, 100]
    assert [round(t - T0, 6) for t, _ in starts] == [0.0, 5.1, 10.3]


def test_step_starts_keep_the_first_window_of_a_held_step_and_skip_aborts() -> None:
    decisions = [decision(1, 10, 5.0, 5.0, "hold"), decision(1, 10, 10.0, 5.0),
                 {"at": T0 + 11.0, "decision": "abort", "reason": "aborted by admin"}]
    assert br.step_starts(decisions) == [(T0, 10)]
    assert br.step_starts([]) == []


# -- share over time ----------------------------------------------------------------------

def test_share_bins_count_successes_candidate_answers_and_failures_per_second() -> None:
    answers: list[br.Answer] = [
        (T0 + 0.1, True, 1), (T0 + 0.5, True, 2), (T0 + 0.9, False, None),
        (T0 + 1.0, True, 2), (T0 + 1.99, True, 2),
        (T0 + 3.5, True, 1),
    ]
    bins = br.share_bins(answers, candidate=2, origin=T0, start=0.0, end=4.0)
    assert [b.start for b in bins] == [0.0, 1.0, 2.0, 3.0]
    assert [(b.answers, b.candidate, b.failures) for b in bins] == [
        (2, 1, 1), (2, 2, 0), (0, 0, 0), (1, 0, 0)]
    assert [b.share for b in bins] == [0.5, 1.0, None, 0.0]  # no answer: no share


def test_share_bins_include_the_start_exclude_the_end_and_allow_a_partial_last_bin() -> None:
    answers: list[br.Answer] = [(T0 - 2.0, True, 2), (T0 - 0.5, True, 2), (T0 + 1.2, True, 1),
                                (T0 + 1.5, True, 2)]
    bins = br.share_bins(answers, 2, T0, start=-2.0, end=1.5)
    assert [b.start for b in bins] == [-2.0, -1.0, 0.0, 1.0]  # the last covers 1.0..1.5
    assert [b.answers for b in bins] == [1, 1, 0, 1]  # 1.5 is past the end
    assert br.share_bins(answers, 2, T0, start=0.0, end=0.0) == []


def test_longest_gap_is_the_longest_wait_between_consecutive_answers() -> None:
    answers: list[br.Answer] = [(T0 + 0.3, True, 1), (T0, True, 1), (T0 + 1.5, False, None),
                                (T0 + 1.6, True, 2)]
    assert br.longest_gap(answers) == (pytest.approx(1.2), T0 + 0.3)
    gap, when = br.longest_gap(answers[:1])
    assert gap == 0.0 and math.isnan(when)


# -- a scenario's row ---------------------------------------------------------------------

def test_scenario_row_of_a_promotion_has_wall_time_planned_time_and_the_timeline() -> None:
    decisions = [decision(1, 10, 5.0, 5.0), decision(2, 50, 10.0, 5.0),
                 decision(3, 100, 16.0, 6.0, agreement=1.0)]
    answers: list[br.Answer] = [(T0 + t / 10, True, 2 if t % 4 == 0 else 1)
                                for t in range(-20, 190)]
    row = br.scenario_row("good", job("succeeded", decisions, "promoted"), answers, 5.0)
    assert row["outcome"] == "promoted" and row["decision"] == "promote"
    assert (row["ended_step"], row["ended_percent"]) == (3, 100)
    assert row["wall_s"] == 16.0 and row["planned_s"] == 15.0
    assert row["with_loading_s"] == 20.0  # from the rollout's start, loading included
    assert row["requests"] == 210 and row["failures"] == 0
    assert row["candidate_answers"] == sum(1 for _, _, v in answers if v == 2)
    assert row["agreement"] == 1.0 and "expected_failures" not in row
    assert row["longest_gap_s"] == pytest.approx(0.1) and row["longest_gap_at_s"] <= 18.8
    timeline = row["timeline"]
    assert timeline["schedule"] == [[0.0, 10], [5.0, 50], [10.0, 100]]
    assert timeline["end"] == 16.0 and timeline["final_percent"] == 100
    assert timeline["t"][0] == -br.LEAD_S and len(timeline["t"]) == 16 + br.LEAD_S + br.TAIL_S
    assert timeline["share"][timeline["t"].index(0.0)] == pytest.approx(0.3)  # 3 of 10
    assert len(timeline["share"]) == len(timeline["failures_per_s"]) == len(timeline["t"])


def test_scenario_row_of_the_erroring_rollback_compares_failures_with_the_expectation() -> None:
    rollback = decision(1, 10, 2.0, 2.0, "rollback",
                        candidate={"requests": 30, "errors": 6, "error_rate": 0.2})
    # 500 answers over step 1 (0..2 s), 4 failures; one more failure after the verdict
    answers: list[br.Answer] = [(T0 + i * 0.004, i % 125 != 0, 1) for i in range(500)]
    answers.append((T0 + 2.5, False, None))
    row = br.scenario_row("erroring", job("failed", [rollback], "rolled_back"), answers, 5.0)
    assert row["outcome"] == "rolled back" and row["ended_step"] == 1
    assert row["step1_requests"] == 500
    assert row["expected_failures"] == pytest.approx(0.1 * 0.2 * 500)  # 10 %, 20 %: 10
    assert row["failure_bound"] == pytest.approx(round(10 + 3 * math.sqrt(10) + 2, 1))
    assert row["failures"] == 5 and row["failures_after_verdict"] == 1
    assert row["timeline"]["final_percent"] == 0 and row["timeline"]["end"] == 2.0
    errors = str(br.scenario_cells(row)[-1])  # failures vs expected
    assert "5 vs ~10 expected" in errors and "1 after the verdict" in errors


# -- the detour ---------------------------------------------------------------------------

def run(r: int, protocol: str, rollout: bool, per_s: float, p50: float,
        failed: int = 0) -> br.DetourRun:
    return br.DetourRun(r, protocol, rollout, 2.0, round(per_s * 2), failed, p50)


def test_detour_rows_give_medians_and_the_median_of_per_round_ratios() -> None:
    runs = [run(0, "grpc", False, 1000, 4.0), run(0, "grpc", True, 500, 8.0, failed=3),
            run(1, "grpc", False, 800, 5.0), run(1, "grpc", True, 600, 6.0),
            run(2, "grpc", False, 900, 4.0), run(2, "grpc", True, 450, 6.0),
            run(0, "http", False, 2000, 1.0), run(0, "http", True, 1900, 1.1)]
    grpc, http = br.detour_rows(runs, 4, {"grpc": 0.5})
    assert grpc["protocol"] == "grpc" and grpc["rounds"] == 3 and grpc["in_flight"] == 4
    assert (grpc["plain_per_s"], grpc["rollout_per_s"]) == (900, 500)
    assert grpc["throughput_ratio"] == pytest.approx(0.5)  # of 0.5, 0.75, 0.5
    assert grpc["throughput_ratio_range"] == [0.5, 0.75]
    assert grpc["p50_latency_ratio"] == pytest.approx(1.5)  # of 2.0, 1.2, 1.5
    assert (grpc["plain_failed"], grpc["rollout_failed"]) == (0, 3)
    assert grpc["candidate_share_seen"] == 0.5 and http["candidate_share_seen"] is None
    assert http["throughput_ratio"] == pytest.approx(0.95)
    assert http["throughput_ratio_range"] is None  # one round: no range


def test_detour_run_throughput_is_successes_per_second() -> None:
    assert br.DetourRun(0, "http", False, 2.0, 300, 0, 1.0).per_s == 150
    assert math.isnan(br.DetourRun(0, "http", False, 0.0, 300, 0, 1.0).per_s)


def test_gateway_outcomes_sum_user_traffic_of_one_model_and_protocol() -> None:
    text = "\n".join([
        "# HELP infergate_requests_total Inference requests.",
        "# TYPE infergate_requests_total counter",
        *(f'infergate_requests_total{{model="{m}",pool="p",protocol="{p}",outcome="{o}",'
          f'traffic="{t}"}} {v}'
          for m, p, o, t, v in (("a", "grpc", "success", "user", 10.0),
                                ("a", "grpc", "upstream_error", "user", 2.0),
                                ("a", "grpc", "success", "rollout", 5.0),
                                ("a", "http", "success", "user", 7.0),
                                ("b", "grpc", "success", "user", 9.0))),
    ]) + "\n"
    assert br.gateway_outcomes(text, "a", "grpc") == {"success": 10.0, "upstream_error": 2.0}
    assert br.gateway_outcomes(text, "c", "grpc") == {}


# -- table and plot -----------------------------------------------------------------------

def rows() -> list[dict[str, Any]]:
    promoted = br.scenario_row(
        "good", job("succeeded", [decision(1, 10, 3.0, 3.0), decision(2, 50, 6.0, 3.0),
                                  decision(3, 100, 9.0, 3.0)], "promoted"),
        [(T0 + t / 10, True, 1 + (t % 2)) for t in range(-20, 110)], 3.0)
    rolled = br.scenario_row(
        "erroring", job("failed", [decision(1, 10, 1.0, 1.0, "rollback")], "rolled_back"),
        [(T0 + t / 10, t % 7 != 0, 1) for t in range(-20, 40)], 3.0)
    detour = br.detour_rows([run(0, "grpc", False, 1000, 4.0), run(0, "grpc", True, 700, 6.0)],
                            4, {"grpc": 0.5})
    return [promoted, rolled, *detour]


def test_markdown_has_a_line_per_scenario_and_per_protocol_with_ratios() -> None:
    table = br.markdown(rows())
    lines = table.splitlines()
    assert any(ln.startswith("| good | none | promoted |") and "| 3 (100%) | 9.0 / 9 |" in ln
               for ln in lines)
    assert any(ln.startswith("| erroring | none | rolled back |") and "expected" in ln
               for ln in lines)
    assert any(ln.startswith("| grpc | 4 | 1000 | 700 | 0.70x |") and "1.50x" in ln
               and "50%" in ln for ln in lines)
    assert br.markdown([]) == "(nothing measured)"


def test_guarded_row_says_what_judged_it_and_both_agreements() -> None:
    """A candidate rolled back in the shadow step: no step began (the rollout's start is
    the origin), the gate's agreement on the replayed samples beside the shadow step's
    on live requests, no answer by the candidate."""
    decisions = [
        {"at": T0 + 1.0, "decision": "promote", "reason": "fine", "step": "gate",
         "stage": "gate", "percent": 0, "seconds": 0.5, "agreement": 1.0, "samples": 32},
        {"at": T0 + 4.0, "decision": "rollback", "reason": "agreement 0.75", "step": "shadow",
         "stage": "shadow", "percent": 0, "seconds": 3.0, "agreement": 0.75,
         "candidate": {"requests": 40}, "skipped": 0},
    ]
    row = br.scenario_row("diverging", job("failed", decisions, "rolled_back"),
                          [(T0 + t / 10, True, 1) for t in range(-20, 80)], 3.0)
    assert br.step_starts(decisions) == []
    assert (row["guard"], row["ended_step"], row["candidate_answers"]) == \
        ("gate + shadow", "shadow", 0)
    assert (row["agreement_replayed"], row["agreement_live"], row["mirrored"]) == \
        (1.0, 0.75, 40)
    assert row["verdict_s"] == 8.0 and row["wall_s"] == 8.0  # from the rollout's start
    line = br.markdown([row]).splitlines()[2 + 2]
    assert line.startswith("| diverging | gate + shadow | rolled back |")
    assert "| shadow |" in line and "1.000 / 0.750 (40 mirrored)" in line


def test_shadow_step_cost_has_its_own_table() -> None:
    shadow = br.detour_rows([run(0, "http", False, 1000, 4.0), run(0, "http", True, 900, 4.4)],
                            4)
    for row in shadow:
        row.update(part="shadow", percent=20, mirrored=180, skipped=3, mirror_errors=0)
    lines = br.markdown(shadow).splitlines()
    assert lines[0].startswith("Shadow step on the HAProxy plane: 20%")
    assert any(ln.startswith("| http | 4 | 1000 | 900 | 0.90x |") and "| 180 (3, 0) |" in ln
               for ln in lines)


def test_plot_writes_one_png_with_a_panel_per_scenario(tmp_path: Path) -> None:
    paths = br.plot(rows(), tmp_path)
    assert paths == [tmp_path / "rollout_share.png"]
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert br.plot(rows()[2:], tmp_path / "none") == []  # no scenario: no figure


def test_every_fifth_request_carries_the_input_the_erroring_version_fails_on() -> None:
    firsts = [br.infer_body(n)["inputs"][0]["data"][0] for n in range(1, 11)]
    assert firsts == [0.5, 0.5, 0.5, 0.5, 0.9, 0.5, 0.5, 0.5, 0.5, 0.9]
    assert br.BAD_SHARE * 5 == 1
