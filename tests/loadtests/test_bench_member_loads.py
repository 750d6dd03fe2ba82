"""The member-loads benchmark's pure parts: one arm's figures, the arms' order, the
medians over rounds, the loads at once and the recommendation, the table."""

from __future__ import annotations

import math

import pytest

from loadtests import bench_member_loads as bml

SETUP = bml.Setup(rate=50, connections=8, phase_s=20, rounds=3, load_rounds=5, slower=1.25)


def test_stream_figures_are_nearest_rank_when_requests_ended() -> None:
    latencies = [float(v) for v in range(1, 101)]  # 1..100 ms
    assert bml.stream_figures(latencies) == {"p50_ms": 50.0, "p99_ms": 99.0, "max_ms": 100.0}


def test_stream_figures_are_nan_when_no_request_ended() -> None:
    assert all(math.isnan(v) for v in bml.stream_figures([]).values())


def test_arm_order_rotates_when_rounds_follow() -> None:
    orders = [bml.arm_order(r) for r in range(len(bml.ARMS) + 1)]
    assert orders[0] == list(bml.ARMS)
    assert [o[0] for o in orders[:len(bml.ARMS)]] == list(bml.ARMS)  # each arm leads once
    assert orders[len(bml.ARMS)] == orders[0]
    assert all(sorted(o) == sorted(bml.ARMS) for o in orders)


def test_stall_rows_take_medians_and_compare_to_none_when_rounds_differ() -> None:
    def arm(p99: float, loads: float = 0.0) -> dict[str, float]:
        return {"p50_ms": 3.0, "p99_ms": p99, "max_ms": p99 * 2, "requests": 1000.0,
                "loads": loads}

    rounds = [{"none": arm(4.0), "http": arm(600.0, 12), "grpc": arm(10.0, 12)},
              {"none": arm(6.0), "http": arm(400.0, 11), "grpc": arm(30.0, 13)},
              {"none": arm(5.0), "http": arm(500.0, 12), "grpc": arm(20.0, 12)}]
    rows = {r["arm"]: r for r in bml.stall_rows(rounds)}
    assert list(rows) == ["none", "http", "grpc"]  # the ARMS order; http_new ran in none
    assert rows["none"]["p99_ms"] == 5.0 and rows["none"]["p99_vs_none"] == 1.0
    assert rows["http"]["p99_ms"] == 500.0 and rows["http"]["p99_vs_none"] == 100.0
    assert rows["grpc"]["max_ms"] == 40.0 and rows["grpc"]["loads"] == 12
    assert rows["grpc"]["rounds"] == 3


def test_load_rows_compare_each_to_one_alone_when_loads_slow_down() -> None:
    seconds = {1: [1.0, 1.2, 0.8], 2: [1.1, 1.1], 3: [1.5, 1.5, 1.5], 4: [2.0] * 4}
    rows = bml.load_rows(seconds, slower=1.25)
    assert [r["at_once"] for r in rows] == [1, 2, 3, 4]
    assert [r["vs_one"] for r in rows] == pytest.approx([1.0, 1.1, 1.5, 2.0])
    assert [r["within"] for r in rows] == [True, True, False, False]
    assert rows[1]["loads_per_s"] == pytest.approx(2 / 1.1)
    assert bml.recommended_at_once(rows) == 2


def test_recommended_at_once_stops_at_the_first_slower_when_a_later_one_is_fast() -> None:
    """A lucky 4 after a slow 3 is noise: the count stops where loads first slowed."""
    rows = bml.load_rows({1: [1.0], 2: [1.0], 3: [2.0], 4: [1.0]}, slower=1.25)
    assert bml.recommended_at_once(rows) == 2
    assert bml.recommended_at_once(bml.load_rows({1: [1.0], 2: [3.0]}, 1.25)) == 1


def test_markdown_has_both_tables_and_the_recommendation_when_loads_were_timed() -> None:
    stall = bml.stall_rows([{"none": {"p50_ms": 3.0, "p99_ms": 4.0, "max_ms": 5.0},
                             "grpc": {"p50_ms": 3.0, "p99_ms": 8.0, "max_ms": 9.0,
                                      "loads": 4.0}}])
    text = bml.markdown(stall, bml.load_rows({1: [1.0], 2: [1.1]}, 1.25), SETUP)
    assert "| none | 0 | 3.0 | 4.0 | 5.0 | 1.00x |" in text
    assert "| grpc | 4 | 3.0 | 8.0 | 9.0 | 2.00x |" in text
    assert "| 2 | 1 | 1.10 | 1.10x | 1.82 |" in text
    assert text.endswith("more than 1.25x slower: 2 (recommended loads_per_member).")
    assert "at once" not in bml.markdown(stall, [], SETUP)


def test_load_model_names_say_their_size_when_made() -> None:
    assert bml.load_model_names(2, 100) == ["load00_100mb", "load01_100mb"]


def test_main_refuses_an_unknown_arm_when_parsing_before_starting_anything(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bml.main(["--arms", "none,bogus"])
    assert "unknown arms ['bogus']" in capsys.readouterr().err


def test_load_rows_give_cpu_per_load_and_cores_busy_when_cpu_was_read() -> None:
    rows = bml.load_rows({1: [0.5], 2: [0.6, 0.6]}, 1.25, cpu_s={1: [0.55], 2: [1.2]})
    assert rows[0]["cpu_s_per_load"] == pytest.approx(0.55)
    assert rows[0]["cores_busy"] == pytest.approx(1.1)
    assert rows[1]["cpu_s_per_load"] == pytest.approx(0.6)
    assert rows[1]["cores_busy"] == pytest.approx(2.0)
    text = bml.markdown([], rows, SETUP)
    assert "| 2 | 2 | 0.60 | 1.20x | 3.33 | 0.60 | 2.0 |" in text
    assert text.endswith("takes about C / 1.1 loads at once.")
