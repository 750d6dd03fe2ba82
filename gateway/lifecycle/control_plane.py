"""Assembly of the lifecycle's parts for one gateway process (called from ``serve``):
the upload/version core when a ``lifecycle:`` section is configured, the start-up
preloader (readiness gate) and the keep-warm loop (both also without it, for models
marked ``preload`` / ``keep_warm`` in the configuration).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

from gateway.dataplane import DataPlane
from gateway.lifecycle.config import KeepWarmPolicy
from gateway.lifecycle.deploy import load_as_configured, restore_as_configured
from gateway.lifecycle.keepwarm import KeepWarm
from gateway.lifecycle.preload import Preloader
from gateway.lifecycle.service import ModelLifecycle, build_lifecycle
from gateway.pools import GatewayConfig, PoolMember
from gateway.upstream.triton import MemberAdmin

log = logging.getLogger(__name__)


@dataclass
class ControlPlane:
    config: GatewayConfig
    dataplane: DataPlane
    admin: MemberAdmin
    keepwarm: KeepWarm
    lifecycle: ModelLifecycle | None = None
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    preloader: Preloader = field(init=False)

    def __post_init__(self) -> None:
        self.preloader = Preloader(self.dataplane, self.load_one)

    def preload_models(self) -> list[str]:
        if self.lifecycle is not None:
            return self.lifecycle.catalog.preload_models()
        return sorted(m for m, p in self.config.models.items() if p.preload)

    async def load_one(self, model: str) -> None:
        if self.lifecycle is not None:
            await self.lifecycle.preload_one(model)
            return
        policy = self.config.models.get(model)
        batches = policy.keep_warm.batch_sizes if policy and policy.keep_warm else (1,)
        await load_as_configured(self.dataplane, self.admin, model, batches)

    async def restore_member(self, member: PoolMember) -> None:
        """Reload what a member that came back empty must serve (see probes.py)."""
        if self.lifecycle is not None:
            await self.lifecycle.restore_member(member)
            return
        for model in self.preload_models():
            if self.dataplane.state.serves(model, member):
                policy = self.config.models.get(model)
                batches = policy.keep_warm.batch_sizes if policy and policy.keep_warm else (1,)
                await restore_as_configured(self.dataplane, self.admin, member, model, batches)

    def start(self) -> None:
        """Start preloading (readiness turns true when it is done) and keep-warm, and
        have members that come back from the dead restored before they take traffic."""
        self.dataplane.state.on_recovery(self.restore_member)
        models = self.preload_models()
        if models:
            self.dataplane.state.set_preloaded(False)  # before the first readiness probe
        for job, name in ((self.preloader.run(models), "preload"),
                          (self.keepwarm.run_forever(), "keep-warm")):
            task = asyncio.create_task(job, name=name)
            task.add_done_callback(_report_failure)
            self.tasks.append(task)

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.lifecycle is not None:
            await self.lifecycle.close()


def _report_failure(task: asyncio.Task[Any]) -> None:
    """A background task that died: say so (else it dies unseen, and a preload that
    died keeps the gateway unready for good)."""
    if not task.cancelled() and task.exception() is not None:
        log.error("%s failed", task.get_name(), exc_info=task.exception())


def build_control_plane(config: GatewayConfig, dataplane: DataPlane,
                        admin: MemberAdmin) -> ControlPlane:
    lifecycle: ModelLifecycle | None = None

    def policies() -> dict[str, KeepWarmPolicy]:  # asked once the keep-warm loop runs
        if lifecycle is not None:
            return lifecycle.catalog.keep_warm_policies()
        return {m: p.keep_warm for m, p in config.models.items() if p.keep_warm}

    keepwarm = KeepWarm(dataplane, admin, policies)
    if config.lifecycle is not None:
        lifecycle = build_lifecycle(config.lifecycle, config, dataplane, admin,
                                    on_version_changed=keepwarm.forget)
        lifecycle.recover()  # explicit, at start-up, before any request is served
    return ControlPlane(config, dataplane, admin, keepwarm, lifecycle)
