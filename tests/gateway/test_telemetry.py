"""The gateway's telemetry: the rollout's tally, and HAProxy's counts read once for the
controller and the agent."""

from __future__ import annotations

from gateway.telemetry import VersionTally, read_haproxy

STATS = """# pxname,svname,qcur,qmax,scur,smax,slim,stot,bin,bout,dreq,dresp,ereq,econ,eresp
http_p,FRONTEND,,,1,1,,,,,,,,,
http_p,10.0.0.1_8001,0,0,2,2,,,,,,,,1,0
http_p,BACKEND,3,3,2,2,,,,,,,,1,0
grpc_p,10.0.0.1_8001,0,0,1,1,,,,,,,,0,2
grpc_p,BACKEND,1,1,1,1,,,,,,,,0,2
stats,FRONTEND,,,1,1,,,,,,,,,
"""
ROUTES = """# table: st_route, type: string, size:1000, used:3
0x1: key=m/p/gold use=0 exp=0 shard=0 conn_cur=2 http_req_rate(2000)=5
0x2: key=m/p/default use=0 exp=0 shard=0 conn_cur=1 http_req_rate(2000)=1
0x3: key=n/p/idle use=0 exp=0 shard=0 conn_cur=0 http_req_rate(2000)=0
"""


def test_haproxy_counts_strip_the_tenant_from_routes_and_note_the_active_ones() -> None:
    counts = read_haproxy(STATS, ROUTES, tenancy_rules=True)
    assert counts.held == {"p": 3} and counts.queued == {"p": 4}
    assert counts.at_server == {("p", "10.0.0.1_8001"): 3}
    assert counts.errors == {("p", "10.0.0.1_8001"): 3}
    assert counts.routes == {("m", "p"): 3, ("n", "p"): 0}
    assert counts.tenants == {"gold": 2, "default": 1, "idle": 0}
    assert counts.active == {("p", "gold"), ("p", "default")}


def test_arrivals_the_tenancy_rules_refused_make_a_tenant_active_not_in_flight() -> None:
    seen = """# table: st_seen, type: string, size:20000, used:2
0x4: key=m/q/flood use=1 exp=0 shard=0 http_req_rate(2000)=40
0x5: key=m/p/gone use=0 exp=0 shard=0 http_req_rate(2000)=0
"""
    counts = read_haproxy(STATS, ROUTES, tenancy_rules=True, seen_text=seen)
    assert counts.active == {("p", "gold"), ("p", "default"), ("q", "flood")}
    assert counts.tenants == {"gold": 2, "default": 1, "idle": 0}
    assert counts.routes == {("m", "p"): 3, ("n", "p"): 0}


def test_haproxy_counts_without_tenancy_read_model_and_pool_keys() -> None:
    routes = "0x1: key=m/p use=0 exp=0 conn_cur=4 http_req_rate(2000)=9\n"
    counts = read_haproxy(STATS, routes, tenancy_rules=False)
    assert counts.routes == {("m", "p"): 4} and counts.tenants == {} and not counts.active


def test_tally_keeps_watched_models_per_version_when_recorded() -> None:
    tally = VersionTally()
    tally.record("m", 1, True, 0.01, at=1.0)  # not watched: dropped
    tally.watch("m")
    tally.record("m", 1, True, 0.01, at=2.0)
    tally.record("m", 2, False, 0.02, at=3.0, count=3)
    tally.record("m", 2, True, 0.02, at=5.0)
    assert tally.window("m", 1, since=0.0).requests == 1
    assert (tally.window("m", 2, since=4.0).requests, tally.window("m", 2, 4.0).errors) == (1, 0)
    assert tally.window("m", 2, since=0.0).requests == 1  # older answers were dropped
    tally.forget("m")
    tally.record("m", 1, True, 0.01, at=9.0)
    assert tally.window("m", 1, since=0.0).requests == 0


def test_tally_take_hands_over_what_was_recorded_once() -> None:
    """What a replica reports: every answer since the last take, then none."""
    tally = VersionTally()
    tally.watch("m")
    tally.record("m", 1, True, 0.01, at=1.0)
    tally.record("m", 2, False, 0.02, at=2.0, count=2)
    assert tally.take() == {"m": {1: [(True, 0.01)], 2: [(False, 0.02), (False, 0.02)]}}
    assert tally.take() == {}
    assert tally.watched() == {"m"}  # still watched: the next answers are kept
