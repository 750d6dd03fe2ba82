"""A data-plane replica (HAProxy + agent, as in Kubernetes) with tenancy on: it lends the
room of idle tenants by the tenants it sees itself (the control plane sees none of the
replica's traffic), and its ``/metrics`` label in-flight requests by model and pool
(``st_route``'s keys carry the tenant too: ``model/pool/tenant``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from converters.tiny import TINY_MODEL_NAME, TINY_WIDTH, build_tiny_model
from infergate.processes import AgentProcess, run_agent
from tests.conftest import triton_settings
from tests.gateway.conftest import haproxy_share
from tests.procs import pools_yaml, run_gateway, started_triton, wait_until

pytestmark = [pytest.mark.integration]
HELD, HOLD_S = "held", 6.0
HEAVY, LIGHT = "heavy-key-0123456789", "light-key-0123456789"


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    tmp = tmp_path_factory.mktemp("agent-tenancy")
    repo = tmp / "model_repo"
    build_tiny_model(repo)
    build_tiny_model(repo, HELD, max_queue_delay_us=int(HOLD_S * 1e6))
    with started_triton(triton_settings(repo, tmp, TINY_MODEL_NAME, HELD)) as triton:
        assert triton.endpoints is not None
        pools = pools_yaml(tmp / "pools.yaml", {"p": [triton.endpoints]}, capacity_per_member=2)
        tenants = tmp / "tenants.yaml"
        tenants.write_text(yaml.safe_dump({"tenants": [{"name": "heavy", "keys": [HEAVY]},
                                                       {"name": "light", "keys": [LIGHT]}]}))
        with run_gateway(pools, tmp, "--tenants", str(tenants), data_plane="none") as control, \
                run_agent(control, tmp / "agent") as replica:
            yield replica


def _body() -> bytes:
    return json.dumps({"inputs": [{"name": "x", "shape": [1, TINY_WIDTH], "datatype": "FP32",
                                   "data": [1.0] * TINY_WIDTH}]}).encode()


def _share(agent: AgentProcess, tenant: str) -> int:
    """The share this replica's HAProxy holds for ``tenant`` in pool p (its map)."""
    return haproxy_share(agent.log.parent / "haproxy", "p", tenant)


def _in_flight(agent: AgentProcess) -> dict[tuple[str, str], float]:
    text = httpx.get(f"http://127.0.0.1:{agent.status_port}/metrics").text
    return {(s.labels["model"], s.labels["pool"]): s.value
            for f in text_string_to_metric_families(text)
            if f.name == "infergate_in_flight_requests" for s in f.samples}


async def test_a_replica_shares_among_the_tenants_it_sees_and_labels_by_model_and_pool(
        agent: AgentProcess) -> None:
    base = f"http://{agent.http_url}"
    done = asyncio.Event()
    async with httpx.AsyncClient(timeout=60) as client:
        def post(key: str, model: str = HELD) -> asyncio.Task[httpx.Response]:
            return asyncio.create_task(client.post(f"{base}/v2/models/{model}/infer",
                                                   content=_body(), headers={"x-api-key": key}))

        async def light_sends() -> None:
            while not done.is_set():
                answer = await post(LIGHT, TINY_MODEL_NAME)
                assert answer.status_code == 200, answer.text
                await asyncio.sleep(0.2)

        assert _share(agent, "heavy") == 4  # nobody active: the whole standard ceiling
        held = [post(HEAVY), post(HEAVY)]  # the pool's capacity, held in Triton
        assert await asyncio.to_thread(
            wait_until, lambda: _in_flight(agent).get((HELD, "p")) == 2, 20), _in_flight(agent)
        light = asyncio.create_task(light_sends())
        # light is active at this replica (the control plane sees none of it): heavy's
        # share is half the standard ceiling
        assert await asyncio.to_thread(wait_until, lambda: _share(agent, "heavy") == 2, 20)
        refused = await post(HEAVY)
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"] == ("pool 'p' is saturated (load 2 for capacity 2) and "
                                           "tenant 'heavy' has its share in flight (2)")
        done.set()
        await light
        answers = await asyncio.gather(*held)
    assert all(r.status_code == 200 for r in answers), [r.text for r in answers]
    assert set(_in_flight(agent)) <= {(HELD, "p"), (TINY_MODEL_NAME, "p")}
