"""What :func:`gateway.haproxy.render.render` gives a fresh HAProxy, as a whole (its
parts: ``test_config.py``, ``test_maps.py``, ``test_answers.py``; whole renderings:
``test_golden.py``), the snapshot it renders from (``gateway/haproxy/snapshot.py``) and
writing the result to disk (``gateway.haproxy.process.write_files``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gateway.haproxy.process import write_files
from gateway.haproxy.render import render
from gateway.haproxy.snapshot import (
    PoolState,
    RouteState,
    parse_tune,
)
from gateway.policy.access import key_digest
from tests.gateway.haproxy.conftest import layout_in, member, snapshot


def test_config_never_holds_a_token_or_key_when_auth_and_rate_limits_configured(
    tmp_path: Path,
) -> None:
    digest = key_digest("s3cret-token-value-123")
    gated = snapshot(tokens=((digest, "predict;app"),), predict_gated=True)
    rendered = render(gated, layout_in(tmp_path))
    text = rendered.config + "".join(str(m) for m in rendered.maps.values())
    assert "s3cret" not in text and "batch-jobs" not in text
    assert rendered.maps["tokens"] == {digest: "predict;app"}


def test_snapshot_survives_its_wire_form_when_published_to_replicas() -> None:
    import json

    from gateway.haproxy.snapshot import snapshot_from_dict, snapshot_to_dict, snapshot_version

    gated = snapshot(tokens=((key_digest("t" * 20), "predict;app"),), predict_gated=True)
    wire = json.loads(json.dumps(snapshot_to_dict(gated)))
    assert snapshot_from_dict(wire) == gated
    assert snapshot_version(snapshot_from_dict(wire)) == snapshot_version(gated)
    assert snapshot_version(replace(gated, predict_gated=False)) != snapshot_version(gated)
    with pytest.raises(ValueError, match="malformed"):
        snapshot_from_dict({"pools": [{"name": "p"}]})


@pytest.mark.parametrize(("text", "parsed"), [
    ("tune.bufsize=65536", ("tune.bufsize", "65536")),
    ("tune.h2.initial-window-size 1048576", ("tune.h2.initial-window-size", "1048576")),
    (" tune.sched.low-latency=on ", ("tune.sched.low-latency", "on"))])
def test_parse_tune_reads_one_setting_when_well_formed(text: str,
                                                       parsed: tuple[str, str]) -> None:
    assert parse_tune(text) == parsed


@pytest.mark.parametrize("text", [
    "bufsize=1", "tune.bufsize", "tune.bufsize=", "tune.bufsize=1\n  nbthread 8",
    "tune.bufsize=1 2", "maxconn=10", "tune.bufsize=$(reboot)", "TUNE.bufsize=1"])
def test_parse_tune_refuses_anything_but_one_tune_setting(text: str) -> None:
    with pytest.raises(ValueError, match="tune.KEY=VALUE"):
        parse_tune(text)


def test_write_files_writes_only_what_changed_when_given_the_last_set(tmp_path: Path) -> None:
    layout = layout_in(tmp_path)
    first = render(snapshot(), layout)
    assert write_files(first, layout) == (len(first.error_files) + len(first.maps)
                                          + len(first.lua) + 1)
    assert (tmp_path / "grpc_fields.lua").read_text() == first.lua["grpc_fields.lua"]
    assert write_files(first, layout, first) == 0
    heavier = snapshot(pools=(PoolState("main", (member(9000, weight=3), member(9010))),
                              PoolState("canary", (member(9020),))))
    second = render(heavier, layout)
    assert write_files(second, layout, first) == 1  # the config (a weight): nothing else
    assert layout.config_path.read_text() == second.config
    renamed = render(snapshot(routes=(RouteState("other", (("main", 1.0),), 5),)), layout)
    assert write_files(renamed, layout, second) >= 2  # the maps and the config
    assert "other" in layout.map_path("route0").read_text()
