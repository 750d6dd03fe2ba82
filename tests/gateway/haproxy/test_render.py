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
    error_files,
    render,
    route_maps,
    runtime_commands,
    split,
)
from gateway.haproxy.snapshot import (
    Layout,
    MemberState,
    PoolState,
    RateClass,
    RouteState,
    Snapshot,
    key_digest,
    queue_weight,
    server_name,
)


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


def test_grpc_members_take_one_request_per_connection_when_rendered(tmp_path: Path) -> None:
    """Triton 2.51's repeated trailers after an unparseable message end the whole backend
    connection; nothing else may share it (see ``GRPC_SERVER_REUSE``). HTTP/1 members keep
    their connections."""
    config = render(_snapshot(), _layout(tmp_path)).config
    sections = {block.split("\n", 1)[0]: block for block in config.split("\nbackend ")}
    for pool in ("main", "canary"):
        grpc_servers = [line for line in sections[f"grpc_{pool}"].splitlines()
                        if line.strip().startswith("server ")]
        http_servers = [line for line in sections[f"http_{pool}"].splitlines()
                        if line.strip().startswith("server ")]
        assert grpc_servers and all(" proto h2 max-reuse 0 " in s for s in grpc_servers)
        assert http_servers and not any("max-reuse" in s for s in http_servers)


def test_grpc_members_share_connections_when_the_layout_allows(tmp_path: Path) -> None:
    """--grpc-upstream-reuse (a Triton with server#8078's fix): no per-request connection."""
    layout = dataclasses.replace(_layout(tmp_path), grpc_upstream_reuse=True)
    config = render(_snapshot(), layout).config
    servers = [line for line in config.splitlines() if line.strip().startswith("server ")
               and " proto h2 " in line and "127.0.0.1:1800" not in line]
    assert servers and not any("max-reuse" in s for s in servers)


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
