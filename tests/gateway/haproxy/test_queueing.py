"""gateway/policy/queueing.py rendered for HAProxy (gateway/haproxy/queueing.py), without
a process: slots and the queue's bound only on pools that queue in the gateway, the
priority rules only with tenants, the fairness costs in the policy's integers, the
queue's wait read back from the log line."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from prometheus_client import CollectorRegistry

from gateway.haproxy import queueing as rendered
from gateway.haproxy.changes import runtime_commands
from gateway.haproxy.config import render_config
from gateway.haproxy.maps import route_maps
from gateway.haproxy.snapshot import (
    Layout,
    MemberState,
    PoolState,
    RouteState,
    Snapshot,
    TenancyState,
    TenantState,
)
from gateway.haproxy.telemetry import RequestLog
from gateway.metrics import create_metrics
from gateway.policy import queueing

LAYOUT = Layout("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4", Path("/run/x"),
                "127.0.0.1:5")
MEMBER = MemberState("m1", "10.0.0.1", 8000, 8001, True)
TENANCY = TenancyState(tenants=(TenantState("default", "standard"),
                                TenantState("app", "critical", weight=4.0)))


def _snapshot(slots: int, tenancy: TenancyState | None = TENANCY, lane: int = 0) -> Snapshot:
    return Snapshot(pools=(PoolState("p", (MEMBER,), capacity=4, member_slots=slots,
                                     max_wait_ms=700 if slots else 0, lane_slots=lane),),
                    routes=(RouteState("m", (("p", 1.0),), 12),), tenancy=tenancy)


def test_pool_without_gateway_queue_renders_no_cap_no_priority() -> None:
    config = render_config(_snapshot(0), LAYOUT)
    assert "maxconn" not in config and "set-priority" not in config
    assert "timeout queue 700ms" not in config


def _backend(config: str, name: str) -> list[str]:
    lines = config.splitlines()
    start = lines.index(f"backend {name}")
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith("  ")),
               len(lines))
    return lines[start + 1:end]


def test_queued_pool_caps_each_server_and_bounds_the_wait() -> None:
    config = render_config(_snapshot(4), LAYOUT)
    for name in ("http_p", "grpc_p"):
        body = _backend(config, name)
        assert [line for line in body if line.startswith("  server m1 ")][0].find(
            " maxconn 4") > 0, body
        assert "  timeout queue 700ms" in body
    assert "set-status 504 if { status 503 } !{ srv_id -m found } { nbsrv gt 0 }" in config
    assert "at most 700 ms" in config


def test_large_grpc_messages_and_pinned_ones_never_wait_in_the_queue() -> None:
    """A queued gRPC stream whose buffer is full stalls its whole client connection in
    HAProxy 2.6: a message above half a buffer goes to the uncapped twin."""
    config = render_config(_snapshot(4), LAYOUT)
    limit = rendered.bypass_limit(rendered.DEFAULT_BUFSIZE)
    assert ("http-request set-var(req.nq) int(1) if "
            f"{{ var(txn.glen) -m int gt {limit} }} {{ var(txn.pool) -m str p }} "
            "{ var(req.inf) -m found }") in config
    lines = config.splitlines()
    bypass = lines.index("  use_backend grpc_%[var(txn.pool)].nq if { var(req.nq) -m found }")
    assert lines[bypass + 1] == "  use_backend grpc_%[var(txn.pool)] if { var(txn.pool) -m found }"
    for twin in ("grpc_p.nq", "grpc_p.pin"):
        body = _backend(config, twin)
        assert not any("maxconn" in line or "timeout queue" in line for line in body), body
        assert any(line.startswith("  server m1 10.0.0.1:8001 track grpc_p/m1") for line in body)
    assert "be_conn(grpc_p.nq),add(txn.pl)" in config  # its requests are the pool's load
    assert ".nq" not in render_config(_snapshot(0), LAYOUT)


def test_the_lane_is_a_capped_twin_taken_by_light_tenants_while_the_pool_is_full() -> None:
    config = render_config(_snapshot(4, lane=2), LAYOUT)
    lines = config.splitlines()
    for proto, port in (("http", 8000), ("grpc", 8001)):
        body = _backend(config, f"{proto}_p.lane")
        assert f"  server m1 10.0.0.1:{port} track {proto}_p/m1 weight 256 maxconn 2" in \
            [line.split(" proto h2")[0] for line in body], body
        assert "  timeout queue 700ms" in body  # a race into its queue is bounded alike
        rule = (f"  use_backend {proto}_p.lane if {{ var(req.ql) -m int le 2 }} "
                f"{{ var(txn.pool) -m str p }} {{ be_conn_free({proto}_p) eq 0 }} "
                f"{{ be_conn_free({proto}_p.lane) gt 0 }}")
        at = lines.index(rule)  # after the large messages' twin, before the pool
        assert lines[at + 1] == (f"  use_backend {proto}_%[var(txn.pool)] if "
                                 "{ var(txn.pool) -m found }")
        assert f"be_conn({proto}_p.lane),add(txn.pl)" in config  # the pool's load
    assert lines.index("  use_backend grpc_%[var(txn.pool)].nq if { var(req.nq) -m found }") \
        < lines.index(rule)
    # the tenant's requests here, itself counted, for standard requests only
    assert ("set-var(req.ql) sc1_conn_cur",
            "has_class { var(txn.tc) -m str standard }") in \
        rendered.priority_rules(_snapshot(4, lane=2))
    for without in (_snapshot(4), _snapshot(0, lane=2)):
        assert ".lane" not in render_config(without, LAYOUT)
    # without tenants nobody takes it (its twins stay: tenants may come live)
    assert "req.ql" not in render_config(_snapshot(4, tenancy=None, lane=2), LAYOUT)


def test_priority_rules_follow_the_policys_ranks_only_with_tenants() -> None:
    rules = rendered.priority_rules(_snapshot(4))
    classes = {cond.split()[-2]: action for action, cond in rules if "priority-class" in action}
    assert classes == {k.value: f"set-priority-class int({r})"
                       for k, r in queueing.CLASS_RANK.items()}
    assert ("set-var(req.qo) sc1_conn_cur,sub(1),mul(req.qc),div(1000)", "has_class") in rules
    assert rendered.priority_rules(_snapshot(4, tenancy=None)) == []


def test_qcost_map_holds_the_policys_cost_per_tenant() -> None:
    maps = route_maps(_snapshot(4))
    assert maps["qcost"] == {"default": str(queueing.cost_us(1.0)),
                             "app": str(queueing.cost_us(4.0))}
    assert maps["queued"] == {"0": queueing.NO_MEMBER, "1": queueing.QUEUE_EXPIRED}


def test_log_lines_queue_wait_is_the_tenants_histogram() -> None:
    metrics = create_metrics(CollectorRegistry())
    log = RequestLog(metrics)
    log.record("m p http 200 - 12 - -- app critical - - 9", count=2)
    log.record("m p http 429 - 0 rejected -- app critical saturated - -1")
    child = metrics.tenant_queue_wait.labels("app", "critical")
    samples = {s.name: s.value for s in child.collect()[0].samples
               if s.labels.get("le") in (None, "0.01")}
    assert samples["infergate_tenant_queue_wait_seconds_count"] == 2
    assert samples["infergate_tenant_queue_wait_seconds_sum"] == 0.018


def test_a_weight_change_reaches_the_twins_live() -> None:
    before = _snapshot(4)
    member = dataclasses.replace(MEMBER, weight=37)
    after = dataclasses.replace(before, pools=(dataclasses.replace(before.pools[0],
                                                                   members=(member,)),))
    commands = runtime_commands(before, after, LAYOUT)
    assert commands is not None and "set server grpc_p.nq/m1 weight 37" in commands
    laned = _snapshot(4, lane=1)
    commands = runtime_commands(laned, dataclasses.replace(
        laned, pools=(dataclasses.replace(laned.pools[0], members=(member,)),)), LAYOUT)
    assert commands is not None
    assert {"set server http_p.lane/m1 weight 37", "set server grpc_p.lane/m1 weight 37"} \
        <= set(commands)
    assert runtime_commands(before, laned, LAYOUT) is None  # a lane added: a reload
    slower = dataclasses.replace(before, pools=(dataclasses.replace(before.pools[0],
                                                                    max_wait_ms=900),))
    assert runtime_commands(before, slower, LAYOUT) is None  # the queue's bound: a reload
