"""One console stack per test module: a real Triton serving the tiny model, the real
scheduler service (a process, holding a plan of its example fleet) and a real gateway
process with uploads on, tokens of every scope and ``--scheduler-url`` set; plus a
sign-in helper for plain HTTP clients."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from converters.tiny import TINY_MODEL_NAME, build_tiny_model
from infergate.processes import ROOT, run_gateway, stop_process, wait_until
from infergate.triton.local import free_port
from scheduler.request import load_request
from tests.conftest import triton_settings
from tests.gateway.lifecycle.conftest import TOKENS, lifecycle_config
from tests.procs import started_triton

EXAMPLES = ROOT / "scheduler" / "examples"
MAX_MODEL_BYTES = 200_000  # the console's oversized-upload case passes it


@dataclass(frozen=True)
class ConsoleStack:
    url: str  # the gateway's HTTP address: the console is at url + "/ui"
    scheduler: str
    plan_id: str
    repo: Path
    log_dir: Path


@contextlib.contextmanager
def scheduler_process(log_dir: Path) -> Iterator[str]:
    port = free_port()
    log = (log_dir / "scheduler.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "scheduler", "serve", "--host", "127.0.0.1",
                             "--port", str(port)], cwd=ROOT, stdout=log,
                            stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        def up() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"scheduler exited: {(log_dir / 'scheduler.log').read_text()}")
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
            return False

        assert wait_until(up, 60, 0.05), "the scheduler did not start"
        yield url
    finally:
        stop_process(proc)
        log.close()


def example_plan(scheduler: str) -> str:
    request = load_request(EXAMPLES / "fleet.yaml", EXAMPLES / "pools.yaml")
    body = request.model_dump(mode="json")
    body["options"]["solver"] = "heuristic"  # fast and deterministic
    answer = httpx.post(f"{scheduler}/v1/plans", json=body, timeout=60)
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


@contextlib.contextmanager
def console_stack(tmp: Path, data_plane: str = "haproxy",
                  prepare: Callable[[Path], None] | None = None) -> Iterator[ConsoleStack]:
    """``prepare``: more in the repository (the tiny model is there) before Triton starts."""
    repo = tmp / "model_repo"
    build_tiny_model(repo)
    if prepare is not None:
        prepare(repo)
    with started_triton(triton_settings(repo, tmp, TINY_MODEL_NAME)) as triton, \
            scheduler_process(tmp) as scheduler:
        assert triton.endpoints is not None
        plan_id = example_plan(scheduler)
        config = lifecycle_config(tmp / "gateway.yaml", {"local": [triton.endpoints]}, repo,
                                  lifecycle={"limits": {"max_model_bytes": MAX_MODEL_BYTES}})
        with run_gateway(config, tmp, "--scheduler-url", scheduler,
                         data_plane=data_plane) as gateway:
            yield ConsoleStack(f"http://{gateway.http_url}", scheduler, plan_id, repo, tmp)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleStack]:
    with console_stack(tmp_path_factory.mktemp("console")) as running:
        yield running


CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@contextlib.contextmanager
def signed_in(url: str, scope: str) -> Iterator[httpx.Client]:
    """A client holding a console session of ``scope``'s token."""
    with httpx.Client(base_url=url, timeout=60, trust_env=False) as client:
        answer = client.post("/ui/signin", data={"token": TOKENS[scope], "next": "/ui/models"})
        assert answer.status_code == 303, answer.text
        yield client


def csrf_of(client: httpx.Client, path: str = "/ui/models") -> str:
    match = CSRF.search(client.get(path).text)
    assert match, f"no CSRF token on {path}"
    return match.group(1)


GIB = 1024**3
MEMBER_A, MEMBER_B = "10.0.0.1:8001", "10.0.0.2:8001"


def holding(model: str, state: str, for_s: float, reason: str, footprint: int,
            waiting: int = 0) -> dict[str, Any]:
    return {"model": model, "state": state, "for_s": for_s, "reason": reason,
            "footprint_bytes": footprint, "waiting": waiting}


def residency_report(used_a: int = int(0.98 * 4 * GIB),
                     failure: str = "out of memory: CUDA error",
                     room: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A report of the shape ``GET /v1/residency`` serves with one state machine per
    holding (issue 34): pool ``cpu`` (budget 4 GiB, 512 MiB of it headroom) of two
    members; on A ``hot`` resident, ``warm`` loading (3 waiting), ``next`` queued (5
    waiting); on B ``hot`` warming, ``old`` draining, ``gone`` unloading, ``bad`` failed
    (``failure``); ``cold`` held nowhere. 8 requests wait for loads in the pool, and
    those of ``room`` (the pool's ``waiting_for_room``, none by default) for room."""
    held = {MEMBER_A: [holding("hot", "resident", 185.0, "demand", 2 * GIB),
                       holding("next", "queued", 2.0, "miss: no load slot free", GIB, 5),
                       holding("warm", "loading", 4.0, "miss", GIB, 3)],
            MEMBER_B: [holding("bad", "failed", 7300.0, failure, GIB // 2),
                       holding("gone", "unloading", 0.5, "idle", GIB // 4),
                       holding("hot", "warming", 1.5, "demand", 2 * GIB),
                       holding("old", "draining", 20.0, "room for warm", GIB)]}
    used = {MEMBER_A: used_a, MEMBER_B: int(3.25 * GIB)}
    slots = {MEMBER_A: 1, MEMBER_B: 2}
    members = [{"key": key, "available": True, "budget_bytes": 4 * GIB,
                "usable_bytes": 4 * GIB - GIB // 2, "used_bytes": used[key],
                "load_slots": slots[key], "models": models} for key, models in held.items()]
    models: dict[str, Any] = {}
    for name in ("bad", "cold", "gone", "hot", "next", "old", "warm"):
        mine = [{"member": key, **{k: h[k] for k in ("state", "for_s", "reason", "waiting")}}
                for key, models_held in held.items() for h in models_held
                if h["model"] == name]
        models[name] = {
            "pool": "cpu", "on_demand": True, "min_replicas": 0, "footprint_bytes": GIB,
            "footprint_source": "measured", "demand_rps": 1.5 if name == "hot" else 0.0,
            "last_used_s_ago": 0.5 if mine else None,
            "members": [h["member"] for h in mine if h["state"] == "resident"],
            "waiting": sum(h["waiting"] for h in mine), "holdings": mine}
    return {"enabled": True, "pools": [{
        "name": "cpu", "budget_bytes": 4 * GIB, "headroom_bytes": GIB // 2,
        "usable_bytes": 4 * GIB - GIB // 2,
        "waiting": 8 + sum(f["waiting"] for f in room or []),
        "waiting_for_room": room or [], "members": members}],
        "models": models}
