"""Tenants and priorities on each data plane (gateway/policy/tenancy.py): at overload a
sheddable tenant is refused first, a critical one keeps its room up to its own limit,
the default tenant is refused at the standard ceiling, over HTTP and gRPC alike; a
refusal is answered after the tenancy's refusal delay, or at once for a deadline with no
room for it, and later for a tenant with many refusals waiting, holding no other stream
of its connection; a live change of tenants through ``PUT /v1/tenants`` drops no
request; a malformed one is refused whole; in a pool that queues in the gateway (pool g)
sheddable requests wait there up to their own ceiling (1 + queue_factor / 4).

The pool's requests are held in Triton by a model whose dynamic batcher waits
``HOLD_S`` for a batch: the load is known while the test asks. Once it has asked, a full
batch sent to Triton itself ends the hold (:func:`_release`)."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import yaml
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from converters.tiny import TINY_MODEL_NAME, TINY_WIDTH, build_tiny_model
from gateway.config.tenancy import DEFAULT_REFUSAL_DELAY_MS
from infergate.processes import GatewayProcess
from infergate.triton.local import LocalTriton
from loadtests.h2load import grpc_request_bytes
from tests.conftest import DATA_PLANES, triton_settings
from tests.gateway.conftest import haproxy_share
from tests.procs import run_gateway, started_triton, wait_until

pytestmark = [pytest.mark.integration]
SLOW, CAPPED, QUEUED, HOLD_S = "held", "capped", "queued", 8.0
BATCH, PAY = "batch-key-0123456789", "pay-key-0123456789"
HEAVY, LIGHT = "heavy-key-0123456789", "light-key-0123456789"
QUIET = "quiet-key-0123456789"  # only ever refused (the refusal delay's test)
FLOOD = "flood-key-0123456789"  # many refused at once (the longer delay's test)
REFUSALS_PER_S = 20  # each of a tenant's refusals waiting adds 50 ms to the next one's
TENANCY = {
    "default": {"priority": "standard"},
    "refusals_per_s": REFUSALS_PER_S,
    "tenants": [{"name": "batch", "priority": "sheddable", "keys": [BATCH]},
                {"name": "flood", "priority": "sheddable", "keys": [FLOOD]},
                {"name": "pay", "priority": "critical", "keys": [PAY], "max_in_flight": 3},
                {"name": "heavy", "keys": [HEAVY]}, {"name": "light", "keys": [LIGHT]},
                {"name": "quiet", "keys": [QUIET]}],
}


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTriton]:
    """One Triton for both planes' gateways (each test leaves nothing held)."""
    tmp = tmp_path_factory.mktemp("tenancy-triton")
    repo = tmp / "model_repo"
    build_tiny_model(repo)
    build_tiny_model(repo, SLOW, max_queue_delay_us=int(HOLD_S * 1e6))
    build_tiny_model(repo, CAPPED, max_queue_delay_us=int(HOLD_S * 1e6))
    build_tiny_model(repo, QUEUED, max_queue_delay_us=int(HOLD_S * 1e6))
    # bound to every loopback address: the member of pool p (127.0.0.1) and of pool g
    # (127.0.0.2), two members to the gateway
    settings = replace(triton_settings(repo, tmp, TINY_MODEL_NAME, SLOW, CAPPED, QUEUED),
                       host="0.0.0.0")
    with started_triton(settings) as server:
        yield server


