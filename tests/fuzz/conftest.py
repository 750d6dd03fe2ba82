"""Fixtures of the fuzz suites: one tally for the session (written to
``<basetemp>/fuzz-report.json`` and printed at the end: cases and answers per surface),
and :func:`fuzzing`, which wraps a suite's run against one gateway: no fault for a
client's mistake, the gateway still serving on both protocols, its memory and open
files back within bounds."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from converters.tiny import TINY_MODEL_NAME, TINY_WIDTH
from tests.fuzz.tally import Footprint, Tally
from tests.procs import GatewayProcess, wait_until


@pytest.fixture(scope="session")
def tally(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tally]:
    found = Tally()
    yield found
    if not found.answers:
        return
    path = tmp_path_factory.getbasetemp() / "fuzz-report.json"
    found.write(path)
    lines = [f"fuzz: {found.report()['total']} cases ({path})"]
    for surface, counts in sorted(found.answers.items()):
        answers = ", ".join(f"{a}: {n}" for a, n in sorted(counts.items()))
        lines.append(f"  {surface:32} {sum(counts.values()):6}  {answers}")
    print("\n" + "\n".join(lines))


def serves(gateway: GatewayProcess) -> bool:
    """A good request answers on both protocols."""
    x = np.ones((1, TINY_WIDTH), np.float32)
    body = {"inputs": [{"name": "x", "shape": [1, TINY_WIDTH], "datatype": "FP32",
                        "data": x.ravel().tolist()}]}
    resp = httpx.post(f"http://{gateway.http_url}/v2/models/{TINY_MODEL_NAME}/infer",
                      json=body, timeout=30)
    if resp.status_code != 200:
        return False
    client = grpcclient.InferenceServerClient(gateway.grpc_url)
    try:
        inp = grpcclient.InferInput("x", [1, TINY_WIDTH], "FP32")
        inp.set_data_from_numpy(x)
        out = client.infer(TINY_MODEL_NAME, [inp], client_timeout=30).as_numpy("y")
        return bool(np.allclose(out, 2 * x + 1))
    finally:
        client.close()


@contextlib.contextmanager
def fuzzing(gateway: GatewayProcess, tally: Tally, surface: str) -> Iterator[str]:
    """Yields the surface's name in the tally (``surface/<data plane>``)."""
    name = f"{surface}/{gateway.data_plane}"
    assert serves(gateway)
    before = Footprint.of(gateway.proc.pid)
    yield name
    assert tally.count(name) > 0, f"{name}: no case was sent"
    assert not tally.surface_faults(name), "\n".join(tally.surface_faults(name))
    assert gateway.proc.poll() is None, "the gateway exited"
    assert serves(gateway), "the gateway stopped serving"
    settled = wait_until(lambda: Footprint.of(gateway.proc.pid).within(before), 20, 0.2)
    assert settled, f"{name}: {Footprint.of(gateway.proc.pid)} vs {before} before"
