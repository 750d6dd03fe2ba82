"""Keep-warm: the decision (pure), what reaches members (in-process), and the effect on
two real Triton members (pinged while idle, left alone while busy)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any
from unittest.mock import create_autospec

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.grpc import model_config_pb2 as mc

from converters.tiny import TINY_MODEL_NAME
from gateway.config import GatewayConfig
from gateway.config.lifecycle import KeepWarmPolicy
from gateway.config.pools import MemberSpec, PoolSpec
from gateway.core import Core
from gateway.lifecycle.warmup.keepwarm import KeepWarm, due_models
from gateway.upstream.triton import MemberAdmin
from infergate.triton.local import TritonEndpoints
from tests.conftest import triton_settings
from tests.gateway.lifecycle.conftest import stop
from tests.procs import pools_yaml, run_gateway, started_triton, wait_until

POLICY = KeepWarmPolicy(interval_s=10, idle_after_s=30, batch_sizes=(1, 4))


def test_due_models_pings_only_idle_models_when_interval_passed() -> None:
    policies = {"idle": POLICY, "busy": POLICY, "just-pinged": POLICY, "never-used": POLICY}
    last_request = {"idle": 0.0, "busy": 95.0, "just-pinged": 0.0}
    last_ping = {"just-pinged": 95.0}
    assert due_models(policies, last_request, last_ping, now=100.0) == ["idle", "never-used"]


def test_due_models_empty_when_no_policy() -> None:
    assert due_models({}, {"m": 0.0}, {}, now=1e9) == []


def _config() -> mc.ModelConfig:
    config = mc.ModelConfig(name="m", max_batch_size=2)
    config.input.add(name="x", data_type=mc.TYPE_FP32, dims=[16])
    config.output.add(name="y", data_type=mc.TYPE_FP32, dims=[16])
    return config


def test_keepwarm_reaches_every_member_labelled_warmup_when_model_idle() -> None:
    config = GatewayConfig(pools=(
        PoolSpec(name="a", members=(MemberSpec(grpc_port=1), MemberSpec(grpc_port=2))),
        PoolSpec(name="b", members=(MemberSpec(grpc_port=3),)),
    ))
    clock = [1000.0]
    core = Core.for_config(config, clock=lambda: clock[0])
    admin = create_autospec(MemberAdmin, instance=True)
    admin.config.return_value = _config()
    calls: list[tuple[str, int]] = []

    async def infer(member: Any, model: str, version: Any, body: bytes, headers: Any) -> Any:
        calls.append((member.key, int(body.split(b'"shape": [')[1].split(b",")[0])))
        return 200, b"{}"

    admin.infer.side_effect = infer
    keepwarm = KeepWarm(core, admin, lambda: {"m": POLICY})

    async def scenario() -> None:
        await keepwarm.tick()  # idle since forever: ping
        clock[0] += 5
        await keepwarm.tick()  # interval not passed
        core.state.note_used("m", clock[0])
        clock[0] += 10
        await keepwarm.tick()  # busy 10 s ago: no ping

    asyncio.run(scenario())
    # every member, batch sizes within max_batch_size (4 > 2 is skipped), once
    assert sorted(calls) == [("127.0.0.1:1", 1), ("127.0.0.1:2", 1), ("127.0.0.1:3", 1)]
    families = {f.name: f for f in text_string_to_metric_families(
        core.metrics.render().decode())}
    warm = [s for s in families["infergate_requests"].samples
            if s.name.endswith("_total") and s.labels["traffic"] == "warmup"]
    assert sum(s.value for s in warm) == 3
    assert not [s for s in families["infergate_requests"].samples
                if s.labels.get("traffic") == "user"]


def _inference_count(endpoints: TritonEndpoints) -> int:
    stats = httpx.get(f"http://{endpoints.http_url}/v2/models/{TINY_MODEL_NAME}/stats").json()
    return int(stats["model_stats"][0]["inference_count"])


def _warmup_requests(url: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    return sum(s.value for f in text_string_to_metric_families(text)
               if f.name == "infergate_requests" for s in f.samples
               if s.name.endswith("_total") and s.labels.get("traffic") == "warmup")


@pytest.mark.integration
def test_keepwarm_pings_every_member_while_idle_and_stops_when_busy(
    tiny_repo: Path, tmp_path: Path, steady_load: Any
) -> None:
    with contextlib.ExitStack() as stack:
        members = [stack.enter_context(started_triton(triton_settings(
            tiny_repo, tmp_path / f"t{i}", TINY_MODEL_NAME))) for i in range(2)]
        endpoints = [m.endpoints for m in members if m.endpoints is not None]
        config = tmp_path / "gateway.yaml"
        pools_yaml(config, {"local": endpoints})
        data = yaml.safe_load(config.read_text())
        data["models"] = {TINY_MODEL_NAME: {"keep_warm": {
            "interval_s": 0.3, "idle_after_s": 1.0, "batch_sizes": [1, 4]}}}
        config.write_text(yaml.safe_dump(data))
        with run_gateway(config, tmp_path) as gw:
            url = f"http://{gw.http_url}"
            before = [_inference_count(e) for e in endpoints]
            # idle: every member gets batch 1 and batch 4 requests, repeatedly
            assert wait_until(lambda: all(_inference_count(e) >= b + 10
                                          for e, b in zip(endpoints, before, strict=True)), 10)
            # busy: user traffic keeps it warm, keep-warm holds off. A claim about what
            # does *not* happen needs a window; it is measured in the load's answers (so a
            # slow machine stretches it) and spans many keep-warm looks (every 0.15 s).
            load = steady_load(url)
            assert wait_until(lambda: len(load.answers) >= 5, 30)  # the load has arrived
            warm_busy, answers, since = _warmup_requests(url), len(load.answers), time.monotonic()
            assert wait_until(lambda: len(load.answers) >= answers + 100
                              and time.monotonic() - since >= 10 * 0.3, 60)
            # at most the round (batch 1 and 4, two members) that was under way
            assert _warmup_requests(url) - warm_busy <= 4
            stop(load)
            assert load.failures == []
            # idle again: pings resume once idle_after_s has passed
            warm_idle = _warmup_requests(url)
            assert wait_until(lambda: _warmup_requests(url) >= warm_idle + 8, 10)
