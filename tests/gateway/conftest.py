"""Fixtures for gateway tests that need their own Triton processes."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from aiohttp import web

from converters.tiny import TINY_MODEL_NAME, TINY_WIDTH, build_tiny_model
from gateway.haproxy.runtime import RuntimeAPI
from gateway.pools import PoolMember


@pytest.fixture(scope="module")
def tiny_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("tiny") / "model_repo"
    build_tiny_model(repo)
    return repo


def tiny_infers_over_grpc(grpc_url: str, model: str = TINY_MODEL_NAME) -> bool:
    """One ``y = 2x + 1`` inference through ``grpc_url`` answers 3 for 1."""
    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        x = np.ones((1, TINY_WIDTH), np.float32)
        inp = grpcclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        return bool(client.infer(model, [inp]).as_numpy("y")[0][0] == 3.0)
    finally:
        client.close()


def haproxy_share(run_dir: Path, pool: str, tenant: str) -> int:
    """The share a running HAProxy (its run folder) holds for ``tenant`` in ``pool``: its
    map ``share``, read over the admin socket."""
    shown = RuntimeAPI(run_dir / "admin.sock").query(f"show map {run_dir}/maps/share.map")
    shares = dict(line.split()[1:] for line in shown.splitlines() if line.strip())
    return int(shares[f"{pool}/{tenant}"])


class Held:
    """An upstream call for the Python forwarder's unit tests that waits until released:
    the requests it admitted stay in flight meanwhile (no sockets)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def __call__(self, member: PoolMember) -> str:
        await self.release.wait()
        return "ok"


def gateway_app(dataplane: Any, control: Any, upstream: Any, auth: Any = None,
                lifecycle: Any = None) -> Any:
    """The HTTP app as the assembler builds it: the Python data plane's fast paths in
    front of the control plane's app."""
    from gateway.control.http_app import create_control_app
    from gateway.python.http_api import create_http_app

    return create_http_app(dataplane,
                           create_control_app(dataplane.core, control, upstream, auth,
                                              lifecycle), upstream, auth)


async def generate_member(port: int, handler: Callable[[web.Request], Awaitable[Any]]
                          ) -> web.AppRunner:
    """A fake member on ``port`` whose ``POST /v2/models/m/generate_stream`` is
    ``handler`` (aiohttp): the generate relay's unit tests; ``cleanup()`` ends it."""
    app = web.Application()
    app.router.add_post("/v2/models/m/generate_stream", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner
