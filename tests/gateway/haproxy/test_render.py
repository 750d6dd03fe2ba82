"""The HAProxy configuration is a pure function of a snapshot: checked here without a
process (maps, runtime commands, error answers), plus ``haproxy -c`` on the result."""

from __future__ import annotations

import dataclasses
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from gateway import errors
from gateway.haproxy.process import find_haproxy, write_files
from gateway.haproxy.render import (
    LOCAL_ERRORS,
    TUNING,
    error_files,
    render,
    route_maps,
    runtime_commands,
    split,
    tuning,
)
from gateway.haproxy.snapshot import (
    Layout,
    MemberState,
    PoolState,
    RouteState,
    Snapshot,
    parse_tune,
    queue_weight,
    server_name,
)
from gateway.policy.access import key_digest
from gateway.policy.rate import RateClass
from gateway.upstream.triton_version import GrpcReuse


def _layout(tmp: Path) -> Layout:
    return Layout("127.0.0.1:18000", "127.0.0.1:18001", "127.0.0.1:18002", "127.0.0.1:18003",
                  tmp, tmp / "log.sock")


def _member(port: int, routable: bool = True, weight: int = 256) -> MemberState:
    return MemberState(server_name(f"127.0.0.1:{port + 1}"), "127.0.0.1", port, port + 1,
                       routable, weight)


