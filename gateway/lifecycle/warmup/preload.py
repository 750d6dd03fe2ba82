"""Start-up preloading: the readiness gate.

Before the gateway reports ready (``/v2/health/ready``, gRPC ServerReady: what a
Kubernetes readiness probe asks), every model marked ``preload: true`` in the
configuration and every model the lifecycle has a serving version for is loaded on
every available member of its pools and warmed. Until its own load finishes a model
answers 503 + Retry-After. A model that fails to load is retried with back-off and
keeps the gateway unready: a replica that cannot serve its configured models should
not receive traffic, and the failure stays visible (log, ``GET /v1/models``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from gateway.core import Core
from gateway.errors import GatewayError

log = logging.getLogger(__name__)
LoadOne = Callable[[str], Awaitable[None]]


@dataclass
class Preloader:
    core: Core
    load: LoadOne  # loads and warms one model on all its members
    first_backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    report_every_s: float = 30.0  # a load still running is logged this often

    async def run(self, models: Sequence[str], also: Awaitable[None] | None = None) -> None:
        """Hold readiness down until every model in ``models`` is loaded and warm, and
        ``also`` is done (the residency's preloading of its pinned models)."""
        if not models and also is None:
            return
        self.core.state.set_preloaded(False)
        for model in models:
            self.core.state.mark_not_ready(model, "preloading at gateway start-up")
        try:
            await asyncio.gather(*(self._until_loaded(m) for m in models),
                                 *(() if also is None else (also,)))
        finally:
            for model in models:
                self.core.state.mark_ready(model)
        await self.core.state.settle()  # HAProxy routes them before readiness turns true
        self.core.state.set_preloaded(True)
        if models:
            log.warning("preloaded %d model(s): %s", len(models), ", ".join(models))

    async def _until_loaded(self, model: str) -> None:
        backoff = self.first_backoff_s
        while True:
            try:
                await self._load_reported(model)
                self.core.state.mark_ready(model)
                return
            except GatewayError as exc:
                log.error("preloading %s failed (retry in %.0f s): %s", model, backoff,
                          exc.message)
            await asyncio.sleep(backoff)
            backoff = min(self.max_backoff_s, backoff * 2)

    async def _load_reported(self, model: str) -> None:
        """``load(model)``, saying in the log while it takes long (a member that does not
        answer a load keeps the gateway unready: the log says which model waits)."""
        task = asyncio.ensure_future(self.load(model))
        waited = 0.0
        try:
            while not (await asyncio.wait({task}, timeout=self.report_every_s))[0]:
                waited += self.report_every_s
                log.warning("preloading %s: still loading and warming after %.0f s", model,
                            waited)
        finally:
            task.cancel()
        task.result()
