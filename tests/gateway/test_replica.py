"""A data-plane replica's own forwarder (gateway/replica.py): its state moved by
snapshots alone, its tokens by digest, its misses asked of the control plane (an
``httpx.MockTransport`` in its place); and, on real processes, the streams and
generate calls it serves through a crash of the control plane."""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import tritonclient.grpc as grpcclient

from converters.decoupled import DECOUPLED_MODEL_NAME as DECOUPLED
from converters.tiny import TINY_MODEL_NAME, TINY_WIDTH
from gateway.auth import Scope, token_digest
from gateway.core import Core
from gateway.errors import ModelNotFound, Unauthorized, Unavailable
from gateway.haproxy.snapshot import MemberState, PoolState, RouteState, Snapshot, server_name
from gateway.policy import readiness
from gateway.policy.rollout import Split
from gateway.replica import ControlPlaneMisses, apply_snapshot, snapshot_tokens
from infergate.processes import FrontDoor, GatewayProcess, run_agent
from infergate.triton.local import LocalTriton, free_ports
from tests.gateway.python.test_streams import stream_inputs
from tests.gateway.residency.fakes import MB, A, B, config
from tests.procs import pools_yaml, run_gateway, wait_until

A_NAME, B_NAME = server_name(A), server_name(B)


def _core() -> Core:
    return Core.for_config(config({"m": 30 * MB, "n": 30 * MB}, budget=100 * MB))


def _members(a: bool = True, b: bool = True) -> tuple[PoolState, ...]:
    return (PoolState("p", (MemberState(A_NAME, "127.0.0.1", 9000, 9001, a),
                            MemberState(B_NAME, "127.0.0.1", 9010, 9011, b))),)


def _snapshot(*routes: RouteState, a: bool = True, b: bool = True,
              levels: tuple[tuple[str, int], ...] = ()) -> Snapshot:
    return Snapshot(pools=_members(a, b), routes=routes, levels=levels)


def test_apply_snapshot_routes_as_the_control_plane_decided() -> None:
    core = _core()
    state = core.state
    first = _snapshot(
        RouteState("m", (("p", 1.0),), 24, holders=(("p", (A_NAME,)),), split=(1, 2, 30)),
        RouteState("n", (("p", 1.0),), 24, not_ready="version 2 is loading", holders=()),
        b=False, levels=(("m", 3),))
    apply_snapshot(state, first)
    now = core.clock()
    assert [m.available(now) for m in state.members()] == [True, False]
    assert state.holders("m") == {A} and state.resident("m")
    assert not state.resident("n")  # held nowhere: a miss
    assert state.split_of("m") == Split(1, 2, 30)
    assert state.not_ready_reason("n") == "version 2 is loading"
    assert state.ready()  # a snapshot applied, a member of every pool available
    # Triton's priority levels as the control plane read them (the Python plane's level)
    assert (state.priority_levels("m"), state.priority_levels("n")) == (3, 0)

    second = _snapshot(RouteState("m", (("p", 1.0),), 24, holders=(("p", (A_NAME, B_NAME)),),
                                  split=(1, 2, 0), shadow=20))
    apply_snapshot(state, second, first)
    assert all(m.available(core.clock()) for m in state.members())
    assert state.holders("m") == {A, B}
    assert state.priority_levels("m") == 0  # levels taken off its config
    shadow = state.shadow_of("m")
    assert shadow is not None and (shadow.stable, shadow.candidate, shadow.percent) == (1, 2, 20)
    assert state.not_ready_reason("n") is None  # its route is gone: nothing of it stays

    apply_snapshot(state, _snapshot(RouteState("m", (("p", 1.0),), 24,
                                               holders=(("p", (A_NAME,)),))), second)
    assert state.split_of("m") is None and state.shadow_of("m") is None


def test_replica_is_ready_only_once_no_model_is_preloading_at_start_up() -> None:
    state = _core().state
    preloading = RouteState("m", (("p", 1.0),), 24, not_ready=readiness.PRELOADING,
                            holders=(("p", (A_NAME,)),))
    apply_snapshot(state, _snapshot(preloading))
    assert not state.ready()  # as the control plane: its preload is not over
    loaded = RouteState("m", (("p", 1.0),), 24, holders=(("p", (A_NAME,)),))
    apply_snapshot(state, _snapshot(loaded))
    assert state.ready()


def test_snapshot_tokens_check_presented_tokens_by_digest() -> None:
    snapshot = Snapshot(pools=(), tokens=(
        (token_digest("s3cret-admin").hex(), "admin;ops"),
        (token_digest("s3cret-app").hex(), "predict;app")), predict_gated=True)
    table = snapshot_tokens(snapshot)
    assert table.require("s3cret-app", Scope.PREDICT).name == "app"
    assert table.require("s3cret-admin", Scope.UPLOAD).name == "ops"  # admin holds all
    with pytest.raises(Unauthorized):
        table.require("guess", Scope.PREDICT)


