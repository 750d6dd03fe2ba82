"""Process helpers for integration tests: Tritons a test is done with, ended in the
background; find any tritonserver / Python-backend stub a test might have left behind.
The gateway runner lives in infergate.processes."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from infergate.processes import (  # noqa: F401 (re-exported for tests)
    ROOT,
    GatewayProcess,
    pools_yaml,
    run_gateway,
    wait_until,
)
from infergate.triton.local import LocalTriton, TritonSettings

_ENDING: list[threading.Thread] = []


def end_in_background(*servers: LocalTriton | None) -> None:
    """Stop Tritons a test is done with, each on a thread of its own. A Triton's exit on
    SIGTERM takes 2-3 s that nothing waits on (it looks at its models once a second
    while the Python-backend stub ends); the session joins them (:func:`join_ended`)
    before it checks that nothing is left. A test that stops a member to see what the
    gateway does next calls ``stop()``, which returns once the member is gone."""
    for server in servers:
        if server is not None:
            thread = threading.Thread(target=server.stop, name=f"end-triton-{server.pid}")
            thread.start()
            _ENDING.append(thread)


def join_ended(timeout_s: float = 120.0) -> None:
    """Wait for the Tritons :func:`end_in_background` is stopping."""
    deadline = time.monotonic() + timeout_s
    while _ENDING:
        _ENDING.pop().join(max(0.0, deadline - time.monotonic()))


@contextlib.contextmanager
def started_triton(settings: TritonSettings) -> Iterator[LocalTriton]:
    """A Triton started for a test or a module, ended in the background once the block
    is over (LocalTriton's own ``with`` waits for it to exit)."""
    server = LocalTriton(settings)
    server.start()  # a start that fails stops what it started
    try:
        yield server
    finally:
        end_in_background(server)


def triton_processes(marker: str = "") -> list[str]:
    """Live (non-zombie) tritonserver/stub/haproxy/data-plane replica processes whose
    command line contains marker."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if state != "Z" and ("tritonserver" in cmdline or "triton_python_backend_stub"
                                 in cmdline or "haproxy" in cmdline.split(" ", 1)[0]
                                 or " -m gateway agent " in cmdline  # a replica
                                 ) and marker in cmdline:
                found.append(f"{proc.name}: {cmdline[:200]}")
    return found
