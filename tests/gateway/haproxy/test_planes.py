"""A replica's HAProxy sends each call where ``gateway/policy/planes.py`` says: the
control plane's calls to the control plane, everything else HAProxy does not route
itself to the replica's own forwarder; a call to a control plane that is away fails
within a second, saying so; a rollout's shadow share goes to the replica's forwarder
(which reports the pairs), whether or not the control plane is up. A real HAProxy
in front of two HTTP servers that answer with their name."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from gateway.haproxy.answers import CONTROL_DOWN
from gateway.haproxy.process import HAProxyProcess
from gateway.haproxy.proxy import SnapshotProxy
from gateway.haproxy.snapshot import Layout, PoolState, RouteState, Snapshot
from gateway.netaddr import free_port
from gateway.policy.planes import control_http
from tests.gateway.haproxy.conftest import as_member, serving

pytestmark = pytest.mark.integration  # runs the real HAProxy: make test installs it

# (method, path): every kind of call a client sends that HAProxy does not route itself
CALLS = (
    ("GET", "/v2/health/live"), ("GET", "/v2/health/ready"), ("GET", "/v2"),
    ("GET", "/v2/models/tiny"), ("GET", "/v2/models/tiny/versions/1/ready"),
    ("GET", "/v2/models/tiny/config"), ("GET", "/v2/models/tiny/stats"),
    ("POST", "/v2/models/tiny/generate"), ("POST", "/v2/models/tiny/generate_stream"),
    ("GET", "/v2/systemsharedmemory/status"),
    ("POST", "/v2/models/cold/infer"),  # a miss
    ("GET", "/v1/models"), ("POST", "/v1/models/tiny/versions"), ("GET", "/v1/jobs/7"),
    ("GET", "/v1/dataplane/snapshot"), ("GET", "/ui/models"), ("GET", "/"),
    ("GET", "/metrics"), ("POST", "/v2/repository/index"),
    ("POST", "/v2/repository/models/tiny/load"), ("GET", "/v2/trace/setting"),
    ("GET", "/v2/models/tiny/trace/setting"), ("POST", "/v2/logging"),
)


def test_replica_sends_each_call_to_the_plane_the_rule_names(tmp_path: Path) -> None:
    with serving("member") as member, serving("control") as control, \
            serving("local") as local:
        snapshot = Snapshot(pools=(PoolState("p", (as_member(member),)),), routes=(
            RouteState("tiny", (("p", 1.0),), 64),
            RouteState("cold", (("p", 1.0),), 64, holders=(("p", ()),)),
            # a shadow step sampling every unversioned request
            RouteState("shadowed", (("p", 1.0),), 64, split=(1, 2, 0), shadow=100)))
        layout = replace(
            Layout(f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}",
                   f"127.0.0.1:{control.port}", f"127.0.0.1:{free_port()}",
                   tmp_path / "run", f"127.0.0.1:{free_port()}"),
            local_http=f"127.0.0.1:{local.port}", local_grpc=f"127.0.0.1:{free_port()}")
        proxy = SnapshotProxy(layout, HAProxyProcess(layout))
        proxy.start(snapshot)
        try:
            with httpx.Client(base_url=f"http://{layout.http_bind}", timeout=10) as client:
                for method, path in CALLS:
                    answer = client.request(method, path,
                                            content=b"{}" if method == "POST" else None)
                    want = "control" if control_http(path) else "local"
                    assert answer.json()["by"] == want, (method, path)
                assert client.post("/v2/models/tiny/infer", content=b"{}").json()["by"] \
                    == "member"  # inference: HAProxy's own

                # the shadow share: the replica's forwarder mirrors it (and reports)
                assert client.post("/v2/models/shadowed/infer", content=b"{}").json()["by"] \
                    == "local"

                control.vanish()
                # ... the same once the control plane is gone: none fails
                shadowed = [client.post("/v2/models/shadowed/infer", content=b"{}")
                            for _ in range(5)]
                assert [a.json()["by"] for a in shadowed] == ["local"] * 5
                started = time.monotonic()
                down = client.get("/v1/models")
                assert time.monotonic() - started < 1.5
                assert down.status_code == 503 and down.json()["error"] == CONTROL_DOWN
                assert client.get("/v2/health/ready").json()["by"] == "local"
        finally:
            proxy.process.stop(2)