def _misses(core: Core, handler: httpx.MockTransport) -> ControlPlaneMisses:
    client = httpx.AsyncClient(transport=handler)
    misses = ControlPlaneMisses(core.state, client, "127.0.0.1:1", "tok")
    core.state.on_miss(misses)
    return misses


async def test_miss_answered_at_once_when_the_control_plane_cannot_be_reached() -> None:
    core = _core()
    apply_snapshot(core.state, _snapshot(RouteState("m", (("p", 1.0),), 24, holders=())))

    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    _misses(core, httpx.MockTransport(refused))
    started = time.monotonic()
    with pytest.raises(Unavailable, match="control plane, which loads it, cannot be reached"):
        await core.state.wait_resident("m", 15.0)
    assert time.monotonic() - started < 1.0


@pytest.mark.parametrize(("status", "error"), [(503, Unavailable), (404, ModelNotFound)])
async def test_miss_relays_the_control_planes_answer_when_it_refuses(
        status: int, error: type[Exception]) -> None:
    core = _core()
    apply_snapshot(core.state, _snapshot(RouteState("m", (("p", 1.0),), 24, holders=())))
    _misses(core, httpx.MockTransport(lambda request: httpx.Response(
        status, json={"error": "the waiting room says why"}, headers={"retry-after": "3"})))
    with pytest.raises(error, match="the waiting room says why") as raised:
        await core.state.wait_resident("m", 15.0)
    if status == 503:
        assert raised.value.retry_after_s == 3.0  # type: ignore[attr-defined]


async def test_miss_served_once_this_replicas_snapshot_names_a_holder() -> None:
    """An answer that names no member this replica knows: its snapshot is followed."""
    core = _core()
    empty = _snapshot(RouteState("m", (("p", 1.0),), 24, holders=()))
    apply_snapshot(core.state, empty)
    asked: list[httpx.Request] = []

    def loaded(request: httpx.Request) -> httpx.Response:
        asked.append(request)
        return httpx.Response(200, json={"model": "m", "holders": []})

    misses = _misses(core, httpx.MockTransport(loaded))
    waiting = asyncio.ensure_future(core.state.wait_resident("m", 5.0))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # the control plane holds it, our snapshot not yet
    apply_snapshot(core.state, _snapshot(RouteState("m", (("p", 1.0),), 24,
                                                    holders=(("p", (A_NAME,)),))), empty)
    misses.snapshot_applied()
    assert await asyncio.wait_for(waiting, 1.0) is None  # the state names them now
    assert asked[0].url.path == "/v1/dataplane/misses/m"
    assert asked[0].url.params["wait"] == "5.000"
    assert asked[0].headers["authorization"] == "Bearer tok"


async def test_miss_goes_to_the_holder_the_answer_names_before_the_snapshot_does() -> None:
    """The control plane says loaded at A; this replica's snapshot does not say so yet
    (a replica short of CPU applies it late): the request goes to A at once rather than
    waiting for it (seen: 1-2 requests of 2,347 failed so at a quarter budget). A named
    member this replica finds unavailable is not one."""
    core = _core()
    apply_snapshot(core.state, _snapshot(RouteState("m", (("p", 1.0),), 24, holders=()),
                                         b=False))
    _misses(core, httpx.MockTransport(lambda request: httpx.Response(
        200, json={"model": "m", "holders": [A, B, "127.0.0.1:1"]})))
    started = time.monotonic()
    assert await core.state.wait_resident("m", 15.0) == frozenset({A})
    assert time.monotonic() - started < 1.0
    assert not core.state.resident("m")  # the state still follows the snapshots alone


async def test_miss_answered_before_its_deadline_when_this_replicas_snapshot_lags() -> None:
    """The control plane says loaded on a member this replica does not know (its
    snapshot lags a member added too); its snapshot never names a holder: the request is
    answered within the deadline's last share (2.85 s of 3), not at its end, when the
    client's own deadline fires and it hears nothing of why (seen: two gRPC misses at a
    quarter budget)."""
    core = _core()
    apply_snapshot(core.state, _snapshot(RouteState("m", (("p", 1.0),), 24, holders=())))
    timeouts: list[float] = []

    def loaded(request: httpx.Request) -> httpx.Response:
        timeouts.append(request.extensions["timeout"]["read"])
        return httpx.Response(200, json={"model": "m", "holders": ["127.0.0.1:1"]})

    _misses(core, httpx.MockTransport(loaded))
    started = time.monotonic()
    with pytest.raises(Unavailable, match="has not received the snapshot"):
        await core.state.wait_resident("m", 3.0)
    assert time.monotonic() - started < 3.0
    assert timeouts[0] <= 3.0  # the control plane's answer is not awaited past it either


