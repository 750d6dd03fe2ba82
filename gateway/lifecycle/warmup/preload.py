"""Start-up preloading: the readiness gate.

Before the gateway reports ready (``/v2/health/ready``, gRPC ServerReady: what a
Kubernetes readiness probe asks), every model marked ``preload: true`` in the
configuration and every model the lifecycle has a serving version for is loaded on
every available member of its pools and warmed. Until its own load finishes a model
answers 503 + Retry-After. A model that fails to load is retried with back-off and
keeps the gateway unready: a replica that cannot serve its configured models should
not receive traffic, and the failure stays visible (log, ``GET /v1/models``).

A model its members still serve (loaded and ready on every member that answers: a
restart of the control plane alone, its Tritons running on) is ready again as soon as
its members' indexes say so (:class:`ServedOnMembers`, milliseconds): its requests go on
being served while the preload loads it again where needed, instead of every data-plane
replica answering 503 for a model that serves fine.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.core import Core
from gateway.errors import GatewayError
from gateway.policy import readiness
from gateway.pools import PoolMember
from gateway.upstream.triton import MemberAdmin

log = logging.getLogger(__name__)
LoadOne = Callable[[str], Awaitable[None]]
# models -> those of them the members serve already (loaded and ready)
ServedNow = Callable[[Sequence[str]], Awaitable[set[str]]]
INDEX_TIMEOUT_S = 5.0  # a member's repository index, asked at start-up


@dataclass
class Preloader:
    core: Core
    load: LoadOne  # loads and warms one model on all its members
    first_backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    report_every_s: float = 30.0  # a load still running is logged this often
    served: ServedNow | None = None  # None: every model is marked not ready meanwhile

    async def run(self, models: Sequence[str], also: Awaitable[None] | None = None) -> None:
        """Hold readiness down until every model in ``models`` is loaded and warm, and
        ``also`` is done (the residency's preloading of its pinned models). A model the
        members serve already keeps taking requests meanwhile; the others answer 503 +
        Retry-After until loaded."""
        if not models and also is None:
            return
        self.core.state.set_preloaded(False)
        # not ready at once, before anything is awaited: no request reaches a member that
        # may not hold the model yet (it would answer Triton's own error); ready again as
        # soon as the members are found serving it (the index calls: milliseconds)
        for model in models:
            self.core.state.mark_not_ready(model, readiness.PRELOADING)
        served = await self.served(models) if self.served is not None and models else set()
        for model in served:
            self.core.state.mark_ready(model)
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


@dataclass(frozen=True)
class ServedOnMembers:
    """Which models the members serve already: each member of the models' pools is asked
    once for its repository index (ready models only, at most ``INDEX_TIMEOUT_S``). A
    model is served when every member that answered has it ready, at the version
    ``version_of`` says (its serving version; None: any), and one member answered at
    least. A member that does not answer is not held against it: a member down does not
    take requests (the health checks hold it out), and holding a model not ready for
    one dead member would answer 503 for requests its other members serve."""

    core: Core
    admin: MemberAdmin
    version_of: Callable[[str], int | None] = lambda model: None

    async def __call__(self, models: Sequence[str]) -> set[str]:
        pools = {model: self.core.state.pools_for(model) for model in models}
        members = list({m.key: m for ps in pools.values() for p in ps
                        for m in p.members}.values())
        indexes = dict(zip((m.key for m in members),
                           await asyncio.gather(*(self._ready(m) for m in members)),
                           strict=True))
        served = set()
        for model, model_pools in pools.items():
            answered = [ready for p in model_pools for m in p.members
                        if (ready := indexes[m.key]) is not None]
            want = self.version_of(model)
            if answered and all(_serves(ready, model, want) for ready in answered):
                served.add(model)
        return served

    async def _ready(self, member: PoolMember) -> set[tuple[str, int | None]] | None:
        """(model, version) for each model the member has loaded and ready; None when
        it does not answer."""
        try:
            index = await asyncio.wait_for(self.admin.repository_index(member, ready=True),
                                           INDEX_TIMEOUT_S)
        except (GatewayError, TimeoutError) as exc:
            log.info("member %s: no repository index at start-up (%s)", member.key,
                     getattr(exc, "message", repr(exc)))
            return None
        return {(str(e["name"]), _version(e)) for e in index if e.get("state") == "READY"}


def _serves(ready: set[tuple[str, int | None]], model: str, version: int | None) -> bool:
    return any(name == model and version in (None, v) for name, v in ready)


def _version(entry: dict[str, Any]) -> int | None:
    version = str(entry.get("version", ""))
    return int(version) if version.isdigit() else None
