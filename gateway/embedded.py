"""uvicorn inside a process that owns its signals (the gateway's control plane, a
data-plane agent)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import uvicorn


class EmbeddedServer(uvicorn.Server):
    """uvicorn without its own signal handling: this loop owns SIGTERM/SIGINT, so that
    draining (readiness false, in-flight finishing) happens before the listener closes."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield
