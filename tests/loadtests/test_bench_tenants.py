"""The tenants benchmark's own arithmetic: Jain's index, percentiles with refusals that
h2load cannot tell apart, the gateway's per-tenant counts, each run's figures, the rows,
the table and the plot (h2load's output itself: test_h2load.py)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import yaml

from loadtests import bench_tenants as bt
from loadtests import h2load
from loadtests import tenants_figures as tf
from loadtests import tenants_flood as fl
from loadtests import tenants_report as tr
from loadtests import tenants_scenarios as ts
from loadtests.harness import percentile

METRICS_BEFORE = """\
# HELP infergate_tenant_requests_total Requests by tenant, priority and outcome.
# TYPE infergate_tenant_requests_total counter
infergate_tenant_requests_total{tenant="light",priority="standard",outcome="success"} 10.0
infergate_tenant_requests_total{tenant="heavy",priority="standard",outcome="success"} 100.0
infergate_tenant_requests_total{tenant="heavy",priority="standard",outcome="rejected"} 5.0
# HELP infergate_tenant_refused_requests_total Refusals by tenant, priority and reason.
# TYPE infergate_tenant_refused_requests_total counter
infergate_tenant_refused_requests_total{tenant="heavy",priority="standard",reason="fair_share"} 5.0
# HELP infergate_requests_total Inference requests by outcome.
# TYPE infergate_requests_total counter
infergate_requests_total{model="tiny",pool="p",protocol="grpc",outcome="success",traffic="user"} 7.0
"""  # noqa: E501 - Prometheus lines as the gateway writes them

METRICS_AFTER = METRICS_BEFORE.replace(
    'outcome="success"} 10.0', 'outcome="success"} 1010.0').replace(
    'outcome="success"} 100.0', 'outcome="success"} 4100.0').replace(
    'outcome="rejected"} 5.0', 'outcome="rejected"} 3005.0').replace(
    'reason="fair_share"} 5.0', 'reason="fair_share"} 2005.0'
) + ('infergate_tenant_refused_requests_total{tenant="heavy",priority="standard",'
     'reason="saturated"} 1000.0\n'
     'infergate_tenant_requests_total{tenant="heavy",priority="standard",outcome="deadline"}'
     ' 2.0\n')


# -- Jain's index ---------------------------------------------------------------------

def test_jain_index_is_one_when_every_tenant_gets_the_same() -> None:
    assert tf.jain_index([300.0, 300.0, 300.0]) == pytest.approx(1.0)


def test_jain_index_is_one_over_n_when_one_tenant_gets_everything() -> None:
    assert tf.jain_index([900.0, 0.0, 0.0]) == pytest.approx(1 / 3)


def test_jain_index_matches_the_formula_when_shares_differ() -> None:
    # (1 + 2 + 3)^2 / (3 * (1 + 4 + 9)) = 36 / 42
    assert tf.jain_index([1.0, 2.0, 3.0]) == pytest.approx(36 / 42)
    assert tf.jain_index([5.0]) == pytest.approx(1.0)


def test_jain_index_is_nan_when_nobody_got_anything_and_refuses_nonsense() -> None:
    assert math.isnan(tf.jain_index([0.0, 0.0]))
    with pytest.raises(ValueError, match="nothing"):
        tf.jain_index([])
    with pytest.raises(ValueError, match=">= 0"):
        tf.jain_index([1.0, -1.0])


# -- percentiles with hidden refusals -------------------------------------------------

def test_percentile_bounds_are_the_percentile_itself_when_nothing_is_hidden() -> None:
    values = [float(v) for v in range(1, 101)]
    assert tf.percentile_bounds(values, 99, 0) == (99.0, 99.0)
    assert tf.percentile_bounds(values, 50, 0) == (50.0, 50.0) == (percentile(values, 50),) * 2


def test_percentile_bounds_take_hidden_values_from_either_end() -> None:
    # 10 answers, 2 of them refusals nobody can tell apart: the successes are 8 of them
    values = [10.0, 1.0, 9.0, 2.0, 8.0, 3.0, 7.0, 4.0, 6.0, 5.0]
    low, high = tf.percentile_bounds(values, 50, 2)
    assert (low, high) == (4.0, 6.0)  # successes 1..8 / 3..10
    low, high = tf.percentile_bounds(values, 99, 2)
    assert (low, high) == (8.0, 10.0)


def test_percentile_bounds_are_nan_when_everything_was_hidden() -> None:
    assert all(math.isnan(v) for v in tf.percentile_bounds([1.0, 2.0], 99, 2))
    assert all(math.isnan(v) for v in tf.percentile_bounds([], 99, 0))


def test_percentile_of_an_h2load_log_keeps_only_the_200s() -> None:
    log = h2load.parse_log("".join(f"1796117577{i:06d}\t{200 if i % 5 else 429}\t{i * 100}\n"
                                   for i in range(1, 101)))
    ok = [us for status, us in log if status == 200]
    assert len(ok) == 80 and h2load.status_counts(log) == {200: 80, 429: 20}
    assert tf.percentile_bounds(ok, 99, 0)[1] == 9900.0  # the 79th of 80, nearest rank


# -- the gateway's counts -------------------------------------------------------------

def test_tenant_counts_sum_outcomes_and_reasons_per_tenant() -> None:
    counts = tf.tenant_counts(METRICS_AFTER)
    assert counts.families == {tf.TENANT_REQUESTS, tf.TENANT_REFUSED[0], tf.GATEWAY_REQUESTS}
    assert counts.by_tenant["heavy"] == {"success": 4100.0, "rejected": 3005.0,
                                         "deadline": 2.0, "refused:fair_share": 2005.0,
                                         "refused:saturated": 1000.0}
    assert "?" not in counts.by_tenant  # other families are not tenants'
    assert counts.by_tenant[tf.WHOLE_GATEWAY] == {"success": 7.0}  # user traffic only
    assert counts.in_flight is None  # no gauge in this exposition
    gauge = ("# TYPE infergate_in_flight_requests gauge\n"
             'infergate_in_flight_requests{model="tiny",pool="p"} 3.0\n'
             'infergate_in_flight_requests{model="big",pool="p"} 1.0\n')
    assert tf.tenant_counts(METRICS_AFTER + gauge).in_flight == 4.0


def test_tenant_counts_read_the_refusals_under_the_name_the_issue_gave_too() -> None:
    text = ('# TYPE infergate_tenant_refused_total counter\n'
            'infergate_tenant_refused_total{tenant="a",priority="sheddable",'
            'reason="saturated"} 3\n')
    assert tf.tenant_counts(text).by_tenant == {"a": {"refused:saturated": 3.0}}


def test_outcomes_over_a_run_are_after_minus_before() -> None:
    delta = tf.tenant_counts(METRICS_AFTER).minus(tf.tenant_counts(METRICS_BEFORE))
    heavy = tf.outcomes(delta, "heavy")
    assert heavy == tf.Outcomes(succeeded=4000, refused=3000, failed=3002,
                                reasons={"fair_share": 2000, "saturated": 1000})
    assert tf.outcomes(delta, "light") == tf.Outcomes(1000, 0, 0, {})
    assert tf.outcomes(delta, "nobody") == tf.Outcomes(0, 0, 0, {})
    assert tf.outcomes(delta, "light", alone=True) == tf.Outcomes(1000, 0, 0, {})  # its own


def test_outcomes_leave_out_what_the_client_cancelled_at_the_end_of_its_run() -> None:
    line = 'infergate_tenant_requests_total{{tenant="light",priority="critical",' \
           'outcome="{}"}} {}\n'
    text = "".join(line.format(o, n) for o, n in (("success", 94), ("cancelled", 2),
                                                    ("upstream_error", 1)))
    assert tf.outcomes(tf.tenant_counts(text), "light") == tf.Outcomes(94, 0, 1, {})


def test_outcomes_are_unknown_when_the_gateway_has_no_tenant_counts() -> None:
    counts = tf.tenant_counts("# TYPE x_total counter\nx_total 1.0\n")
    assert counts.families == frozenset() and tf.outcomes(counts, "light") is None
    assert tf.outcomes(counts, "light", alone=True) is None


def test_outcomes_of_the_only_client_are_the_whole_gateways_without_tenancy() -> None:
    line = ('infergate_requests_total{{model="tiny",pool="p",protocol="grpc",'
            'outcome="{}",traffic="{}"}} {}\n')
    text = ("# TYPE infergate_requests_total counter\n" + line.format("success", "user", 90)
            + line.format("rejected", "user", 10) + line.format("success", "warmup", 5))
    counts = tf.tenant_counts(text)
    assert tf.outcomes(counts, "solo") is None  # several clients: not theirs to split
    solo = tf.outcomes(counts, "solo", alone=True)
    assert solo == tf.Outcomes(90, 10, 10, {}, tf.GATEWAY_REQUESTS)
    f = tf.figures(measured("grpc", {200: 100}, [float(v) for v in range(100)], solo))
    assert f.success_pct == 90.0 and "whole gateway" in f.note


def test_counts_families_seen_before_a_tenant_first_sent_still_count() -> None:
    empty_before = tf.tenant_counts("")
    delta = tf.tenant_counts(METRICS_AFTER).minus(empty_before)
    assert tf.outcomes(delta, "light") == tf.Outcomes(1010, 0, 0, {})


# -- one run's figures ----------------------------------------------------------------

def measured(protocol: str, statuses: dict[int, int], latencies: list[float],
             counted: tf.Outcomes | None, seconds: float = 2.0) -> tf.Measured:
    return tf.Measured("light", protocol, 1, seconds, statuses, tuple(latencies), counted)


def test_http_figures_come_from_the_log_with_429s_as_refusals() -> None:
    latencies = [float(v) for v in range(1000, 1100)]  # us
    m = measured("http", {200: 100, 429: 1}, latencies, None)
    f = tf.figures(dataclasses.replace(m, refusal_latencies_us=(250.0,)))
    assert f.admitted_per_s == 50.0 and f.refused == 1 and f.refusal_p50_ms == 0.25
    assert f.success_pct == pytest.approx(100 * 100 / 101)
    assert f.p99_ms == f.p99_low_ms == pytest.approx(1.098) and f.latency == tf.EXACT


def test_grpc_figures_take_counts_from_the_gateway_and_bound_the_latency() -> None:
    latencies = [float(v) for v in range(1, 101)]  # 100 HTTP-200 answers, 10 refusals
    f = tf.figures(measured("grpc", {200: 100}, latencies, tf.Outcomes(90, 10, 10, {})))
    assert f.admitted_per_s == 45.0 and f.refused == 10 and f.success_pct == 90.0
    assert f.latency == tf.UPPER_BOUND and (f.p99_low_ms, f.p99_ms) == (0.09, 0.1)
    exact = tf.figures(measured("grpc", {200: 100}, latencies, tf.Outcomes(100, 0, 0, {})))
    assert exact.latency == tf.EXACT and exact.p99_ms == exact.p99_low_ms == 0.099


def test_grpc_figures_say_so_when_refusals_cannot_be_counted() -> None:
    f = tf.figures(measured("grpc", {200: 3}, [1.0, 2.0, 3.0], None))
    assert f.admitted_per_s is None and f.refused is None and f.success_pct is None
    assert "refusals unknown" in f.note and f.latency == tf.ALL_ANSWERS
    assert f.p99_ms == 0.003  # over every answer, refusals included: said so


def test_a_run_straight_at_the_member_counts_h2loads_answers() -> None:
    """No gateway to count: every answer a success, nothing refused, h2load's own cut at
    its end (-1) neither; the latency exact, and the note says where it came from."""
    counted = tf.member_outcomes({200: 98, 503: 2, -1: 3})
    assert (counted.succeeded, counted.refused, counted.failed) == (98, 0, 2)
    assert counted.source == tf.MEMBER_ANSWERS and not counted.reasons
    latencies = [float(v) for v in range(1, 99)]
    f = tf.figures(measured("grpc", {200: 98, 503: 2, -1: 3}, latencies, counted))
    assert f.admitted_per_s == 49.0 and f.refused == 0 and f.success_pct == 98.0
    assert f.latency == tf.EXACT and "straight at the member" in f.note
    assert "whole gateway" not in f.note


# -- scenarios and configuration ------------------------------------------------------

def test_scenarios_overload_the_pool_about_twice_with_heavy_ten_times_light() -> None:
    phases = {(p.scenario, p.name): p for p in ts.scenario_phases(5)}
    noisy = {t.tenant: t for t in phases[("noisy", "mixed")].loads}
    assert noisy["heavy"].in_flight == 10 * noisy["light"].in_flight
    for name in ("noisy", "priority", "fairness"):
        offered = sum(t.in_flight for t in phases[(name, "mixed")].loads) / 5
        assert 2.0 <= offered <= 2.4, (name, offered)
    priorities = {t.priority for t in phases[("priority", "mixed")].loads}
    assert priorities == {"critical", "sheddable"}
    assert [t.tenant for t in phases[("priority", "alone")].loads] == ["critical"]
    # paced: an open-loop light / critical tenant beside a flood of 2x capacity
    for scenario, light, flood in (("noisy-paced", "paced-light", "flood-standard"),
                                   ("priority-paced", "paced-critical", "flood")):
        mixed = {t.tenant: t for t in phases[(scenario, "mixed")].loads}
        assert mixed[light].paced == ts.PACED_SHARE and mixed[flood].paced == ts.FLOOD_SHARE
        assert mixed[flood].priority == mixed[light].priority or scenario == "priority-paced"
        assert [t.tenant for t in phases[(scenario, "alone")].loads] == [light]
    assert {t.priority for t in phases[("priority-paced", "mixed")].loads} == {
        "critical", "sheddable"}


def test_tenancy_section_names_every_tenant_once_with_its_own_key() -> None:
    loads = [load for p in ts.scenario_phases(5) for load in p.loads]
    section = bt.tenancy_section(loads)
    names = [t["name"] for t in section["tenants"]]
    assert len(names) == len(set(names)) == 11
    keys = [k for t in section["tenants"] for k in t["keys"]]
    assert len(set(keys)) == 11
    assert section["refuse_at"] == {}  # the gateway's own ceilings
    assert bt.tenancy_section(loads, sheddable_at=1.0)["refuse_at"] == {"sheddable": 1.0}
    assert ts.TenantLoad("light", "standard", 1).headers == (
        "x-api-key: light-key-0123456789abcdef",)


def test_written_config_is_one_pool_with_capacity_and_tenancy(tmp_path: Path) -> None:
    member = bt.TritonEndpoints("127.0.0.1", 1, 2, 3)
    loads = bt.gateway_specs(4)["tenants"]
    path = bt.write_config(tmp_path / "gw.yaml", member, 4, loads)
    data = yaml.safe_load(path.read_text())
    assert data["pools"][0]["capacity_per_member"] == 4
    assert data["pools"][0]["members"][0]["host"] == "127.0.0.1"
    # 11 of the overload scenarios, 7 of the flood's (fl.flood_phases)
    assert data["queue_factor"] == 2.0 and len(data["tenancy"]["tenants"]) == 18
    plain = yaml.safe_load(bt.write_config(tmp_path / "none.yaml", member, 4, None).read_text())
    assert "tenancy" not in plain


def test_written_config_is_one_the_gateway_accepts_when_it_knows_tenancy(
    tmp_path: Path,
) -> None:
    from gateway.config import GatewayConfig

    if "tenancy" not in GatewayConfig.model_fields:
        pytest.skip("this gateway has no tenancy: section yet")
    member = bt.TritonEndpoints("127.0.0.1", 1, 2, 3)
    for name, tenants in bt.gateway_specs(5).items():
        path = bt.write_config(tmp_path / f"{name}.yaml", member, 5, tenants)
        config = GatewayConfig.model_validate(yaml.safe_load(path.read_text()))
        assert (config.tenancy is None) == (tenants is None)


# -- h2load command lines (the key header, exact concurrency) -------------------------

@pytest.mark.parametrize(("in_flight", "connections"),
                         [(1, 1), (4, 4), (5, 1), (10, 2), (11, 1), (12, 4), (16, 4), (6, 3)])
def test_grpc_connections_divide_the_streams_evenly(in_flight: int, connections: int) -> None:
    assert h2load.grpc_connections(in_flight) == connections


def test_h2load_command_paces_the_whole_rate_over_its_connections(tmp_path: Path) -> None:
    work = h2load.Workload("tiny", tmp_path / "t.grpc", tmp_path / "t.bin", 12)
    endpoints = bt.TritonEndpoints("127.0.0.1", 1, 2, 3)
    http = h2load.h2load_command(work, "http", endpoints, 2, "2000ms", None, rps=100.0)
    assert http[http.index("--rps") + 1] == "50.000" and http[http.index("-c") + 1] == "2"
    grpc = h2load.h2load_command(work, "grpc", endpoints, 4, "2000ms", None, rps=30.0)
    assert grpc[grpc.index("--rps") + 1] == "7.500"  # 4 connections of one stream each
    assert "--rps" not in h2load.h2load_command(work, "http", endpoints, 2, "2000ms", None)


def test_h2load_command_carries_the_key_header_on_both_protocols(tmp_path: Path) -> None:
    work = h2load.Workload("tiny", tmp_path / "t.grpc", tmp_path / "t.bin", 12)
    endpoints = bt.TritonEndpoints("127.0.0.1", 1, 2, 3)
    for protocol in ("grpc", "http"):
        cmd = h2load.h2load_command(work, protocol, endpoints, 10, "2000ms", None,
                                    ("x-api-key: k",))
        assert cmd[cmd.index("x-api-key: k") - 1] == "-H" and cmd[-1].startswith("http://")
    grpc = h2load.h2load_command(work, "grpc", endpoints, 10, "2000ms", None)
    assert (grpc[grpc.index("-c") + 1], grpc[grpc.index("-m") + 1]) == ("2", "5")


# -- rows, verdicts, table, plot ------------------------------------------------------

def fake_samples() -> ts.Samples:
    ms = [float(v) for v in range(1000, 1100)]  # 1.0..1.099 ms

    def run(tenant: str, protocol: str, statuses: dict[int, int], scale: float = 1.0,
            counted: tf.Outcomes | None = None, in_flight: int = 1) -> tf.Measured:
        answers = statuses.get(200, 0)  # one latency per HTTP 200 in the log
        return tf.Measured(tenant, protocol, in_flight, 2.0, statuses,
                           tuple(ms[i % len(ms)] * scale for i in range(answers)), counted)

    samples: ts.Samples = {}
    for protocol in ("http", "grpc"):
        grpc = protocol == "grpc"
        ok = tf.Outcomes(100, 0, 0, {})

        def put(scenario: str, phase: str, *runs: tf.Measured, p: str = protocol) -> None:
            samples.setdefault((scenario, phase, "tiny", p), []).append(
                {m.tenant: m for m in runs})

        put("noisy", "alone", run("light", protocol, {200: 100}, counted=ok if grpc else None))
        put("noisy", "mixed",
            run("heavy", protocol, {200: 500} if grpc else {200: 100, 429: 400},
                counted=tf.Outcomes(100, 400, 400, {"fair_share": 400}) if grpc else None,
                in_flight=10),
            run("light", protocol, {200: 100}, scale=1.1, counted=ok if grpc else None))
        put("priority", "alone",
            run("critical", protocol, {200: 100}, counted=ok if grpc else None, in_flight=5))
        put("priority", "mixed",
            run("critical", protocol, {200: 100}, scale=1.5, counted=ok if grpc else None,
                in_flight=5),
            run("sheddable", protocol, {200: 100}, counted=None, in_flight=5))
        put("fairness", "mixed", *(run(f"fair-{c}", protocol, {200: 100}, counted=ok,
                                       in_flight=4) for c in "abc"))
        put("cost", "none", run("solo", protocol, {200: 100}, counted=ok, in_flight=5))
        put("cost", "tenancy", run("solo", protocol, {200: 95}, counted=tf.Outcomes(95, 0, 0, {}),
                                   in_flight=5))
        put("cost", "queued", run("solo", protocol, {200: 98}, counted=tf.Outcomes(98, 0, 0, {}),
                                  in_flight=5))
        put("noisy-paced", "alone",
            run("paced-light", protocol, {200: 999, 429: 1}, counted=ok if grpc else None,
                in_flight=2))
        put("noisy-paced", "mixed",
            run("flood-standard", protocol, {200: 500} if grpc else {200: 100, 429: 400},
                counted=tf.Outcomes(100, 400, 400, {"fair_share": 400}) if grpc else None,
                in_flight=10),
            run("paced-light", protocol, {200: 100}, scale=1.4, counted=ok if grpc else None,
                in_flight=2))
    return samples


def rows_by(rows: list[dict], **match: str) -> dict:
    found = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
    assert len(found) == 1, (match, found)
    return found[0]


def test_summary_judges_each_goal_against_the_alone_run() -> None:
    rows = tr.summarise(fake_samples(), 2.0)
    light = rows_by(rows, scenario="noisy", phase="mixed", tenant="light", protocol="http")
    assert light["p99_vs_alone_ratio"] == pytest.approx(1.1)
    assert light["success_pct"] == 100.0 and light["met"] == "yes"
    heavy = rows_by(rows, scenario="noisy", tenant="heavy", protocol="http")
    assert heavy["refused"] == 400 and heavy["met"] == "" and "p99_vs_alone_ratio" not in heavy
    critical = rows_by(rows, scenario="priority", phase="mixed", tenant="critical",
                       protocol="grpc")
    assert critical["p99_vs_alone_ratio"] == pytest.approx(1.5) and critical["met"] == "NO (p99)"
    shed = rows_by(rows, scenario="priority", tenant="sheddable", protocol="grpc")
    assert shed["refused"] is None and shed["notes"]  # said why, never made up
    fair = rows_by(rows, scenario="fairness", tenant="all", protocol="http")
    assert fair["jain_index"] == pytest.approx(1.0) and fair["met"] == "yes"
    cost = rows_by(rows, scenario="cost", phase="tenancy", protocol="grpc")
    assert cost["throughput_ratio"] == pytest.approx(0.95) and cost["met"] == "NO (throughput)"
    queued = rows_by(rows, scenario="cost", phase="queued", protocol="grpc")
    assert queued["throughput_ratio"] == pytest.approx(0.98) and queued["met"] == "yes"
    assert queued["goal"] == "throughput >= 0.97x without tenancy"
    # paced: 1.4x alone is within the paced goal (1.5x); alone has a goal of its own
    paced = rows_by(rows, scenario="noisy-paced", phase="mixed", tenant="paced-light",
                    protocol="http")
    assert paced["p99_vs_alone_ratio"] == pytest.approx(1.4) and paced["met"] == "yes"
    alone = rows_by(rows, scenario="noisy-paced", phase="alone", tenant="paced-light",
                    protocol="http")
    assert alone["success_pct"] == pytest.approx(99.9) and alone["met"] == "yes"
    assert ts.verdict("noisy-paced", "paced-light", {"success_pct": 99.5}, alone=True) == (
        "NO (success)")


def test_verdict_says_not_measured_rather_than_guessing() -> None:
    row = {"success_pct": None, "p99_vs_alone_ratio": 1.0}
    assert ts.verdict("noisy", "light", row) == "n/a (success not measured)"
    assert ts.verdict("noisy", "light", {"success_pct": 98.0, "p99_vs_alone_ratio": 2.0}) == (
        "NO (success, p99)")
    assert ts.verdict("priority", "critical", {"refused": 0, "p99_vs_alone_ratio": 1.1}) == "yes"
    assert ts.verdict("noisy", "heavy", {}) == ""


def test_markdown_and_plot_show_every_row(tmp_path: Path) -> None:
    rows = tr.summarise(fake_samples(), 2.0)
    table = tr.markdown(rows)
    assert table.count("\n| ") >= len(rows)
    assert "Jain 1.000" in table and "0.950x throughput" in table
    light = [line for line in table.splitlines() if "| light |" in line]
    assert len(light) == 4 and not any("<=" in line.split("|")[9] for line in light)
    alone = [line for line in table.splitlines() if "(alone)" in line and "paced" not in line]
    assert len(alone) == 4 and all(line.endswith("|  |  |") for line in alone)
    assert "refusals unknown" in table  # the sheddable gRPC note
    grpc_heavy = rows_by(rows, scenario="noisy", tenant="heavy", protocol="grpc")
    assert grpc_heavy["latency"] == tf.UPPER_BOUND and "| <=" in tr.markdown([grpc_heavy])
    shed = rows_by(rows, scenario="priority", tenant="sheddable", protocol="grpc")
    assert shed["latency"] == tf.ALL_ANSWERS and "| ~" in tr.markdown([shed])
    assert tr.markdown([]) == "(nothing measured)"
    [png] = tr.plot(rows, tmp_path)
    cells = [("tiny", "http"), ("tiny", "grpc")]
    cost = tr.plotted(rows, "throughput_ratio", "cost", "solo", cells)
    assert cost == [pytest.approx(0.95)] * 2  # the tenancy row's, not the baseline's
    light_ratios = tr.plotted(rows, "p99_vs_alone_ratio", "noisy", "light", cells)
    assert light_ratios == [pytest.approx(1.1)] * 2
    assert math.isnan(tr.plotted(rows, "jain_index", "fairness", "all", [("x", "http")])[0])
    assert png.name == "bench_tenants.png" and png.stat().st_size > 1000


# -- the gateway's own figures against the client's ------------------------------------

def test_histogram_quantile_interpolates_inside_the_bucket_as_prometheus_does() -> None:
    buckets = {0.001: 0.0, 0.002: 50.0, 0.005: 90.0, 0.01: 100.0, math.inf: 100.0}
    assert tf.histogram_quantile(buckets, 50) == pytest.approx(0.002)
    assert tf.histogram_quantile(buckets, 25) == pytest.approx(0.0015)
    assert tf.histogram_quantile(buckets, 99) == pytest.approx(0.0095)
    assert math.isnan(tf.histogram_quantile({math.inf: 0.0}, 50))
    assert tf.histogram_quantile({0.01: 1.0, math.inf: 3.0}, 99) == 0.01  # past the last


def test_figures_are_within_ten_percent_or_a_millisecond() -> None:
    assert tf.figures_within(2.9, 2.0) and not tf.figures_within(3.1, 2.0)
    assert tf.figures_within(54.0, 50.0) and not tf.figures_within(56.0, 50.0)
    assert tf.figures_within(math.nan, 2.0) is None


def test_the_tenants_histogram_is_read_from_the_gateways_counts() -> None:
    text = "\n".join(
        f'infergate_tenant_request_duration_seconds_bucket{{le="{le}",priority="standard",'
        f'tenant="light"}} {n}' for le, n in (("0.001", 1), ("0.002", 3), ("+Inf", 4)))
    counts = tf.tenant_counts(
        "# TYPE infergate_tenant_request_duration_seconds histogram\n" + text + "\n")
    assert tf.latency_buckets(counts, "light") == {0.001: 1.0, 0.002: 3.0, math.inf: 4.0}
    assert tf.latency_buckets(counts, "heavy") is None
    # the histogram is no outcome: a tenant's requests are its outcome counts alone
    text += '\ninfergate_tenant_requests_total{outcome="success",priority="standard",' \
            'tenant="light"} 4'
    mine = tf.outcomes(tf.tenant_counts(text + "\n"), "light")
    assert mine is not None and (mine.succeeded, mine.failed) == (4, 0)


# -- issue 36's flood -------------------------------------------------------------------

def flood_samples() -> ts.Samples:
    """HTTP: the light tenant 1.0..1.099 ms alone, 1.3x that beside the flood; the flood
    admitted 300 of 1,300 in 2 s beside it, 1,000 alone without tenancy."""
    ms = [float(v) for v in range(1000, 1100)]

    def run(tenant: str, statuses: dict[int, int], scale: float = 1.0,
            queue: dict[float, float] | None = None, in_flight: int = 2) -> tf.Measured:
        answers = statuses.get(200, 0)
        return tf.Measured(tenant, "http", in_flight, 2.0, statuses,
                           tuple(ms[i % len(ms)] * scale for i in range(answers)), None,
                           queue_buckets=queue)

    wait = {0.0: 10.0, 0.001: 90.0, 0.002: 100.0, math.inf: 100.0}
    samples: ts.Samples = {}

    def put(scenario: str, phase: str, *runs: tf.Measured) -> None:
        samples.setdefault((scenario, phase, "tiny", "http"), []).append(
            {m.tenant: m for m in runs})

    put("flood-goodput", "alone-none", run("flood-standard64", {200: 2000}, in_flight=64))
    for tag in ("before", "after"):
        put("flood-priority", f"alone-{tag}", run("light-critical", {200: 100}))
        put("flood-priority", f"mixed-{tag}",
            run("light-critical", {200: 99, 429: 1}, scale=1.3, queue=wait),
            run("flood-sheddable", {200: 600, 429: 2000}, in_flight=64))
        put("flood-fairness", f"mixed-{tag}",
            *(run(f"flood-fair-{c}", {200: 100}, in_flight=21) for c in "abc"))
    return samples


def test_flood_rows_compare_the_light_tenant_alone_and_beside_the_flood() -> None:
    rows = tr.summarise(flood_samples(), 2.0)
    after = rows_by(rows, scenario="flood-priority", phase="after")
    assert after["success_alone_pct"] == 100.0 and after["success_pct"] == 99.0
    assert after["p99_vs_alone_ratio"] == pytest.approx(1.3)
    assert after["p50_vs_alone_ratio"] == pytest.approx(1.3)
    assert after["flood_goodput_per_s"] == 300.0
    # (99 + 600) / 2 s beside the flood, over 2,000 / 2 s alone without tenancy
    assert after["pool_goodput_vs_none_ratio"] == pytest.approx(0.3495)
    assert after["queue_p50_ms"] == pytest.approx(0.5) and after["queue_p99_ms"] < 2.0
    assert after["met"] == "NO (success, p99, goodput)"
    fair = rows_by(rows, scenario="flood-fairness", phase="before")
    assert fair["jain_index"] == pytest.approx(1.0) and fair["met"] == "yes"
    table = tr.markdown(rows)
    assert table.startswith("Issue 36") and table.count("| flood-") == 4
    assert "| 0.5/1.9 |" in table and "| 0.349x |" in table


def test_flood_phases_run_before_after_nolane_and_tarpit_on_their_own_gateways(
        tmp_path: Path) -> None:
    phases = fl.flood_phases()
    assert {p.gateway for p in phases} == {fl.BEFORE, fl.AFTER, fl.NO_LANE, fl.TARPIT, "none"}
    floods = [t for p in phases for t in p.loads if not t.paced and "fair" not in t.tenant]
    assert floods and all(t.in_flight == fl.FLOOD_IN_FLIGHT for t in floods)
    fair = [t.in_flight for p in phases if p.scenario == "flood-fairness" for t in p.loads]
    assert sum(fair) == 4 * fl.FLOOD_IN_FLIGHT  # before, after, nolane and tarpit
    member = bt.TritonEndpoints("127.0.0.1", 1, 2, 3)
    path = bt.write_config(tmp_path / "q.yaml", member, 5, bt.gateway_specs(5)[fl.AFTER],
                           queued=True)
    [pool] = yaml.safe_load(path.read_text())["pools"]
    assert pool["gateway_queue"] is True and pool["capacity_per_member"] == 5
    assert "lane_per_member" not in pool  # the gateway's default
    path = bt.write_config(tmp_path / "n.yaml", member, 5, bt.gateway_specs(5)[fl.NO_LANE],
                           queued=True, lane=0)
    [pool] = yaml.safe_load(path.read_text())["pools"]
    assert pool["lane_per_member"] == 0


def test_the_member_runs_the_light_tenant_beside_a_flood_held_at_capacity() -> None:
    """--capacity 3: at the member, the light critical tenant alone and beside the
    sheddable flood of 3 in flight, straight at Triton; none without a capacity."""
    assert {p.gateway for p in fl.flood_phases()} == {
        fl.BEFORE, fl.AFTER, fl.NO_LANE, fl.TARPIT, "none"}
    member = [p for p in fl.flood_phases(capacity=3) if p.gateway == fl.MEMBER]
    assert [(p.scenario, p.name) for p in member] == [
        ("flood-priority", "alone-member"), ("flood-priority", "mixed-member")]
    alone, mixed = member
    assert [t.tenant for t in alone.loads] == ["light-critical"]
    light, flood = mixed.loads
    assert light == alone.loads[0] and light.paced > 0
    assert (flood.tenant, flood.in_flight, flood.paced) == ("flood-sheddable", 3, 0.0)


def test_the_members_row_is_a_reference_not_judged() -> None:
    samples = flood_samples()
    ms = [float(v) for v in range(1000, 1100)]

    def run(tenant: str, answers: int, scale: float, in_flight: int) -> tf.Measured:
        return tf.Measured(tenant, "http", in_flight, 2.0, {200: answers},
                           tuple(ms[i % len(ms)] * scale for i in range(answers)), None)

    for phase, runs in (("alone-member", [run("light-critical", 100, 1.0, 2)]),
                        ("mixed-member", [run("light-critical", 100, 1.1, 2),
                                          run("flood-sheddable", 1800, 1.0, 2)])):
        samples[("flood-priority", phase, "tiny", "http")] = [{m.tenant: m for m in runs}]
    rows = tr.summarise(samples, 2.0)
    member = rows_by(rows, scenario="flood-priority", phase=fl.MEMBER_TAG)
    assert member["met"] == "reference" and "no gateway" in member["goal"]
    assert member["p99_vs_alone_ratio"] == pytest.approx(1.1)
    # (100 + 1,800) / 2 s over the flood alone without tenancy, 2,000 / 2 s
    assert member["pool_goodput_vs_none_ratio"] == pytest.approx(0.95)
    assert not [r for r in rows if r["scenario"] == "flood-standard"
                and r["phase"] == fl.MEMBER_TAG]
    assert "| flood-priority | member | tiny | http |" in tr.markdown(rows)


def test_a_flood_run_plots_the_flood_and_no_empty_overload_figure(tmp_path: Path) -> None:
    rows = tr.summarise(flood_samples(), 2.0)
    [png] = tr.plot(rows, tmp_path)
    assert png.name == "bench_tenants_flood.png" and png.stat().st_size > 1000
    assert not (tmp_path / "bench_tenants.png").exists()


def test_the_flood_gateways_refuse_at_once_before_and_after_the_delay_otherwise(
        tmp_path: Path) -> None:
    assert bt.flood_delays(250) == {fl.BEFORE: 0, fl.AFTER: 250, fl.NO_LANE: 250,
                                    fl.TARPIT: 250}
    assert bt.flood_delays(None) == {fl.BEFORE: 0, fl.AFTER: None, fl.NO_LANE: None,
                                     fl.TARPIT: None}


def test_a_model_with_levels_adds_the_tarpit_without_them(tmp_path: Path) -> None:
    """--levels: nolevels, the tarpit whose tenancy gives Triton no levels."""
    phases = fl.flood_phases(levels=True)
    assert {p.gateway for p in phases} == {fl.BEFORE, fl.AFTER, fl.NO_LANE, fl.TARPIT,
                                           fl.NO_LEVELS, "none"}
    assert {p.name for p in phases if p.gateway == fl.NO_LEVELS} == {
        "alone-nolevels", "mixed-nolevels"}
    assert bt.flood_delays(250, levels=True)[fl.NO_LEVELS] == 250
    member = bt.TritonEndpoints("127.0.0.1", 1, 2, 3)
    loads = bt.gateway_specs(5)[fl.NO_LEVELS]
    off = yaml.safe_load(bt.write_config(tmp_path / "off.yaml", member, 5, loads,
                                         triton_levels=False).read_text())
    on = yaml.safe_load(bt.write_config(tmp_path / "on.yaml", member, 5, loads).read_text())
    assert off["tenancy"]["triton_levels"] is False
    assert "triton_levels" not in on["tenancy"]  # the gateway's default: on
    member = bt.TritonEndpoints("127.0.0.1", 1, 2, 3)
    loads = bt.gateway_specs(5)[fl.TARPIT]
    at_once = bt.write_config(tmp_path / "b.yaml", member, 5, loads, refusal_delay_ms=0)
    assert yaml.safe_load(at_once.read_text())["tenancy"]["refusal_delay_ms"] == 0
    default = bt.write_config(tmp_path / "t.yaml", member, 5, loads)
    assert "refusal_delay_ms" not in yaml.safe_load(default.read_text())["tenancy"]
