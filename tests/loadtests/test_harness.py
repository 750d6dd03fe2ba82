"""What every benchmark shares (loadtests/harness.py): the figures' arithmetic and
formatting, the table, the plot's figure, Prometheus pages, settling counters and a
gateway's YAML (the stack itself runs in each benchmark's quick mode)."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
import yaml

from infergate.triton.local import TritonEndpoints
from loadtests import harness
from tests.procs import ROOT

MEMBER = TritonEndpoints("127.0.0.1", 8000, 8001, 8002)


def test_a_source_is_a_named_checkout_of_this_project(tmp_path: Path) -> None:
    name, source = harness.parse_source(f"before={ROOT}")
    assert name == "before" and source == ROOT.resolve()
    for bad in (f"={ROOT}", "before", f"before={tmp_path}"):
        with pytest.raises(ValueError, match="NAME=DIR"):
            harness.parse_source(bad)


# -- numbers --------------------------------------------------------------------------

def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(100, 0, -1)]
    assert harness.percentile(values, 50) == 50.0 and harness.percentile(values, 99) == 99.0
    assert harness.percentile([3.0], 99) == 3.0


def test_medians_and_ranges_keep_only_what_was_measured() -> None:
    assert harness.finite_median([1.0, None, math.nan, 3.0]) == 2.0
    assert harness.finite_median([None, math.nan]) is None
    assert harness.spread([2.0, math.nan, 0.5, 1.0]) == [0.5, 2.0]
    assert harness.spread([2.0]) is None


def test_a_figure_reads_n_a_when_not_measured_and_shows_its_range_when_it_has_one() -> None:
    assert harness.num(None, ".1f") == harness.num(math.nan, ".1f") == "n/a"
    assert harness.num(0.456, ".2f") == "0.46"
    row = {"ratio": 0.9, "ratio_range": [0.8, 1.0], "alone": 1.234}
    assert harness.with_range(row, "ratio", ".2f", "x") == "0.90x (0.80..1.00)"
    assert harness.with_range(row, "alone", ".1f") == "1.2"


# -- tables, plots --------------------------------------------------------------------

def test_table_is_a_header_its_rule_and_a_line_per_row() -> None:
    assert harness.table(("a", "b"), [(1, "x"), ("", 2.5)]) == (
        "| a | b |\n|---|---|\n| 1 | x |\n|  | 2.5 |")


def test_figure_is_saved_when_its_block_ends_and_closed_even_when_it_fails(
    tmp_path: Path,
) -> None:
    path = tmp_path / "plots" / "p.png"
    with harness.figure(path, 1, 2, figsize=(4, 2)) as (_, (left, right)):
        left.plot([0, 1], [1, 0])
        right.bar([0], [1])
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(RuntimeError), harness.figure(tmp_path / "no.png"):
        raise RuntimeError("drawing failed")
    assert not (tmp_path / "no.png").exists() and plt.get_fignums() == []


# -- Prometheus pages, settling -------------------------------------------------------

PAGE = """\
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="m",version="1"} 3
nv_inference_request_success{model="m",version="2"} 4
nv_inference_request_success{model="other",version="1"} 9
# TYPE infergate_requests_total counter
infergate_requests_total{model="m",outcome="success",protocol="http",traffic="user"} 10
infergate_requests_total{model="m",outcome="success",protocol="grpc",traffic="user"} 5
infergate_requests_total{model="m",outcome="rejected",protocol="http",traffic="user"} 2
infergate_requests_total{model="m",outcome="success",protocol="http",traffic="warmup"} 7
"""


def test_totals_sum_a_metrics_samples_by_a_label_where_the_others_match() -> None:
    assert harness.totals(PAGE, "infergate_requests_total", "outcome", model="m",
                          traffic="user") == {"success": 15.0, "rejected": 2.0}
    assert harness.totals(PAGE, "infergate_requests_total", "traffic", protocol="http") == {
        "user": 12.0, "warmup": 7.0}
    # Triton names a counter without _total; the parser adds it to its samples
    assert harness.total(PAGE, "nv_inference_request_success", model="m") == 7.0
    assert harness.total(PAGE, "no_such_metric") == 0.0 == harness.total("", "x")


def test_settle_waits_until_the_reading_stops_moving_and_nothing_is_busy() -> None:
    readings = itertools.chain([1, 2, 3, 3, 3], itertools.repeat(4))
    assert harness.settle(lambda: next(readings), quiet_s=0.0, timeout_s=5,
                          interval_s=0.001) == (3, True)
    busy = iter([(5, True), (5, True), (5, False), (5, False)])
    assert harness.settle(lambda: next(busy), 0.0, 5, 0.001,
                          key=lambda r: r[0], busy=lambda r: r[1]) == ((5, False), True)
    moving = itertools.count()
    reading, settled = harness.settle(lambda: next(moving), 0.0, 0.05, 0.001)
    assert not settled and reading > 1  # the last reading, at the deadline


# -- the gateway's YAML ---------------------------------------------------------------

def test_gateway_yaml_writes_pools_and_only_the_sections_asked_for(tmp_path: Path) -> None:
    plain = yaml.safe_load(harness.gateway_yaml(tmp_path / "a.yaml", {"p": [MEMBER]})
                           .read_text())
    assert plain == {"pools": [{"name": "p", "members": [
        {"host": "127.0.0.1", "http_port": 8000, "grpc_port": 8001, "metrics_port": 8002}]}]}
    path = harness.gateway_yaml(tmp_path / "b.yaml", {"p": [MEMBER]}, capacity_per_member=3,
                                lifecycle=tmp_path / "repo", tokens={"upload": "t0k3n"},
                                models={"tiny": {"preload": True}}, queue_factor=2.0)
    data = yaml.safe_load(path.read_text())
    assert data["pools"][0]["capacity_per_member"] == 3
    assert data["lifecycle"] == {"repository": str(tmp_path / "repo"),
                                 "state_dir": str(tmp_path / "state")}
    assert data["auth"] == {"predict": "open", "tokens_file": str(tmp_path / "tokens.yaml")}
    assert yaml.safe_load((tmp_path / "tokens.yaml").read_text()) == {
        "tokens": [{"name": "upload", "scopes": ["upload"], "token": "t0k3n"}]}
    assert data["models"] == {"tiny": {"preload": True}} and data["queue_factor"] == 2.0


def test_last_words_skips_the_box_a_cli_error_is_drawn_in() -> None:
    tail = "Usage: gateway serve\n╭─ Error ─╮\n│ No such option: --nope │\n╰─────────╯\n"
    assert harness.last_words(tail) == "No such option: --nope"


def test_a_models_runtime_is_refreshed_to_the_one_the_converter_writes_today(
        tmp_path: Path) -> None:
    version = tmp_path / "m00_1mb" / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text("# converted before\n")
    (version / "model.onnx").write_bytes(b"weights")
    assert harness.refresh_runtime(version)
    assert (version / "model.py").read_bytes() == harness.PYTHON_BACKEND_MODEL.read_bytes()
    assert (version / "model.onnx").read_bytes() == b"weights"  # the weights kept
    assert not harness.refresh_runtime(version)  # already today's
    assert not harness.refresh_runtime(tmp_path / "no-such-version")


def test_a_copied_model_is_served_with_todays_runtime(tmp_path: Path) -> None:
    source = tmp_path / "source"
    (source / "1" / "__pycache__").mkdir(parents=True)
    (source / "1" / "model.py").write_text("# converted before\n")
    (source / "config.pbtxt").write_text('name: "m"\n')
    target = harness.copy_model(source, tmp_path / "repo" / "m")
    assert (target / "1" / "model.py").read_bytes() == harness.PYTHON_BACKEND_MODEL.read_bytes()
    assert (target / "config.pbtxt").read_text() == 'name: "m"\n'
    assert not (target / "1" / "__pycache__").exists()
    assert (source / "1" / "model.py").read_text() == "# converted before\n"  # left as it was
