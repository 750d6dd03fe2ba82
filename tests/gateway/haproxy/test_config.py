"""The configuration text (``gateway/haproxy/config.py``): behaviours across snapshots
and layouts. Whole configurations, checked by ``haproxy -c``: ``test_golden.py``."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from pathlib import Path

import pytest

from gateway.haproxy import config
from gateway.haproxy.config import TUNING, render_config, tuning
from gateway.haproxy.snapshot import PoolState, TenancyState, TenantState
from gateway.policy.tenancy import REASONS, refusal_waits_ms
from gateway.upstream.triton_version import GrpcReuse
from tests.gateway.haproxy.conftest import layout_in, member, snapshot


def test_auth_rules_absent_when_predict_open_with_rate_limits(tmp_path: Path) -> None:
    """Rate limits ask for the caller's key, but only gated predict checks it."""
    text = render_config(snapshot(), layout_in(tmp_path))
    assert "track-sc2 var(req.kd) table rate0" in text
    assert "tokens.map" not in text and "lacks the 'predict' scope" not in text


def _server_lines(text: str, backend: str) -> dict[str, str]:
    sections = {block.split("\n", 1)[0]: block for block in text.split("\nbackend ")}
    lines = [line.split() for line in sections[backend].splitlines()
             if line.strip().startswith("server ")]
    return {words[1]: " ".join(words) for words in lines}


def test_grpc_connections_follow_each_members_version_when_rendered(tmp_path: Path) -> None:
    """Triton before 2.57.0 (server#8034): one request per connection (see
    ``GRPC_SERVER_REUSE``); 2.57.0 and later share; a version not read or not parseable
    counts as old. HTTP/1 members keep their connections whatever they run."""
    versions = {"old": "2.51.0", "new": "2.57.0", "dev": "2.60.0dev", "junk": "next",
                "unread": None}
    members = tuple(replace(member(9000 + 10 * i), name=name, triton_version=version)
                    for i, (name, version) in enumerate(versions.items()))
    text = render_config(snapshot(pools=(PoolState("main", members),)), layout_in(tmp_path))
    grpc, http = _server_lines(text, "grpc_main"), _server_lines(text, "http_main")
    per_request = {name for name, line in grpc.items() if " max-reuse 0 " in line}
    assert per_request == {"old", "junk", "unread"}
    assert all(" proto h2 " in line for line in grpc.values())
    assert http.keys() == grpc.keys() and not any("max-reuse" in s for s in http.values())


@pytest.mark.parametrize(("setting", "per_request"), [
    (GrpcReuse.SHARED, set()), (GrpcReuse.PER_REQUEST, {"old", "new"}),
    (GrpcReuse.AUTO, {"old"})])
def test_layout_setting_overrides_versions_when_rendered(
        tmp_path: Path, setting: GrpcReuse, per_request: set[str]) -> None:
    members = (replace(member(9000), name="old", triton_version="2.51.0"),
               replace(member(9010), name="new", triton_version="2.57.1"))
    layout = dataclasses.replace(layout_in(tmp_path), grpc_upstream_reuse=setting)
    text = render_config(snapshot(pools=(PoolState("main", members),)), layout)
    grpc = _server_lines(text, "grpc_main")
    assert {n for n, line in grpc.items() if " max-reuse 0 " in line} == per_request


def test_layout_tune_settings_override_the_defaults_key_by_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lines in ``global``, checked by ``haproxy -c``: ``test_golden.py``
    (``versions``)."""
    layout = dataclasses.replace(layout_in(tmp_path), tune=(("tune.bufsize", "65536"),
                                                            ("tune.h2.initial-window-size",
                                                             "1048576")))
    assert tuning(layout) == {**TUNING, "tune.bufsize": "65536",
                              "tune.h2.initial-window-size": "1048576"}
    monkeypatch.setattr(config, "TUNING", {"tune.bufsize": "16384", "tune.maxrewrite": "1024"})
    assert tuning(layout) == {"tune.bufsize": "65536", "tune.maxrewrite": "1024",
                              "tune.h2.initial-window-size": "1048576"}
    global_section = render_config(snapshot(), layout).split("\n\n", 1)[0]
    assert global_section.count("tune.bufsize") == 1
    assert "  tune.bufsize 65536\n" in global_section
    assert "  tune.maxrewrite 1024\n" in global_section


def test_tenancy_refusals_are_tarpitted_for_the_delay_or_answered_at_once_without_one(
        tmp_path: Path) -> None:
    """``tenancy.refusal_delay_ms``: a refusal whose deadline has room for the delay
    within 9/10 of it (in integers: deadline x 9 - delay x 10 >= 0) ends the frontend's
    rules (``allow``) and goes to the backend whose ``timeout tarpit`` is its wait, one
    per wait the rule gives (the delay, then each step of 50 ms up to 1 s), where each
    reason is tarpitted with its own answer; else it is answered at once; 0: no tarpit
    at all. One set of refusal rules serves the three reasons: each reason's own rule
    only names it (``txn.why``)."""
    rules = TenancyState(tenants=(TenantState("default", "standard", max_in_flight=2),),
                         refusal_delay_ms=80)
    text = render_config(snapshot(tenancy=rules), layout_in(tmp_path))
    assert "timeout tarpit" not in text.split("\nbackend ", 1)[0]  # no frontend's
    assert "set-var(req.tp) var(txn.dl),mul(9),sub(800)" in text
    allows = [line for line in text.splitlines() if "http-request allow " in line]
    assert len(allows) == 2  # one for the three reasons, two protocols
    assert all("{ var(txn.why) -m found } { var(req.tp) -m int ge 0 } { var(req.inf) -m found }"
               in line for line in allows)
    for reason in REASONS:
        named = [line for line in text.splitlines()
                 if f"http-request set-var(txn.why) str({reason}) " in line]
        assert len(named) == 2 and all(" !{ var(txn.why) -m found } " in line for line in named)
    waits = refusal_waits_ms(80)
    assert waits[:2] == (80, 100) and waits[-1] == 1000
    for proto in ("http", "grpc"):
        assert (f"  use_backend refuse_{proto}_%[var(req.rw)] if {{ var(req.rw) -m found }}"
                in text)
        for ms in waits:
            section = text.split(f"\nbackend refuse_{proto}_{ms}\n", 1)[1].split("\n\n")[0]
            assert section.startswith(f"  timeout tarpit {ms}ms\n"), section
            tarpits = section.splitlines()[1:]
            assert [line.rsplit(" if ", 1)[1] for line in tarpits] == [
                f"{{ var(txn.why) -m str {reason} }}" for reason in REASONS]
            assert all(" hdr retry-after 1" in line for line in tarpits)
            assert all(("hdr grpc-status 8 hdr grpc-message" in line) == (proto == "grpc")
                       for line in tarpits)
    assert f"backend refuse_http_{waits[-1] + 50}" not in text
    off = render_config(snapshot(tenancy=replace(rules, refusal_delay_ms=0)),
                        layout_in(tmp_path))
    assert "tarpit" not in off and "st_delay" not in off