@pytest.fixture(scope="module", params=DATA_PLANES)
def gateway(request: pytest.FixtureRequest, triton: LocalTriton,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    tmp = tmp_path_factory.mktemp(f"tenancy-{request.param}")
    e = triton.endpoints
    assert e is not None
    def member(host: str) -> dict[str, object]:
        return {"host": host, "http_port": e.http_port, "grpc_port": e.grpc_port,
                "metrics_port": e.metrics_port}

    # capacity 2, queue_factor 2: sheddable refused from load 2, standard from 4,
    # critical from 6 (the model's own bound too); pool g queues in the gateway, where
    # sheddable is refused from load 3 (1 + queue_factor / 4)
    config = {"pools": [{"name": "p", "capacity_per_member": 2,
                         "models": [TINY_MODEL_NAME, SLOW, CAPPED],
                         "members": [member("127.0.0.1")]},
                        {"name": "g", "capacity_per_member": 2, "gateway_queue": True,
                         "models": [QUEUED], "members": [member("127.0.0.2")]}],
              # the model's own bound 3: critical 3, standard 2, sheddable 1
              "models": {CAPPED: {"max_concurrency": 1, "max_queue": 2}},
              "queue_factor": 2.0}
    (tmp / "gw.yaml").write_text(yaml.safe_dump(config))
    (tmp / "tenants.yaml").write_text(yaml.safe_dump(TENANCY))
    with run_gateway(tmp / "gw.yaml", tmp, "--tenants", str(tmp / "tenants.yaml"),
                     data_plane=request.param) as gw:
        yield gw


def _body() -> bytes:
    return json.dumps({"inputs": [{"name": "x", "shape": [1, TINY_WIDTH], "datatype": "FP32",
                                   "data": [1.0] * TINY_WIDTH}]}).encode()


def _poster(client: httpx.AsyncClient, url: str
            ) -> Callable[[str | None], asyncio.Task[httpx.Response]]:
    """Posts of one request to ``url`` as a key's tenant (None: the default tenant)."""
    def post(key: str | None) -> asyncio.Task[httpx.Response]:
        headers = {"x-api-key": key} if key else {}
        return asyncio.create_task(client.post(url, content=_body(), headers=headers))
    return post


def _samples(gw: GatewayProcess, name: str, **labels: str) -> float:
    text = httpx.get(f"http://{gw.http_url}/metrics").text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def _in_flight(gw: GatewayProcess, tenant: str) -> float:
    return _samples(gw, "infergate_tenant_in_flight_requests", tenant=tenant)


def _pending(triton: LocalTriton, model: str) -> float:
    """Requests Triton holds for ``model`` (its queue and its batches)."""
    assert triton.endpoints is not None
    text = httpx.get(triton.endpoints.metrics_url).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "nv_inference_pending_request_count"
               and s.labels.get("model") == model)


