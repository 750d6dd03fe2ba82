"""uvicorn inside a process that owns its signals (the gateway's control plane, a
data-plane agent)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import uvicorn

# what a server still holds when its owner closes it (after the owner's drain) has this
# long to end before uvicorn cancels it
CLOSE_S = 1  # seconds (uvicorn takes whole ones)


class EmbeddedServer(uvicorn.Server):
    """uvicorn without its own signal handling: this loop owns SIGTERM/SIGINT, so that
    draining (readiness false, in-flight finishing) happens before the listener closes.

    Its shutdown is bounded: uvicorn alone waits for every open connection, an event
    stream (``generate_stream``) for as long as it lasts, well past the owner's
    ``--drain-timeout``. The drain came first, so what is still open gets ``CLOSE_S``
    (unless the config sets its own ``timeout_graceful_shutdown``), then its task is
    cancelled."""

    def __init__(self, config: uvicorn.Config) -> None:
        if config.timeout_graceful_shutdown is None:
            config.timeout_graceful_shutdown = CLOSE_S
        super().__init__(config)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield
