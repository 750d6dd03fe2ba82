"""Headless locust runs against a real stack (Triton + gateway): reports are written and
the SLO verdict decides the exit status, both ways. About 10 s in all.

Each run goes through one data plane, each plane carries at least one run. What is
checked here is locust's side (its clients, reports, the SLO verdict and the exit status
it sets), which reads what locust measured and not which plane answered. What a plane
must answer to these clients is held on both planes elsewhere, against the same session
gateway: gRPC and binary HTTP inference (tests/gateway/test_protocol.py, test_parity.py)
and an unknown model's errors, metadata included (test_protocol.py's
test_gateway_error_matches_triton_when_bad_request)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from loadtests.run import LoadTestSettings, locust_command, run_one
from tests.procs import GatewayProcess

pytestmark = pytest.mark.integration

# locust.stats.CSV_STATS_INTERVAL_SEC, locust 2.47 (not imported: importing locust
# monkey-patches the test process with gevent).
CSV_STATS_INTERVAL_SEC = 1.0
DURATION_S = 2.0  # two CSV intervals: the lag below is checked against at least one


def settings(
    gateway: GatewayProcess, out: Path, protocol: str, **overrides: object
) -> LoadTestSettings:
    base: dict[str, object] = dict(
        protocols=(protocol,), scenario="steady", http=gateway.http_url, grpc=gateway.grpc_url,
        users=2, duration_s=DURATION_S, spawn_rate=2.0, models="efficientnet_lite0", batch_size=1,
        slo_p99_ms=30_000.0, slo_max_error_rate=0.5, out=out,
    )
    base.update(overrides)
    return LoadTestSettings(**base)  # type: ignore[arg-type]


def aggregated_row(directory: Path) -> dict[str, str]:
    with (directory / "locust_stats.csv").open() as f:
        return next(r for r in csv.DictReader(f) if r["Name"] == "Aggregated")


@pytest.mark.parametrize("gateway", ["haproxy"], indirect=True)
def test_locust_grpc_run_passes_and_writes_reports_when_slo_is_generous(
    gateway: GatewayProcess, tmp_path: Path
) -> None:
    result = run_one(settings(gateway, tmp_path, "grpc"), "grpc")
    assert result.exit_code == 0
    verdict = result.verdict()
    assert verdict is not None and verdict["passed"] is True
    row = aggregated_row(result.directory)
    assert int(row["Request Count"]) > 0 and int(row["Failure Count"]) == 0
    # The verdict is judged on locust's final statistics; its CSV writer rewrites the file
    # every CSV_STATS_INTERVAL_SEC, so the CSV may miss the requests of the run's last
    # interval (and what the users finished as they stopped), never more.
    judged = int(verdict["summary"]["requests"])  # type: ignore[index]
    per_s = judged / DURATION_S
    lag = judged - int(row["Request Count"])
    assert 0 <= lag <= per_s * CSV_STATS_INTERVAL_SEC + 2, (judged, row["Request Count"])
    assert (result.directory / "report.html").stat().st_size > 10_000
    assert (result.directory / "locust_verdict.md").read_text().startswith("**SLO verdict: PASS")


@pytest.mark.parametrize("gateway", ["python"], indirect=True)
def test_locust_http_binary_run_fails_when_p99_slo_is_impossible(
    gateway: GatewayProcess, tmp_path: Path
) -> None:
    result = run_one(settings(gateway, tmp_path, "http-binary", slo_p99_ms=0.001), "http-binary")
    assert result.exit_code == 1
    verdict = result.verdict()
    assert verdict is not None and verdict["passed"] is False
    assert verdict["summary"]["failures"] == 0  # type: ignore[index]
    assert [v for v in verdict["violations"] if "p99" in v]  # type: ignore[union-attr]


@pytest.mark.parametrize("gateway", ["haproxy"], indirect=True)
def test_locust_http_json_run_fails_on_error_rate_when_the_model_is_unknown(
    gateway: GatewayProcess, tmp_path: Path
) -> None:
    # A model the gateway does not serve: every request fails (metadata lookup included),
    # latency is tiny, so only the error-rate limit can fail the run.
    result = run_one(
        settings(gateway, tmp_path, "http-json", models="no_such_model",
                 slo_max_error_rate=0.01),
        "http-json",
    )
    assert result.exit_code == 1
    verdict = json.loads((result.directory / "locust_verdict.json").read_text())
    assert verdict["summary"]["requests"] > 0
    assert verdict["summary"]["error_rate"] == 1.0
    assert [v for v in verdict["violations"] if "error rate" in v]


def test_locust_command_selects_the_scenario_shape_file(tmp_path: Path) -> None:
    s = LoadTestSettings(("grpc",), "spike", "h:1", "h:2", 3, 5.0, 1.0, "m", 1, 1.0, 0.1, tmp_path)
    cmd = locust_command(s, "grpc", tmp_path)
    files = cmd[cmd.index("-f") + 1].split(",")
    assert files[0].endswith("locustfile_grpc.py") and files[1].endswith("scenarios/spike.py")
    assert all(Path(f).is_file() for f in files)
