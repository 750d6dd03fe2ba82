"""Which members share gRPC connections: decided from the Triton version each reports."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from gateway.metrics import create_metrics
from gateway.upstream.triton_version import (
    GrpcReuse,
    VersionWatch,
    grpc_mode,
    has_fix,
    parse_version,
    version_from_metadata,
)
from infergate.triton.local import LocalTriton
from tests.gateway.conftest import tiny_infers_over_grpc
from tests.procs import pools_yaml, run_gateway, wait_until


@pytest.mark.parametrize(("text", "parsed"), [
    ("2.51.0", (2, 51, 0)), ("2.57.0", (2, 57, 0)), ("v2.60", (2, 60, 0)),
    ("2.58.0dev", (2, 58, 0)), (" 3.0.1 ", (3, 0, 1)), ("2", None), ("", None), (None, None),
    ("latest", None), ("2.x.0", None), ("1.2.3.4", None)])
def test_parse_version_when_triton_reports_text(text: str | None,
                                                parsed: tuple[int, int, int] | None) -> None:
    assert parse_version(text) == parsed


@pytest.mark.parametrize(("version", "shared"), [
    ("2.51.0", False), ("2.56.9", False), ("2.57.0", True), ("2.57.1", True),
    ("2.100.0", True), ("3.0.0", True), ("1.99.0", False),
    (None, False),  # the metadata call failed: not proven fixed
    ("nightly", False)])  # unparseable: not proven fixed
def test_auto_shares_only_with_a_fixed_triton_when_decided(version: str | None,
                                                            shared: bool) -> None:
    mode = grpc_mode(version, GrpcReuse.AUTO)
    assert mode.shared is shared and has_fix(version) is shared
    assert mode.label == ("shared" if shared else "per_request")
    assert ("8034" in mode.why) is (parse_version(version) is not None)


@pytest.mark.parametrize("version", ["2.51.0", "2.57.0", None, "nightly"])
def test_setting_overrides_the_version_both_ways_when_decided(version: str | None) -> None:
    assert grpc_mode(version, GrpcReuse.SHARED).shared
    assert not grpc_mode(version, GrpcReuse.PER_REQUEST).shared


@pytest.mark.parametrize(("body", "version"), [
    ({"name": "triton", "version": "2.51.0", "extensions": []}, "2.51.0"),
    ({"name": "triton"}, None), ({"version": 251}, None), ({"version": ""}, None),
    ([], None), ("2.51.0", None)])
def test_version_from_metadata_when_answers_vary(body: object, version: str | None) -> None:
    assert version_from_metadata(body) == version


def _info(registry: CollectorRegistry) -> dict[tuple[str, ...], float]:
    family = next(f for f in registry.collect() if f.name == "infergate_member_info")
    return {tuple(s.labels[k] for k in ("pool", "member", "version", "grpc_connections")):
            s.value for s in family.samples}


def test_watch_warns_once_per_change_and_keeps_one_gauge_series_when_members_restart(
        caplog: pytest.LogCaptureFixture) -> None:
    metrics = create_metrics()
    watch = VersionWatch(metrics.member_info, GrpcReuse.AUTO)
    caplog.set_level(logging.INFO, logger="gateway.upstream.triton_version")
    watch.observe([("p", "a:1", "2.51.0"), ("p", "b:1", "2.57.0")])
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "p/a:1" in warnings[0] and "server#8034" in warnings[0]
    assert "2.57.0" in warnings[0] and "one per connection" in warnings[0]
    assert _info(metrics.registry) == {("p", "a:1", "2.51.0", "per_request"): 1.0,
                                       ("p", "b:1", "2.57.0", "shared"): 1.0}
    caplog.clear()
    watch.observe([("p", "a:1", "2.51.0"), ("p", "b:1", "2.57.0")])  # nothing changed
    assert not caplog.records
    # a restarted on the fixed release, b's metadata call failed this round
    watch.observe([("p", "a:1", "2.58.0"), ("p", "b:1", None)])
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "p/b:1" in warnings[0] and "unknown" in warnings[0]
    assert _info(metrics.registry) == {("p", "a:1", "2.58.0", "shared"): 1.0,
                                       ("p", "b:1", "unknown", "per_request"): 1.0}
    watch.forget({("p", "a:1")})
    assert _info(metrics.registry) == {("p", "a:1", "2.58.0", "shared"): 1.0}


def test_watch_says_a_forced_share_is_a_risk_when_the_member_is_old(
        caplog: pytest.LogCaptureFixture) -> None:
    watch = VersionWatch(create_metrics().member_info, GrpcReuse.SHARED)
    with caplog.at_level(logging.WARNING, logger="gateway.upstream.triton_version"):
        watch.observe([("p", "a:1", "2.51.0")])
    [message] = [r.getMessage() for r in caplog.records]
    assert "share connections anyway" in message and "can crash it" in message


# -- through real gateways in front of this machine's Triton (2.51) ---------------------

def _member_info(http_url: str) -> dict[tuple[str, str], float]:
    text = httpx.get(f"http://{http_url}/metrics").text
    return {(s.labels["version"], s.labels["grpc_connections"]): s.value
            for family in text_string_to_metric_families(text)
            if family.name == "infergate_member_info" for s in family.samples}


def _grpc_server_lines(run_dir: Path) -> list[str]:
    config = (run_dir / "haproxy.cfg").read_text()
    return [line for line in config.splitlines()
            if line.strip().startswith("server ") and " proto h2 " in line
            and "control" not in line]


@pytest.mark.integration
@pytest.mark.parametrize(("setting", "mode"), [
    (None, "per_request"),  # auto: the member reports 2.51.0
    ("shared", "shared")])
def test_gateway_decides_from_the_members_reported_version_when_serving(
        triton: LocalTriton, tmp_path: Path, setting: str | None, mode: str) -> None:
    assert triton.endpoints is not None
    version = httpx.get(f"http://{triton.endpoints.http_url}/v2").json()["version"]
    pools = pools_yaml(tmp_path / "pools.yaml", {"local": [triton.endpoints]})
    args = ("--grpc-upstream-reuse", setting) if setting else ()
    with run_gateway(pools, tmp_path, *args, data_plane="haproxy") as gateway:
        assert wait_until(lambda: _member_info(gateway.http_url) == {(version, mode): 1.0},
                          10), _member_info(gateway.http_url)
        servers = _grpc_server_lines(tmp_path / f"haproxy-{gateway.http_port}")
        # the pool's gRPC backend and its pin twin (rollouts), both in the member's mode
        assert servers and all(("max-reuse 0" in line) is (mode == "per_request")
                               for line in servers), servers
        assert tiny_infers_over_grpc(gateway.grpc_url)
    said = gateway.log.read_text()
    assert f"runs Triton {version}" in said and "server#8034" in said
    assert ("share connections anyway" in said) is (mode == "shared")
