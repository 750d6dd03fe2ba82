"""The readiness gate: not ready, and 503 + Retry-After for the model, until preloading
has loaded it; retried when a load fails. In-process, then against a real Triton."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path
from typing import Any
from unittest.mock import create_autospec

import httpx
import pytest
import yaml

from converters.samples import SAMPLE_MODEL_NAME
from converters.tiny import TINY_MODEL_NAME
from gateway.config import GatewayConfig
from gateway.config.pools import MemberSpec, PoolSpec
from gateway.control.model_control import ModelControl
from gateway.core import Core
from gateway.errors import Unavailable
from gateway.lifecycle.warmup.preload import Preloader, ServedOnMembers
from gateway.python.forwarder import Forwarder
from gateway.upstream.http import UpstreamHTTP, UpstreamResponse
from gateway.upstream.triton import MemberAdmin
from tests.conftest import triton_settings
from tests.gateway.conftest import gateway_app
from tests.gateway.lifecycle.conftest import eventually, spawn_gateway
from tests.procs import pools_yaml, started_triton


def _gateway() -> tuple[Forwarder, Any]:
    config = GatewayConfig(pools=(PoolSpec(name="p", members=(MemberSpec(),)),))
    dataplane = Forwarder.for_config(config)
    upstream = create_autospec(UpstreamHTTP, instance=True)

    async def answer(*args: Any, **kwargs: Any) -> UpstreamResponse:
        return UpstreamResponse(200, b"{}", [])

    upstream.request.side_effect = answer
    control = ModelControl(
        dataplane.core, MemberAdmin(create_autospec(httpx.AsyncClient, instance=True)))
    return dataplane, gateway_app(dataplane, control, upstream)


def test_gateway_unready_and_model_503_while_preloading_then_ready_when_loaded() -> None:
    async def scenario() -> list[tuple[int, int, str | None]]:
        dataplane, app = _gateway()
        release = asyncio.Event()
        loads: list[str] = []

        async def load(model: str) -> None:
            loads.append(model)
            if len(loads) == 1:
                raise Unavailable("member not up yet")  # retried with back-off
            await release.wait()

        preloader = Preloader(dataplane.core, load, first_backoff_s=0.01)
        task = asyncio.create_task(preloader.run(["m"]))
        seen = []
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            for step in range(2):
                if step == 0:
                    await eventually(lambda: len(loads) == 2)  # retrying after a failure
                ready = await client.get("/v2/health/ready")
                infer = await client.post("/v2/models/m/infer", content=b"{}")
                other = await client.post("/v2/models/other/infer", content=b"{}")
                seen.append((ready.status_code, infer.status_code,
                             infer.headers.get("retry-after")))
                assert other.status_code == 200  # models not preloading are served
                if step == 0:
                    release.set()
                    await task
        assert loads == ["m", "m"]
        return seen

    seen = asyncio.run(scenario())
    assert seen[0] == (503, 503, "2")
    assert seen[1] == (200, 200, None)


def test_gateway_ready_at_once_when_nothing_to_preload() -> None:
    async def scenario() -> bool:
        dataplane, _ = _gateway()
        await Preloader(dataplane.core, lambda m: asyncio.sleep(0)).run([])
        return dataplane.state.ready()

    assert asyncio.run(scenario())


@pytest.mark.integration
def test_gateway_reports_ready_only_after_preloading_into_real_triton(
    sample_repo: Path, tmp_path: Path
) -> None:
    repo = tmp_path / "model_repo"
    for model in (SAMPLE_MODEL_NAME, TINY_MODEL_NAME):
        shutil.copytree(sample_repo / model, repo / model)
    with started_triton(triton_settings(repo, tmp_path)) as triton:  # starts with no model
        assert triton.endpoints is not None
        config = tmp_path / "gateway.yaml"
        pools_yaml(config, {"local": [triton.endpoints]})
        data = yaml.safe_load(config.read_text())
        data["models"] = {SAMPLE_MODEL_NAME: {"preload": True}, TINY_MODEL_NAME: {"preload": True}}
        config.write_text(yaml.safe_dump(data))
        body = {"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32",
                            "data": [1.0] * 16}]}
        with spawn_gateway(config, tmp_path) as gw:
            url = f"http://{gw.http_url}"
            seen: list[tuple[int, int, str | None]] = []
            deadline = time.monotonic() + 120
            while True:
                ready = httpx.get(f"{url}/v2/health/ready").status_code
                infer = httpx.post(f"{url}/v2/models/{TINY_MODEL_NAME}/infer", json=body)
                seen.append((ready, infer.status_code, infer.headers.get("retry-after")))
                if ready == 200:
                    break
                assert time.monotonic() < deadline, "never became ready"
                time.sleep(0.01)  # polling pace, not a wait for something
            index = httpx.post(f"http://{triton.endpoints.http_url}/v2/repository/index").json()
            assert {(m["name"], m.get("state")) for m in index} == {
                (SAMPLE_MODEL_NAME, "READY"), (TINY_MODEL_NAME, "READY")}
        # ready only once both models are READY in Triton (the index above, read at the
        # first 200). The data-plane replica that answers readiness starts beside the
        # preload and may be up only once it is over: then no 503 is seen at all
        # (the replica's view is the unit tests' concern: tests/gateway/test_replica.py).
        # While preloading, the model answers 503 + Retry-After, never Triton's 400.
        assert {s[1] for s in seen} <= {503, 200}
        assert all(s[2] for s in seen if s[1] == 503)


def test_preloading_says_which_model_still_loads_when_a_load_takes_long(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        dataplane, _ = _gateway()
        release = asyncio.Event()

        async def load(model: str) -> None:
            await release.wait()

        preloader = Preloader(dataplane.core, load, report_every_s=0.01)
        run = asyncio.create_task(preloader.run(["slow-model"]))
        deadline = time.monotonic() + 10
        while "preloading slow-model: still loading" not in caplog.text:
            assert time.monotonic() < deadline, caplog.text
            await asyncio.sleep(0.01)
        assert not dataplane.state.ready()
        release.set()
        await run
        assert dataplane.state.ready()

    with caplog.at_level("WARNING", logger="gateway.lifecycle.warmup.preload"):
        asyncio.run(scenario())


def _two_members() -> tuple[Core, Any, dict[str, Any]]:
    """Pool ``p`` (members a, b) serves m and n; pool ``q`` (member c) serves o. The
    fake admin answers each member's ready index from ``indexes`` (an exception: raised)."""
    a, b, c = (MemberSpec(grpc_port=port) for port in (8001, 8101, 8201))
    core = Core.for_config(GatewayConfig(pools=(
        PoolSpec(name="p", members=(a, b), models=("m", "n")),
        PoolSpec(name="q", members=(c,), models=("o",)))))
    admin: Any = create_autospec(MemberAdmin, instance=True)
    indexes: dict[str, Any] = {}

    async def index(member: Any, ready: bool = False) -> list[dict[str, Any]]:
        assert ready
        answer = indexes[member.key]
        if isinstance(answer, BaseException):
            raise answer
        return list(answer)

    admin.repository_index.side_effect = index
    return core, admin, indexes