@contextlib.contextmanager
def _layout(kind: str, pools: Path, tmp_path: Path
            ) -> Iterator[tuple[FrontDoor, Callable[[], None]]]:
    """The gateway as a cluster runs it (``split``: a control plane, one ``gateway
    agent`` replica) or as ``gateway serve --data-plane haproxy`` runs it on one node
    (``serve``: HAProxy and the replica's own process beside the control plane); the
    front door clients use, and how to crash the control plane. ``serve``'s survivors
    are ended by a restart that adopts them and a graceful stop."""
    if kind == "split":
        with run_gateway(pools, tmp_path, data_plane="none") as control, \
                run_agent(control, tmp_path / "agent") as agent:
            yield agent, lambda: _crash(control)
        return
    http_port, grpc_port = free_ports(2)
    ports = (http_port, grpc_port)
    with run_gateway(pools, tmp_path, data_plane="haproxy", ports=ports,
                     replica=True) as gateway:
        yield gateway, lambda: _crash(gateway)
    with run_gateway(pools, tmp_path, data_plane="haproxy", ports=ports,
                     replica=True) as again:
        adopted = again.log.read_text()  # HAProxy (same master) and the replica
        assert "adopting the running master" in adopted
        assert "adopting the running data-plane replica" in adopted
        assert _infer(again.http_url) == 200
    # (the session's check finds no HAProxy or replica left: the graceful stop ended them)


def _infer(http_url: str) -> int:
    """A unary inference of the tiny model (HAProxy carries it straight to Triton)."""
    return httpx.post(f"http://{http_url}/v2/models/{TINY_MODEL_NAME}/infer", timeout=30,
                      json={"inputs": [{"name": "x", "shape": [1, TINY_WIDTH],
                                        "datatype": "FP32", "data": [1.0] * TINY_WIDTH}]}
                      ).status_code


def _crash(gateway: GatewayProcess) -> None:
    gateway.proc.send_signal(signal.SIGKILL)
    gateway.proc.wait(10)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["split", "serve"])
def test_replica_serves_every_kind_of_call_through_a_control_plane_crash(
        kind: str, triton: LocalTriton, tmp_path: Path) -> None:
    """Real processes: Triton with the decoupled model, a control plane, one replica.
    A ``generate_stream`` and a ``ModelStreamInfer`` stream open across a SIGKILL of the
    control plane end whole; new ones, ``generate``, health and metadata are served
    during the outage; the control plane's own calls fail at once, saying so."""
    assert triton.endpoints is not None
    pools = pools_yaml(tmp_path / "pools.yaml", {"local": [triton.endpoints]})
    body = {"text_input": "hi", "count": 8, "delay_ms": 250}
    with _layout(kind, pools, tmp_path) as (door, crash):
        events: list[str] = []

        def long_stream() -> None:
            with httpx.stream("POST", f"http://{door.http_url}/v2/models/{DECOUPLED}"
                              "/generate_stream", json=body, timeout=30) as resp:
                events.extend(line for line in resp.iter_lines() if line)

        reader = threading.Thread(target=long_stream)
        reader.start()
        stream = _DecoupledStream(door.grpc_url)
        assert stream.ask("a", 2) == ["a 0", "a 1"]
        assert wait_until(lambda: len(events) >= 1, 10)  # under way through the replica
        crash()
        reader.join(30)
        assert [json.loads(e.removeprefix("data: "))["text_output"] for e in events] == \
            [f"hi {i}" for i in range(8)]
        assert stream.ask("b", 3) == ["b 0", "b 1", "b 2"]  # the open stream goes on
        stream.close()
        fresh = _DecoupledStream(door.grpc_url)
        assert fresh.ask("c", 1) == ["c 0"]  # a new stream
        fresh.close()
        one = httpx.post(f"http://{door.http_url}/v2/models/{DECOUPLED}/generate",
                         json={"text_input": "hi", "count": 1}, timeout=30)
        assert one.status_code == 200 and one.json()["text_output"] == "hi 0"
        for path in ("/v2/health/ready", "/v2/health/live", f"/v2/models/{DECOUPLED}",
                     f"/v2/models/{DECOUPLED}/ready", "/v2"):
            assert httpx.get(f"http://{door.http_url}{path}", timeout=10).status_code == 200
        client = grpcclient.InferenceServerClient(door.grpc_url)
        assert client.is_server_ready() and client.is_model_ready(DECOUPLED)
        assert client.get_model_metadata(DECOUPLED).name == DECOUPLED
        client.close()
        assert _infer(door.http_url) == 200  # unary inference: HAProxy's own
        started = time.monotonic()
        down = httpx.get(f"http://{door.http_url}/v1/models", timeout=10)
        assert down.status_code == 503 and "control plane" in down.text
        assert time.monotonic() - started < 2.0


class _DecoupledStream:
    """An open ``ModelStreamInfer`` stream to the decoupled test model."""

    def __init__(self, grpc_url: str) -> None:
        self.answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.client = grpcclient.InferenceServerClient(grpc_url)
        self.client.start_stream(callback=lambda result, error: self.answers.put(
            (result, error)))

    def ask(self, text: str, count: int) -> list[str]:
        self.client.async_stream_infer(DECOUPLED, stream_inputs(grpcclient, text, count))
        out = []
        for _ in range(count):
            result, error = self.answers.get(timeout=15)
            assert error is None, error
            out.append(result.as_numpy("text_output")[0].decode())
        return out

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()
