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