async def _held(triton: LocalTriton, model: str,
                tasks: list[asyncio.Task[httpx.Response]]) -> None:
    """Until Triton holds every request of ``tasks`` not answered yet (at most 20 s)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while loop.time() < deadline:
        waiting = sum(not task.done() for task in tasks)
        if not waiting or await asyncio.to_thread(_pending, triton, model) >= waiting:
            return
        await asyncio.sleep(0.05)


async def _release(triton: LocalTriton, model: str,
                   tasks: list[asyncio.Task[httpx.Response]]) -> None:
    """End the hold of ``tasks`` now rather than after ``HOLD_S``: once Triton holds
    them, a full batch (the tiny model's max_batch_size, 64) sent to Triton itself makes
    its dynamic batcher run what waits. The gateway never sees that batch."""
    await _held(triton, model, tasks)
    assert triton.endpoints is not None
    full = {"inputs": [{"name": "x", "shape": [64, TINY_WIDTH], "datatype": "FP32",
                        "data": [1.0] * (64 * TINY_WIDTH)}]}
    answer = await asyncio.to_thread(
        httpx.post, f"http://{triton.endpoints.http_url}/v2/models/{model}/infer",
        json=full, timeout=30)
    assert answer.status_code == 200, answer.text


def _grpc_infer(gw: GatewayProcess, model: str, key: str) -> grpc.StatusCode | None:
    client = grpcclient.InferenceServerClient(gw.grpc_url)
    try:
        inp = grpcclient.InferInput("x", [1, TINY_WIDTH], "FP32")
        inp.set_data_from_numpy(np.ones((1, TINY_WIDTH), np.float32))
        client.infer(model, [inp], headers={"x-api-key": key})
        return None
    except Exception as exc:  # noqa: BLE001 - InferenceServerException carries the status
        status = getattr(exc, "status", lambda: None)()
        assert "sheddable requests are refused from load 2" in str(exc), exc
        return grpc.StatusCode.RESOURCE_EXHAUSTED if status == "StatusCode.RESOURCE_EXHAUSTED" \
            else None
    finally:
        client.close()


async def test_at_overload_sheddable_goes_first_and_critical_keeps_its_room(
        gateway: GatewayProcess, triton: LocalTriton) -> None:
    url = f"http://{gateway.http_url}/v2/models/{SLOW}/infer"
    async with httpx.AsyncClient(timeout=60) as client:
        post = _poster(client, url)
        held = [post(BATCH), post(BATCH)]  # the pool's capacity, held in Triton
        assert await asyncio.to_thread(wait_until, lambda: _in_flight(gateway, "batch") == 2, 20)
        shed = await post(BATCH)
        assert shed.status_code == 429 and shed.headers["retry-after"] == "1"
        assert shed.json()["error"] == ("pool 'p' is saturated: load 2 for capacity 2; "
                                        "sheddable requests are refused from load 2")
        assert await asyncio.to_thread(_grpc_infer, gateway, SLOW, BATCH) \
            == grpc.StatusCode.RESOURCE_EXHAUSTED
        held += [post(PAY) for _ in range(3)]  # critical: in above capacity
        assert await asyncio.to_thread(wait_until, lambda: _in_flight(gateway, "pay") == 3, 20)
        limited = await post(PAY)
        assert limited.status_code == 429
        assert limited.json()["error"] == "tenant 'pay' has 4 requests in flight (its limit 3)"
        default = await post(None)  # load 5: beyond the standard ceiling (4)
        assert default.status_code == 429
        assert default.json()["error"] == ("pool 'p' is saturated: load 5 for capacity 2; "
                                           "standard requests are refused from load 4")
        await _release(triton, SLOW, held)
        answers = await asyncio.gather(*held)
    assert [r.status_code for r in answers] == [200] * 5

    def counted() -> bool:  # HAProxy's telemetry arrives a moment after its answers
        return (_samples(gateway, "infergate_tenant_refused_requests_total", tenant="batch",
                         priority="sheddable", reason="saturated") == 2
                and _samples(gateway, "infergate_tenant_refused_requests_total",
                             tenant="pay", reason="tenant_limit") == 1
                and _samples(gateway, "infergate_tenant_requests_total", tenant="pay",
                             priority="critical", outcome="success") == 3
                and _samples(gateway, "infergate_tenant_request_duration_seconds_count",
                             tenant="batch") == 2)
    assert await asyncio.to_thread(wait_until, counted, 20)


async def test_in_a_pool_that_queues_in_the_gateway_sheddable_requests_wait_too(
        gateway: GatewayProcess, triton: LocalTriton) -> None:
    """Pool g (capacity 2, gateway_queue): two sheddable requests held in Triton, a third
    waits in the gateway's queue (pool p refuses it: the test above), a fourth is refused
    at the queued pool's ceiling, 3. The model's bound follows the pool's ceilings: 3 for
    sheddable (in pool p, 2)."""
    url = f"http://{gateway.http_url}/v2/models/{QUEUED}/infer"
    async with httpx.AsyncClient(timeout=60) as client:
        post = _poster(client, url)
        held = [post(BATCH), post(BATCH)]  # the member's two slots, held in Triton
        await _held(triton, QUEUED, held)
        queued = post(BATCH)
        assert await asyncio.to_thread(wait_until, lambda: _in_flight(gateway, "batch") == 3, 20)
        shed = await post(BATCH)
        assert shed.status_code == 429, shed.text
        assert shed.json()["error"] == ("pool 'g' is saturated: load 3 for capacity 2; "
                                        "sheddable requests are refused from load 3")
        assert not queued.done()
        await _release(triton, QUEUED, held)
        await _release(triton, QUEUED, [queued])
        answers = await asyncio.gather(*held, queued)
    assert [r.status_code for r in answers] == [200] * 3, [r.text for r in answers]
    shown = httpx.get(f"http://{gateway.http_url}/v1/tenants").json()
    assert shown["refuse_at_gateway_queue"] == {"sheddable": 1.5, "standard": 2.0,
                                                "critical": 3.0}
    assert shown["pools"]["g"]["ceilings"] == {"sheddable": 3, "standard": 4, "critical": 6}
    assert shown["pools"]["g"]["gateway_queue"] is True
    assert shown["pools"]["g"]["lane_per_member"] == 2  # the default


async def test_tenants_change_live_without_dropping_a_request(gateway: GatewayProcess) -> None:
    base = f"http://{gateway.http_url}"
    url = f"{base}/v2/models/{TINY_MODEL_NAME}/infer"
    statuses: Counter[int] = Counter()
    refused: list[str] = []
    done = asyncio.Event()
    # none needs a new stick table (a rate window no limit has yet: docs/request-policy.md,
    # "Changing tenants live"), so HAProxy takes each through its runtime API; the Python
    # plane at once
    changes = [
        {**TENANCY, "default": {"priority": "critical", "weight": 2}},
        {**TENANCY, "tenants": [*TENANCY["tenants"],  # type: ignore[list-item]
                                {"name": "capped", "keys": ["capped-key-0123456789"],
                                 "max_in_flight": 1}]},
        {"tenants": [{"name": "pay", "weight": 3, "keys": [PAY]}]},  # standard, one tenant
        None,  # tenancy off
        TENANCY,
    ]
    async with httpx.AsyncClient(timeout=60) as client:
        async def traffic() -> None:
            while not done.is_set():
                r = await client.post(url, content=_body(), headers={"x-api-key": PAY})
                statuses[r.status_code] += 1
                if r.status_code != 200:
                    refused.append(r.text)

        workers = [asyncio.create_task(traffic()) for _ in range(2)]
        for change in changes:
            before = sum(statuses.values())
            if change is None:
                answer = await client.delete(f"{base}/v1/tenants")
            else:
                answer = await client.put(f"{base}/v1/tenants", json=change)
            assert answer.status_code == 200, answer.text
            assert answer.json()["enabled"] is (change is not None)
            while sum(statuses.values()) < before + 20:  # traffic through each state
                await asyncio.sleep(0.05)
        done.set()
        await asyncio.gather(*workers)
        shown = (await client.get(f"{base}/v1/tenants")).json()
    assert set(statuses) == {200}, (statuses, refused[:3])
    assert [t["name"] for t in shown["tenants"]] == ["default", "batch", "flood", "pay", "heavy",
                                                     "light", "quiet"]
    assert shown["pools"]["p"]["capacity"] == 2
    assert shown["pools"]["p"]["ceilings"] == {"sheddable": 2, "standard": 4, "critical": 6}
    # once the traffic is over (HAProxy counted it as the default tenant's while tenancy
    # was off), every tenant is alone in its class: its share is the class ceiling
    idle = {"default": 4, "batch": 2, "flood": 2, "pay": 6, "heavy": 4, "light": 4, "quiet": 4}
    assert await asyncio.to_thread(wait_until, lambda: _shares(gateway) == idle, 20), \
        _shares(gateway)
    assert all(k.startswith("sha256:") for t in shown["tenants"] for k in t["keys"])


def _configured(shown: dict[str, Any]) -> dict[str, Any]:
    """``GET /v1/tenants`` without what traffic moves (the tenants active in each pool
    and their shares: a tenant of an earlier test's traffic goes idle meanwhile)."""
    pools = {name: {k: v for k, v in pool.items() if k not in ("active", "shares")}
             for name, pool in shown["pools"].items()}
    return {**shown, "pools": pools}


@pytest.mark.parametrize(("document", "named"), [
    ({"tenants": [{"name": "x", "priority": "gold"}]}, "tenants.x.priority"),
    ({"tenants": [{"name": "x", "weight": -1}]}, "tenants.x.weight"),
    ("not an object", "tenancy: Input should be a valid dictionary"),
])
def test_a_malformed_tenancy_is_refused_whole_and_nothing_changes(
        gateway: GatewayProcess, document: object, named: str) -> None:
    base = f"http://{gateway.http_url}"
    before = _configured(httpx.get(f"{base}/v1/tenants").json())
    answer = httpx.put(f"{base}/v1/tenants", json=document)
    assert answer.status_code == 400 and named in answer.json()["error"]
    assert _configured(httpx.get(f"{base}/v1/tenants").json()) == before
    broken = httpx.put(f"{base}/v1/tenants", content=b"{", headers={"content-type": "x"})
    assert broken.status_code == 400 and "not JSON" in broken.json()["error"]


def _active(gw: GatewayProcess) -> list[str]:
    return list(httpx.get(f"http://{gw.http_url}/v1/tenants").json()["pools"]["p"]["active"])


def _shares(gw: GatewayProcess) -> dict[str, int]:
    return dict(httpx.get(f"http://{gw.http_url}/v1/tenants").json()["pools"]["p"]["shares"])


def _share_applied(gw: GatewayProcess, tenant: str) -> int:
    """The share the data plane refuses by: HAProxy's map follows ``GET /v1/tenants``
    within a probe round (the Python plane reads the control plane's own)."""
    if gw.data_plane != "haproxy":
        return _shares(gw)[tenant]
    (run_dir,) = gw.log.parent.glob("haproxy-*")
    return haproxy_share(run_dir, "p", tenant)


async def test_a_lone_tenant_uses_the_pool_and_shares_shrink_when_another_arrives(
        gateway: GatewayProcess, triton: LocalTriton) -> None:
    base = f"http://{gateway.http_url}"
    held_url, quick_url = f"{base}/v2/models/{SLOW}/infer", \
        f"{base}/v2/models/{TINY_MODEL_NAME}/infer"
    done = asyncio.Event()
    async with httpx.AsyncClient(timeout=60) as client:
        def post(key: str, url: str = held_url) -> asyncio.Task[httpx.Response]:
            return asyncio.create_task(client.post(url, content=_body(),
                                                   headers={"x-api-key": key}))

        # heavy alone: past capacity (2) up to the standard ceiling (4), since nobody
        # else sends (the default tenant and light, configured and idle, take nothing)
        assert await asyncio.to_thread(wait_until, lambda: _shares(gateway)["heavy"] == 4, 20)
        held = [post(HEAVY) for _ in range(3)]
        assert await asyncio.to_thread(wait_until, lambda: _in_flight(gateway, "heavy") == 3, 20)

        async def light_sends() -> None:  # light active: quick requests to the same pool
            while not done.is_set():
                r = await client.post(quick_url, content=_body(), headers={"x-api-key": LIGHT})
                assert r.status_code == 200, r.text
                await asyncio.sleep(0.2)

        light = asyncio.create_task(light_sends())
        # within a probe round heavy's share is half the ceiling: 3 in flight are not
        # cut, its next request is refused
        assert await asyncio.to_thread(wait_until, lambda: _shares(gateway)["heavy"] == 2, 20)
        assert await asyncio.to_thread(wait_until,
                                       lambda: _share_applied(gateway, "heavy") == 2, 20)
        # refused by its share; while one of light's quick requests is in flight the
        # load is 4, the standard ceiling, and the pool refuses first: ask again
        by_share = ("pool 'p' is saturated (load 3 for capacity 2) and tenant 'heavy' has "
                    "its share in flight (2)")
        by_ceiling = ("pool 'p' is saturated: load 4 for capacity 2; standard requests are "
                      "refused from load 4")
        deadline = asyncio.get_running_loop().time() + 20
        while True:
            refused = await post(HEAVY)
            assert refused.status_code == 429, refused.text
            if refused.json()["error"] == by_share:
                break
            assert refused.json()["error"] == by_ceiling, refused.text
            assert asyncio.get_running_loop().time() < deadline, refused.text
        done.set()
        await light
        # light gone quiet: heavy's share is the whole ceiling again (HAProxy's map
        # follows within a probe round of what GET /v1/tenants shows)
        assert await asyncio.to_thread(wait_until, lambda: _shares(gateway)["heavy"] == 4, 20)
        deadline = asyncio.get_running_loop().time() + 20
        while True:
            attempt = post(HEAVY)
            await _held(triton, SLOW, [*held, attempt])  # taken: held beside the 3
            if not attempt.done():
                break
            refused = attempt.result()
            assert refused.status_code == 429, refused.text
            assert "share in flight (2)" in refused.text, refused.text
            assert asyncio.get_running_loop().time() < deadline, refused.text
            await asyncio.sleep(0.1)
        await _release(triton, SLOW, [*held, attempt])
        answers = [await attempt, *await asyncio.gather(*held)]
    assert [r.status_code for r in answers] == [200] * 4, [r.text for r in answers]


async def test_the_models_bound_refuses_lower_classes_first_never_critical_for_them(
        gateway: GatewayProcess, triton: LocalTriton) -> None:
    url = f"http://{gateway.http_url}/v2/models/{CAPPED}/infer"
    async with httpx.AsyncClient(timeout=60) as client:
        post = _poster(client, url)
        held = [post(BATCH)]
        assert await asyncio.to_thread(wait_until, lambda: _in_flight(gateway, "batch") == 1, 20)
        shed = await post(BATCH)  # sheddable's bound: a third of 3
        assert shed.status_code == 429
        assert shed.json()["error"] == ("overloaded: model 'capped' has 2 requests in the "
                                        "gateway (limit 1)")
        held += [post(PAY), post(PAY)]
        assert await asyncio.to_thread(wait_until, lambda: _in_flight(gateway, "pay") == 2, 20)
        standard = await post(None)  # the default tenant: counts critical's 2 and itself
        assert standard.status_code == 429
        assert standard.json()["error"] == ("overloaded: model 'capped' has 3 requests in the "
                                            "gateway (limit 2)")
        # critical counts critical only: the sheddable request holds none of its room
        held.append(post(PAY))
        await _release(triton, CAPPED, held)
        answers = await asyncio.gather(*held)
    assert [r.status_code for r in answers] == [200] * 4, [r.text for r in answers]


async def test_a_tenant_with_many_refusals_waiting_waits_longer_for_each_alike_on_both_planes(
        gateway: GatewayProcess, triton: LocalTriton) -> None:
    """A tenant refused many times at once (a flood retrying every refusal) waits for
    each refusal its refusals waiting x 1000 / ``refusals_per_s`` (50 ms each here), so
    it is answered about ``refusals_per_s`` refusals a second however many it keeps
    refused; another tenant refused meanwhile waits the delay alone, and a deadline
    bounds the wait to 9/10 of it (RESOURCE_EXHAUSTED, never the client's own
    DEADLINE_EXCEEDED)."""
    delay_s = DEFAULT_REFUSAL_DELAY_MS / 1000
    url = f"http://{gateway.http_url}/v2/models/{SLOW}/infer"
    async with httpx.AsyncClient(timeout=60) as client:
        post = _poster(client, url)
        held = [post(BATCH), post(BATCH)]  # the pool's capacity, held in Triton
        assert await asyncio.to_thread(wait_until, lambda: _in_flight(gateway, "batch") == 2, 20)

        async def timed(key: str) -> tuple[int, float]:
            began = time.monotonic()
            answer = await post(key)
            return answer.status_code, time.monotonic() - began

        flood = [asyncio.create_task(timed(FLOOD)) for _ in range(16)]
        other = await timed(BATCH)  # another tenant refused meanwhile: the delay alone
        short = await asyncio.to_thread(_grpc_refusal, gateway, SLOW, FLOOD, 0.5)
        answers = await asyncio.gather(*flood)
        await _release(triton, SLOW, held)
        assert [r.status_code for r in await asyncio.gather(*held)] == [200, 200]
    assert {status for status, _ in answers} == {429}
    took = sorted(t for _, t in answers)
    assert took[0] >= 0.9 * delay_s, took
    # 16 refused together: the later ones counted the earlier ones waiting
    assert took[-1] >= 6 * delay_s, took
    assert other[0] == 429 and 0.9 * delay_s <= other[1] < took[-1], (other, took)
    status, message, waited = short  # beyond 9/10 of its deadline were it not bounded
    assert status == "StatusCode.RESOURCE_EXHAUSTED", (status, message, waited)
    assert waited >= 0.9 * delay_s, waited


@pytest.mark.parametrize("width", [TINY_WIDTH, 4096, 150_000], ids=["small", "large", "huge"])
async def test_refusals_waiting_longer_hold_no_other_stream_of_their_connection(
        gateway: GatewayProcess, triton: LocalTriton, width: int) -> None:
    """HTTP/2 carries many streams on one connection: a flood's refusals waiting their
    longer delay on it hold none of the others. A critical request sent on the same
    connection after 16 refusals is answered before the last of them, whether their
    messages are small, larger than half of HAProxy's buffer (16 KB) or many buffers
    long (600 KB), and the 16 wait longer the more of them wait, whatever their size
    (HAProxy's plane once slept in Lua for the part of the wait beyond its frontend's
    tarpit: for 600 KB messages the connection stalled behind them, the 16 were reset,
    ``CANCELLED``, one every 50 ms, and the critical request answered after them; so
    such messages waited the frontend's tarpit alone, 50 ms, however many waited)."""
    delay_s = DEFAULT_REFUSAL_DELAY_MS / 1000
    url = f"http://{gateway.http_url}/v2/models/{SLOW}/infer"
    refused = grpc_request_bytes(SLOW, np.ones((1, width), np.float32), "x")
    critical = grpc_request_bytes(TINY_MODEL_NAME, np.ones((1, TINY_WIDTH), np.float32), "x")
    ended: list[tuple[str, str]] = []  # (key, status) in the order of their answers
    took: list[float] = []  # seconds until each refusal's answer
    async with httpx.AsyncClient(timeout=60) as client:
        post = _poster(client, url)
        held = [post(BATCH), post(BATCH)]  # the pool's capacity, held in Triton
        assert await asyncio.to_thread(wait_until, lambda: _in_flight(gateway, "batch") == 2, 20)
        async with grpc.aio.insecure_channel(gateway.grpc_url) as channel:
            infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")

            async def call(message: bytes, key: str) -> None:
                began = time.monotonic()
                try:
                    await infer(message, metadata=(("x-api-key", key),), timeout=30)
                    ended.append((key, "OK"))
                except grpc.aio.AioRpcError as exc:
                    ended.append((key, exc.code().name))
                    took.append(time.monotonic() - began)

            await call(critical, PAY)  # the connection up before the flood
            flood = [asyncio.create_task(call(refused, FLOOD)) for _ in range(16)]
            await asyncio.sleep(0.02)  # (sent: they wait their delays)
            await call(critical, PAY)
            await asyncio.gather(*flood)
        await _release(triton, SLOW, held)
        assert [r.status_code for r in await asyncio.gather(*held)] == [200, 200]
    assert ended[0] == (PAY, "OK") and sorted(set(ended[1:])) == [
        (FLOOD, "RESOURCE_EXHAUSTED"), (PAY, "OK")], ended
    assert ended.index((PAY, "OK"), 1) < len(ended) - 1, ended
    # 16 refused together: the later ones counted the earlier ones waiting (50 ms each)
    assert len(took) == 16 and max(took) >= 6 * delay_s, sorted(took)


def _grpc_refusal(gw: GatewayProcess, model: str, key: str,
                  timeout_s: float | None = None) -> tuple[str, str, float]:
    """A gRPC ModelInfer's status, message and seconds until its answer."""
    client = grpcclient.InferenceServerClient(gw.grpc_url)
    try:
        inp = grpcclient.InferInput("x", [1, TINY_WIDTH], "FP32")
        inp.set_data_from_numpy(np.ones((1, TINY_WIDTH), np.float32))
        began = time.monotonic()
        try:
            client.infer(model, [inp], headers={"x-api-key": key}, client_timeout=timeout_s)
        except InferenceServerException as exc:
            return str(exc.status()), str(exc.message()), time.monotonic() - began
        return "OK", "", time.monotonic() - began
    finally:
        client.close()


async def test_a_refusal_is_answered_after_the_delay_alike_over_http_and_grpc(
        gateway: GatewayProcess, triton: LocalTriton) -> None:
    """The default refusal delay (a tarpit): the same status and message as at once,
    no sooner than the delay, on both protocols; a deadline with no room for the delay
    within 9/10 of it is still told RESOURCE_EXHAUSTED (answered at once), not its own
    DEADLINE_EXCEEDED; a limited tenant's refusals waiting are not in flight."""
    delay_s = DEFAULT_REFUSAL_DELAY_MS / 1000
    saturated = ("pool 'p' is saturated: load 2 for capacity 2; sheddable requests are "
                 "refused from load 2")
    url = f"http://{gateway.http_url}/v2/models/{SLOW}/infer"
    async with httpx.AsyncClient(timeout=60) as client:
        post = _poster(client, url)
        held = [post(BATCH), post(BATCH)]  # the pool's capacity, held in Triton
        assert await asyncio.to_thread(wait_until, lambda: _in_flight(gateway, "batch") == 2, 20)
        began = time.monotonic()
        shed = await post(BATCH)
        took = time.monotonic() - began
        assert (shed.status_code, shed.json()["error"]) == (429, saturated)
        assert shed.headers["retry-after"] == "1" and took >= 0.9 * delay_s, took
        status, message, took = await asyncio.to_thread(_grpc_refusal, gateway, SLOW, BATCH)
        assert (status, message) == ("StatusCode.RESOURCE_EXHAUSTED", saturated)
        assert took >= 0.9 * delay_s, took
        short = delay_s * 10 / 9 - 0.001  # 9/10 of it leaves no room for the delay
        status, message, _ = await asyncio.to_thread(_grpc_refusal, gateway, SLOW, BATCH, short)
        assert (status, message) == ("StatusCode.RESOURCE_EXHAUSTED", saturated)
        held += [post(PAY) for _ in range(3)]  # critical, its limit (3) in flight
        assert await asyncio.to_thread(wait_until, lambda: _in_flight(gateway, "pay") == 3, 20)
        # refused together: none counts the others waiting for their answers
        limited = await asyncio.gather(*(post(PAY) for _ in range(3)))
        assert {(r.status_code, r.json()["error"]) for r in limited} == {
            (429, "tenant 'pay' has 4 requests in flight (its limit 3)")}
        # a refused arrival still makes its tenant active (it takes its share at once
        # when the pool has room again), though it never was in flight
        assert (await post(QUIET)).status_code == 429  # load 5: the standard ceiling is 4
        assert await asyncio.to_thread(wait_until, lambda: "quiet" in _active(gateway), 20)
        await _release(triton, SLOW, held)
        answers = await asyncio.gather(*held)
    assert [r.status_code for r in answers] == [200] * 5