def _ready(name: str, version: str = "1") -> dict[str, Any]:
    return {"name": name, "version": version, "state": "READY"}


def test_served_on_members_counts_a_model_ready_on_every_member_that_answers() -> None:
    core, admin, indexes = _two_members()
    indexes["127.0.0.1:8001"] = [_ready("m"), _ready("n", "2")]
    indexes["127.0.0.1:8101"] = [_ready("m"), _ready("n", "3")]
    indexes["127.0.0.1:8201"] = Unavailable("member down")  # not held against o...
    served = asyncio.run(ServedOnMembers(core, admin)(["m", "n", "o"]))
    assert served == {"m", "n"}  # ...but no member answered for it
    by_version = ServedOnMembers(core, admin, {"m": 1, "n": 2}.get)
    assert asyncio.run(by_version(["m", "n"])) == {"m"}  # n's serving version 2: not on b
    indexes["127.0.0.1:8101"] = [_ready("n", "2")]  # b lost m (a restarted Triton)
    assert asyncio.run(ServedOnMembers(core, admin)(["m", "n"])) == {"n"}


def test_preload_marks_only_models_not_served_not_ready_when_control_plane_restarts() -> None:
    core, admin, indexes = _two_members()
    indexes["127.0.0.1:8001"] = indexes["127.0.0.1:8101"] = [_ready("m")]
    indexes["127.0.0.1:8201"] = []

    async def scenario() -> dict[str, str | None]:
        release = asyncio.Event()

        async def load(model: str) -> None:
            await release.wait()

        preloader = Preloader(core, load, served=ServedOnMembers(core, admin))
        run = asyncio.create_task(preloader.run(["m", "o"]))
        await eventually(lambda: admin.repository_index.await_count == 3)
        await asyncio.sleep(0.05)
        during = {model: core.state.not_ready_reason(model) for model in ("m", "o")}
        assert not core.state.preloaded  # the gateway's readiness still waits
        release.set()
        await run
        assert core.state.preloaded and core.state.not_ready_reason("o") is None
        return during

    during = asyncio.run(scenario())
    assert during == {"m": None, "o": "preloading at gateway start-up"}
