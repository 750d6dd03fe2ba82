"""Requests wait in the gateway, in the same order on both data planes
(gateway/policy/queueing.py): a pool whose member takes one request at once, that one
held in Triton; requests queued behind it are served critical first, then standard by
virtual time (a tenant with a backlog behind one without), then sheddable, whatever
their arrival order; a request that waits past the pool's bound is answered "Deadline
Exceeded", over HTTP and gRPC alike; a light tenant's request goes to Triton through the
pool's lane while the pool's slot is held, and waits once the lane is full too.

The held request is a model whose dynamic batcher waits ``HOLD_S`` for a batch; a full
batch sent to Triton itself ends the hold (tests/gateway/test_tenancy.py's
``_release``). One Triton, bound to every loopback address, is the member of three pools
(``127.0.0.1``, ``127.0.0.2`` and ``127.0.0.3``: three members to the gateway)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from dataclasses import replace

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import yaml
from tritonclient.utils import InferenceServerException

from converters.tiny import TINY_MODEL_NAME, TINY_WIDTH, build_tiny_model
from infergate.processes import GatewayProcess
from infergate.triton.local import LocalTriton
from tests.conftest import DATA_PLANES, triton_settings
from tests.gateway.test_tenancy import _held, _in_flight, _pending, _release
from tests.procs import run_gateway, started_triton, wait_until

pytestmark = [pytest.mark.integration]
HELD, LATE, LANE, HOLD_S, BOUND_MS = "held", "late", "lane", 8.0, 400
BATCH, PAY = "batch-key-0123456789", "pay-key-0123456789"
HEAVY, LIGHT = "heavy-key-0123456789", "light-key-0123456789"
KEYS = {BATCH: "batch", PAY: "pay", HEAVY: "heavy", LIGHT: "light"}
TENANCY = {
    # nothing here is refused: every request waits
    "refuse_at": {"sheddable": 8, "standard": 9, "critical": 10},
    "tenants": [{"name": "batch", "priority": "sheddable", "keys": [BATCH]},
                {"name": "pay", "priority": "critical", "keys": [PAY]},
                # 10 s of virtual time per request it has in the gateway
                {"name": "heavy", "weight": 0.001, "keys": [HEAVY]},
                {"name": "light", "keys": [LIGHT]}],
}
EXPIRED = re.compile(r"Deadline Exceeded: no member was free in time \(\d+ ms in the "
                     rf"gateway's queue of pool 't', at most {BOUND_MS} ms\)")


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTriton]:
    tmp = tmp_path_factory.mktemp("queueing-triton")
    repo = tmp / "model_repo"
    build_tiny_model(repo)
    for name in (HELD, LATE, LANE):
        build_tiny_model(repo, name, max_queue_delay_us=int(HOLD_S * 1e6))
    settings = replace(triton_settings(repo, tmp, TINY_MODEL_NAME, HELD, LATE, LANE),
                       host="0.0.0.0")
    with started_triton(settings) as server:
        yield server


@pytest.fixture(scope="module", params=DATA_PLANES)
def gateway(request: pytest.FixtureRequest, triton: LocalTriton,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    tmp = tmp_path_factory.mktemp(f"queueing-{request.param}")
    e = triton.endpoints
    assert e is not None

    def pool(name: str, host: str, models: list[str], wait_ms: int,
             lane: int = 0) -> dict[str, object]:
        return {"name": name, "models": models, "capacity_per_member": 1,
                "gateway_queue": True, "max_queue_wait_ms": wait_ms, "lane_per_member": lane,
                "members": [{"host": host, "http_port": e.http_port, "grpc_port": e.grpc_port,
                             "metrics_port": e.metrics_port}]}

    config = {"pools": [pool("q", "127.0.0.1", [TINY_MODEL_NAME, HELD], 30_000),
                        pool("t", "127.0.0.2", [LATE], BOUND_MS),
                        pool("l", "127.0.0.3", [LANE], 30_000, lane=1)],
              "queue_factor": 20.0}
    (tmp / "gw.yaml").write_text(yaml.safe_dump(config))
    (tmp / "tenants.yaml").write_text(yaml.safe_dump(TENANCY))
    with run_gateway(tmp / "gw.yaml", tmp, "--tenants", str(tmp / "tenants.yaml"),
                     data_plane=request.param) as gw:
        yield gw


def _body() -> bytes:
    return json.dumps({"inputs": [{"name": "x", "shape": [1, TINY_WIDTH], "datatype": "FP32",
                                   "data": [1.0] * TINY_WIDTH}]}).encode()


async def _counted(gw: GatewayProcess, tenant: str, count: int) -> None:
    assert await asyncio.to_thread(wait_until, lambda: _in_flight(gw, tenant) == count, 20), \
        (tenant, _in_flight(gw, tenant))


async def test_queued_requests_are_served_by_class_then_by_virtual_time(
        gateway: GatewayProcess, triton: LocalTriton) -> None:
    base = f"http://{gateway.http_url}/v2/models"
    served: list[str] = []
    async with httpx.AsyncClient(timeout=60) as client:
        def post(key: str, model: str = TINY_MODEL_NAME) -> asyncio.Task[httpx.Response]:
            task = asyncio.create_task(client.post(f"{base}/{model}/infer", content=_body(),
                                                   headers={"x-api-key": key}))
            task.add_done_callback(lambda _: served.append(KEYS[key]))
            return task

        blocker = post(BATCH, HELD)  # the member's one slot, held in Triton
        await _held(triton, HELD, [blocker])
        queued = [post(BATCH)]  # sheddable, first to arrive
        await _counted(gateway, "batch", 2)
        queued += [post(HEAVY) for _ in range(3)]  # backlogs 0, 1, 2: 0, 10, 20 s later
        await _counted(gateway, "heavy", 3)
        queued += [post(LIGHT), post(PAY)]  # light: no backlog; pay: critical
        await _counted(gateway, "light", 1)
        await _counted(gateway, "pay", 1)
        assert not any(t.done() for t in queued), [t.result().text for t in queued if t.done()]
        await _release(triton, HELD, [blocker])
        answers = await asyncio.gather(blocker, *queued)
    assert [r.status_code for r in answers] == [200] * 7, [r.text for r in answers]
    assert served == ["batch", "pay", "heavy", "light", "heavy", "heavy", "batch"]


async def test_a_light_tenant_goes_through_the_lane_while_the_pools_slot_is_held(
        gateway: GatewayProcess, triton: LocalTriton) -> None:
    """Pool ``l``: one slot and a lane of one. The slot held, a standard tenant's first
    request reaches Triton at once (the lane); a critical tenant's waits in the gateway
    (first in line, never the lane), and so does another standard tenant's first, the
    lane full. Released, all are answered, the critical one first."""
    url = f"http://{gateway.http_url}/v2/models/{LANE}/infer"
    async with httpx.AsyncClient(timeout=60) as client:
        def post(key: str) -> asyncio.Task[httpx.Response]:
            return asyncio.create_task(client.post(url, content=_body(),
                                                   headers={"x-api-key": key}))

        blocker = post(BATCH)  # the pool's one slot
        await _held(triton, LANE, [blocker])
        light = post(LIGHT)
        await _held(triton, LANE, [blocker, light])
        assert await asyncio.to_thread(_pending, triton, LANE) == 2  # in Triton, not queued
        pay, heavy = post(PAY), post(HEAVY)
        await _counted(gateway, "pay", 1)
        await _counted(gateway, "heavy", 1)
        assert await asyncio.to_thread(_pending, triton, LANE) == 2  # both wait here
        assert not pay.done() and not heavy.done()
        await _release(triton, LANE, [blocker, light])
        answers = await asyncio.gather(blocker, light)
        await _release(triton, LANE, [pay])  # the slot's next: critical, in Triton now
        answers.append(await pay)
        assert not heavy.done()
        await _release(triton, LANE, [heavy])
        answers.append(await heavy)
    assert [r.status_code for r in answers] == [200] * 4, [r.text for r in answers]


def _grpc_infer(gw: GatewayProcess, key: str) -> tuple[str, str]:
    """(status, message) of a gRPC request of ``LATE``; ("", "") when answered."""
    client = grpcclient.InferenceServerClient(gw.grpc_url)
    try:
        inp = grpcclient.InferInput("x", [1, TINY_WIDTH], "FP32")
        inp.set_data_from_numpy(np.ones((1, TINY_WIDTH), np.float32))
        client.infer(LATE, [inp], headers={"x-api-key": key})
        return "", ""
    except InferenceServerException as exc:
        return str(exc.status()), str(exc.message())
    finally:
        client.close()


async def test_a_request_waiting_past_the_pools_bound_is_answered_deadline_exceeded(
        gateway: GatewayProcess, triton: LocalTriton) -> None:
    """Each protocol's blocker: HAProxy's slots are per backend, one per protocol."""
    url = f"http://{gateway.http_url}/v2/models/{LATE}/infer"
    async with httpx.AsyncClient(timeout=60) as client:
        blocker = asyncio.create_task(client.post(url, content=_body(),
                                                  headers={"x-api-key": BATCH}))
        await _held(triton, LATE, [blocker])
        late = await client.post(url, content=_body(), headers={"x-api-key": PAY})
        await _release(triton, LATE, [blocker])
        assert (await blocker).status_code == 200
    assert late.status_code == 504, late.text
    assert EXPIRED.fullmatch(late.json()["error"]), late.text
    assert "retry-after" not in late.headers

    grpc_blocker = asyncio.ensure_future(asyncio.to_thread(_grpc_infer, gateway, BATCH))
    await _held(triton, LATE, [grpc_blocker])  # type: ignore[list-item]
    status, message = await asyncio.to_thread(_grpc_infer, gateway, PAY)
    await _release(triton, LATE, [grpc_blocker])  # type: ignore[list-item]
    assert await grpc_blocker == ("", "")
    assert status == "StatusCode.DEADLINE_EXCEEDED", (status, message)
    assert EXPIRED.fullmatch(message), message