def _snapshot(**changes: object) -> Snapshot:
    base = Snapshot(
        pools=(PoolState("main", (_member(9000), _member(9010))),
               PoolState("canary", (_member(9020),))),
        routes=(RouteState("resnet", (("main", 0.9), ("canary", 0.1)), 48),
                RouteState("tiny", (("main", 1.0),), 24)),
        default_route=RouteState("", (("main", 1.0),), 48),
        rate_default=RateClass(100, 200),
        rate_keys=((key_digest("batch-jobs"), RateClass(20, 20)),),
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def test_split_gives_cumulative_permille_when_canary_weights() -> None:
    pools, cuts = split(RouteState("m", (("main", 0.9), ("canary", 0.1)), 1), 3)
    assert pools == ["main", "canary", "main"]
    assert cuts == [0, 900, 1000]  # rank 2 never serves: the model has two pools


def test_route_maps_hold_every_named_model_when_rendered() -> None:
    maps = route_maps(_snapshot())
    assert maps["route0"] == {"resnet": "main", "tiny": "main"}
    assert maps["route1"] == {"resnet": "canary", "tiny": "main"}
    assert maps["cut1"] == {"resnet": "900", "tiny": "1000"}
    assert maps["limits"] == {"resnet": "48", "tiny": "24"}
    assert maps["ratekeys"] == {key_digest("batch-jobs"): "1"}  # class 0 is the default


def test_config_never_holds_a_token_or_key_when_auth_and_rate_limits_configured(
    tmp_path: Path,
) -> None:
    digest = key_digest("s3cret-token-value-123")
    snapshot = _snapshot(tokens=((digest, "predict;app"),), predict_gated=True)
    rendered = render(snapshot, _layout(tmp_path))
    text = rendered.config + "".join(str(m) for m in rendered.maps.values())
    assert "s3cret" not in text and "batch-jobs" not in text
    assert rendered.maps["tokens"] == {digest: "predict;app"}
    assert "sha2(256),hex" in rendered.config


def test_auth_rules_absent_when_predict_open(tmp_path: Path) -> None:
    config = render(_snapshot(), _layout(tmp_path)).config
    assert "tokens.map" not in config and "lacks the 'predict' scope" not in config


def test_runtime_commands_change_weights_states_and_maps_when_structure_same(
    tmp_path: Path,
) -> None:
    layout = _layout(tmp_path)
    old = _snapshot()
    main = old.pools[0]
    new = replace(
        old,
        pools=(replace(main, members=(replace(main.members[0], weight=queue_weight(3)),
                                      replace(main.members[1], routable=False))),
               old.pools[1]),
        routes=(*old.routes, RouteState("bert", (("canary", 1.0),), 12, not_ready="loading")),
    )
    commands = runtime_commands(old, new, layout)
    assert commands is not None
    first, second = main.members[0].name, main.members[1].name
    assert f"set server http_main/{first} weight 64" in commands
    assert f"set server grpc_main/{first} weight 64" in commands
    assert f"set server http_main/{second} state maint" in commands
    assert f"add map {layout.map_path('route0')} bert canary" in commands
    assert f"add map {layout.map_path('notready')} bert loading" in commands
    assert runtime_commands(new, old, layout) is not None  # and back again
    assert f"del map {layout.map_path('notready')} bert" in runtime_commands(new, old, layout)


def test_runtime_commands_ask_for_reload_when_member_added(tmp_path: Path) -> None:
    old = _snapshot()
    grown = replace(old.pools[1], members=(*old.pools[1].members, _member(9030)))
    assert runtime_commands(old, replace(old, pools=(old.pools[0], grown)),
                            _layout(tmp_path)) is None
    assert runtime_commands(old, replace(old, rate_default=RateClass(1, 1)),
                            _layout(tmp_path)) is None


def test_queue_weight_halves_share_per_queued_request() -> None:
    assert [queue_weight(q) for q in (0, 1, 3, 1000)] == [256, 128, 64, 1]


@pytest.mark.parametrize("status", sorted(LOCAL_ERRORS))
def test_error_files_use_the_error_table_when_haproxy_answers_itself(status: int) -> None:
    error, _ = LOCAL_ERRORS[status]
    files = error_files()
    http, grpc = files[f"http-{status}.http"], files[f"grpc-{status}.http"]
    assert http.startswith(f"HTTP/1.1 {errors.http_status_of(error)} ")
    assert '{"error": "' in http
    assert grpc.startswith("HTTP/1.1 200 ")  # gRPC errors travel as trailers-only 200s
    assert f"grpc-status: {errors.grpc_code_number(error)}\r\n" in grpc


def _server_lines(config: str, backend: str) -> dict[str, str]:
    sections = {block.split("\n", 1)[0]: block for block in config.split("\nbackend ")}
    lines = [line.split() for line in sections[backend].splitlines()
             if line.strip().startswith("server ")]
    return {words[1]: " ".join(words) for words in lines}


def test_grpc_connections_follow_each_members_version_when_rendered(tmp_path: Path) -> None:
    """Triton before 2.57.0 (server#8034): one request per connection (see
    ``GRPC_SERVER_REUSE``); 2.57.0 and later share; a version not read or not parseable
    counts as old. HTTP/1 members keep their connections whatever they run."""
    versions = {"old": "2.51.0", "new": "2.57.0", "dev": "2.60.0dev", "junk": "next",
                "unread": None}
    members = tuple(replace(_member(9000 + 10 * i), name=name, triton_version=version)
                    for i, (name, version) in enumerate(versions.items()))
    config = render(_snapshot(pools=(PoolState("main", members),)), _layout(tmp_path)).config
    grpc, http = _server_lines(config, "grpc_main"), _server_lines(config, "http_main")
    per_request = {name for name, line in grpc.items() if " max-reuse 0 " in line}
    assert per_request == {"old", "junk", "unread"}
    assert all(" proto h2 " in line for line in grpc.values())
    assert http.keys() == grpc.keys() and not any("max-reuse" in s for s in http.values())


@pytest.mark.parametrize(("setting", "per_request"), [
    (GrpcReuse.SHARED, set()), (GrpcReuse.PER_REQUEST, {"old", "new"}),
    (GrpcReuse.AUTO, {"old"})])
def test_layout_setting_overrides_versions_when_rendered(
        tmp_path: Path, setting: GrpcReuse, per_request: set[str]) -> None:
    members = (replace(_member(9000), name="old", triton_version="2.51.0"),
               replace(_member(9010), name="new", triton_version="2.57.1"))
    layout = dataclasses.replace(_layout(tmp_path), grpc_upstream_reuse=setting)
    config = render(_snapshot(pools=(PoolState("main", members),)), layout).config
    grpc = _server_lines(config, "grpc_main")
    assert {n for n, line in grpc.items() if " max-reuse 0 " in line} == per_request


def test_member_restarted_on_another_version_needs_a_reload_when_moved(tmp_path: Path) -> None:
    """max-reuse is no runtime-API setting: a mode change is structural (a seamless
    reload); a new patch release of an already fixed Triton changes nothing."""
    layout = _layout(tmp_path)

    def on(version: str | None) -> Snapshot:
        return _snapshot(pools=(PoolState("main", (replace(_member(9000),
                                                           triton_version=version),)),))
    assert runtime_commands(on("2.51.0"), on("2.57.0"), layout) is None
    assert runtime_commands(on("2.57.0"), on(None), layout) is None
    assert runtime_commands(on("2.57.0"), on("2.58.0"), layout) == []
    shared = dataclasses.replace(layout, grpc_upstream_reuse=GrpcReuse.SHARED)
    assert runtime_commands(on("2.51.0"), on("2.57.0"), shared) == []


def test_rendered_config_passes_haproxy_check_when_written(tmp_path: Path) -> None:
    binary = find_haproxy()
    assert binary is not None, "make test installs Debian's haproxy"
    snapshot = _snapshot(tokens=((key_digest("x" * 20), "predict;a"),), predict_gated=True,
                         pools=(*_snapshot().pools, PoolState("empty", ())))
    layout = _layout(tmp_path)
    write_files(render(snapshot, layout), layout)
    result = subprocess.run([binary, "-c", "-f", str(layout.config_path)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_snapshot_survives_its_wire_form_when_published_to_replicas() -> None:
    import json

    from gateway.haproxy.snapshot import snapshot_from_dict, snapshot_to_dict, snapshot_version

    snapshot = _snapshot(tokens=((key_digest("t" * 20), "predict;app"),), predict_gated=True)
    wire = json.loads(json.dumps(snapshot_to_dict(snapshot)))
    assert snapshot_from_dict(wire) == snapshot
    assert snapshot_version(snapshot_from_dict(wire)) == snapshot_version(snapshot)
    assert snapshot_version(replace(snapshot, predict_gated=False)) != snapshot_version(snapshot)
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


def test_layout_tune_settings_land_in_global_over_the_defaults_when_rendered(
        tmp_path: Path) -> None:
    layout = dataclasses.replace(_layout(tmp_path), tune=(("tune.bufsize", "65536"),
                                                          ("tune.h2.initial-window-size",
                                                           "1048576")))
    config = render(_snapshot(), layout).config
    global_section = config.split("\n\n", 1)[0]
    assert "  tune.bufsize 65536\n" in global_section
    assert "  tune.h2.initial-window-size 1048576" in global_section
    assert tuning(layout) == {**TUNING, "tune.bufsize": "65536",
                              "tune.h2.initial-window-size": "1048576"}
    binary = find_haproxy()
    assert binary is not None
    write_files(render(_snapshot(), layout), layout)
    checked = subprocess.run([binary, "-c", "-f", str(layout.config_path)],
                             capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stderr


def test_write_files_writes_only_what_changed_when_given_the_last_set(tmp_path: Path) -> None:
    layout = _layout(tmp_path)
    first = render(_snapshot(), layout)
    assert write_files(first, layout) == len(first.error_files) + len(first.maps) + 1
    assert write_files(first, layout, first) == 0
    heavier = _snapshot(pools=(PoolState("main", (_member(9000, weight=3), _member(9010))),
                               PoolState("canary", (_member(9020),))))
    second = render(heavier, layout)
    assert write_files(second, layout, first) == 1  # the config (a weight): nothing else
    assert layout.config_path.read_text() == second.config
    renamed = render(_snapshot(routes=(RouteState("other", (("main", 1.0),), 5),)), layout)
    assert write_files(renamed, layout, second) >= 2  # the maps and the config
    assert "other" in layout.map_path("route0").read_text()
