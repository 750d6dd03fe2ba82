"""MemberAdmin's repository calls on a real tritonserver, over its gRPC port: a load
with a config override, an unload, the index as Triton's HTTP answer has it, a refused
load's message, an unreachable member, a load past its deadline, the channel of a member
gone closed once its calls end; the metrics page."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest

from converters.tiny import TINY_MODEL_NAME, build_tiny_model
from gateway.config.pools import MemberSpec
from gateway.errors import DeployFailed, Unavailable
from gateway.pools import PoolMember
from gateway.upstream.triton import MemberAdmin
from infergate.triton.local import TritonEndpoints, free_port
from tests.conftest import triton_settings
from tests.procs import started_triton, wait_until

pytestmark = pytest.mark.integration

OTHER, BROKEN = "other", "broken"


@pytest.fixture(scope="module")
def endpoints(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonEndpoints]:
    """A Triton in explicit model control holding ``tiny``; ``other`` and ``broken`` (a
    model file that is no ONNX model) in its repository, not loaded."""
    repo = tmp_path_factory.mktemp("admin") / "model_repo"
    build_tiny_model(repo)
    build_tiny_model(repo, OTHER)
    build_tiny_model(repo, BROKEN)
    (repo / BROKEN / "1" / "model.onnx").write_bytes(b"not an ONNX model")
    settings = triton_settings(repo, tmp_path_factory.mktemp("triton"), TINY_MODEL_NAME)
    with started_triton(settings) as server:
        assert server.endpoints is not None
        yield server.endpoints


def grpc_only(e: TritonEndpoints) -> PoolMember:
    """The member with its HTTP port pointed at nothing: what works went over gRPC."""
    return PoolMember("p", MemberSpec(host=e.host, http_port=free_port(),
                                      grpc_port=e.grpc_port, metrics_port=e.metrics_port))


def http_config(e: TritonEndpoints, model: str) -> dict[str, Any]:
    answer = httpx.get(f"http://{e.http_url}/v2/models/{model}/config", timeout=10)
    assert answer.status_code == 200, answer.text
    config: dict[str, Any] = answer.json()
    return config


def http_index(e: TritonEndpoints) -> list[dict[str, object]]:
    index: list[dict[str, object]] = httpx.post(f"http://{e.http_url}/v2/repository/index",
                                                json={}, timeout=10).json()
    return index


def states(index: list[dict[str, object]]) -> dict[object, object]:
    return {e["name"]: e.get("state") for e in index}


@pytest.fixture
async def make_admin() -> AsyncIterator[Callable[..., MemberAdmin]]:
    """MemberAdmins over an HTTP client of their own, closed (channels and client) after
    the test."""
    made: list[MemberAdmin] = []

    def make(http_timeout_s: float = 10, load_timeout_s: float = 600.0,
             call_timeout_s: float = 60.0,
             live_targets: Callable[[], set[str]] | None = None) -> MemberAdmin:
        made.append(MemberAdmin(httpx.AsyncClient(timeout=http_timeout_s),
                                load_timeout_s=load_timeout_s, call_timeout_s=call_timeout_s,
                                live_targets=live_targets))
        return made[-1]

    yield make
    for admin in made:
        await admin.close()
        await admin.client.aclose()


async def test_member_admin_loads_indexes_and_unloads_over_grpc_when_http_is_closed(
        endpoints: TritonEndpoints, make_admin: Callable[..., MemberAdmin]) -> None:
    admin = make_admin()
    member = grpc_only(endpoints)
    config: dict[str, Any] = http_config(endpoints, TINY_MODEL_NAME) | {"name": OTHER}
    config["dynamic_batching"]["max_queue_delay_microseconds"] = 1234
    await admin.load(member, OTHER, config)
    loaded = http_config(endpoints, OTHER)["dynamic_batching"]
    assert loaded["max_queue_delay_microseconds"] == 1234  # the override
    index = await admin.repository_index(member)
    assert states(index) == {TINY_MODEL_NAME: "READY", OTHER: "READY", BROKEN: None}
    # as Triton's HTTP answer: a model never loaded has its name alone
    assert {"name": BROKEN} in index
    assert {"name": OTHER, "version": "1", "state": "READY"} in index
    ready = await admin.repository_index(member, ready=True)
    assert {e["name"] for e in ready} == {TINY_MODEL_NAME, OTHER}

    await admin.unload(member, OTHER)
    assert wait_until(lambda: states(http_index(endpoints))[OTHER] == "UNAVAILABLE", 30)
    # the gRPC index says what the HTTP one says, entry for entry
    assert sorted(await admin.repository_index(member), key=str) == sorted(
        http_index(endpoints), key=str)


async def test_member_admin_load_is_deploy_failed_with_tritons_message_when_refused(
        endpoints: TritonEndpoints, make_admin: Callable[..., MemberAdmin]) -> None:
    admin = make_admin()
    member = grpc_only(endpoints)
    with pytest.raises(DeployFailed) as broken:
        await admin.load(member, BROKEN)
    assert broken.value.message.startswith(f"{member.key}: loading '{BROKEN}' failed: ")
    assert "load failed for model 'broken'" in broken.value.message
    with pytest.raises(DeployFailed) as absent:
        await admin.load(member, "absent")
    assert "failed to load 'absent'" in absent.value.message
    assert states(await admin.repository_index(member))[TINY_MODEL_NAME] == "READY"


async def test_member_admin_is_unavailable_when_the_member_is_unreachable(
        make_admin: Callable[..., MemberAdmin]) -> None:
    admin = make_admin(2, load_timeout_s=5, call_timeout_s=5)
    nobody = PoolMember("p", MemberSpec(host="127.0.0.1", http_port=free_port(),
                                        grpc_port=free_port(), metrics_port=free_port()))
    for call in (admin.load(nobody, TINY_MODEL_NAME), admin.unload(nobody, "m"),
                 admin.repository_index(nobody), admin.metrics_text(nobody)):
        with pytest.raises(Unavailable) as info:
            await call
        assert nobody.key in info.value.message


async def test_member_admin_load_is_unavailable_when_it_outlasts_load_timeout(
        endpoints: TritonEndpoints, make_admin: Callable[..., MemberAdmin]) -> None:
    admin = make_admin(load_timeout_s=0.001)
    member = grpc_only(endpoints)
    try:
        with pytest.raises(Unavailable) as info:
            await admin.load(member, OTHER)
        assert "DEADLINE_EXCEEDED" in info.value.message
    finally:
        admin.load_timeout_s = 60.0  # Triton goes on loading: leave it unloaded
        assert wait_until(lambda: states(http_index(endpoints))[OTHER] != "LOADING", 30)
        await admin.unload(member, OTHER)


async def test_member_admin_keeps_one_channel_per_member_until_closed(
        endpoints: TritonEndpoints, make_admin: Callable[..., MemberAdmin]) -> None:
    admin = make_admin()
    member = grpc_only(endpoints)
    for _ in range(3):
        await admin.repository_index(member)
    await admin.repository_index(PoolMember("q", member.spec))  # another pool, same
    assert len(admin._channels) == 1
    await admin.close()
    assert admin._channels == {}
    with pytest.raises(Unavailable, match="closed"):
        await admin.repository_index(member)


async def test_member_admin_closes_the_channel_of_a_member_gone_once_its_calls_end(
        endpoints: TritonEndpoints, make_admin: Callable[..., MemberAdmin]) -> None:
    """A DNS pool's pod replaced comes back at a new address: the old address's channel
    is closed when the new one's opens, and a load still running on it ends first."""
    live: set[str] = set()
    admin = make_admin(live_targets=lambda: live)
    old = grpc_only(endpoints)
    # the same Triton at another address: the member as it came back
    new = PoolMember("p", MemberSpec(host="localhost", http_port=old.spec.http_port,
                                     grpc_port=endpoints.grpc_port,
                                     metrics_port=endpoints.metrics_port))
    live.add(old.spec.grpc_address)
    await admin.repository_index(old)
    loading = asyncio.ensure_future(admin.load(old, OTHER))
    assert await asyncio.to_thread(  # (the loop runs on: the load is sent)
        wait_until, lambda: states(http_index(endpoints))[OTHER] == "LOADING", 30)
    live.clear()
    live.add(new.spec.grpc_address)
    await admin.repository_index(new)
    assert admin.targets == {new.spec.grpc_address}
    await loading  # its channel closed with a grace: the load in flight ended first
    assert states(http_index(endpoints))[OTHER] == "READY"
    for _ in range(200):  # the channel's close ends once its calls have
        if not admin._retiring:
            break
        await asyncio.sleep(0.05)
    assert not admin._retiring
    await admin.unload(new, OTHER)
    assert wait_until(lambda: states(http_index(endpoints))[OTHER] == "UNAVAILABLE", 30)
    # a member the live set does not name is still called: its channel opens, and the
    # channels of the addresses not named (here the new one's) are retired
    live.clear()
    await admin.repository_index(old)
    assert admin.targets == {old.spec.grpc_address}


async def test_member_admin_metrics_text_is_the_members_page_when_it_is_up(
        endpoints: TritonEndpoints, make_admin: Callable[..., MemberAdmin]) -> None:
    page = await make_admin().metrics_text(grpc_only(endpoints))
    assert f'nv_inference_count{{model="{TINY_MODEL_NAME}",version="1"}}' in page
