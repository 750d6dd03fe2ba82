"""The lifecycle's one assembler, for one gateway process (called from ``serve``):
:func:`build_lifecycle`, the upload/version core over one state folder and repository
when a ``lifecycle:`` section is configured, and :func:`build_warmup`, which adds the
start-up preloader (readiness gate), the keep-warm loop and member restores, with or
without a lifecycle (:mod:`gateway.lifecycle.warmup.plan`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.config import GatewayConfig
from gateway.config.lifecycle import LifecycleSpec
from gateway.core import Core
from gateway.lifecycle.conversion.workers import ConversionWorkers
from gateway.lifecycle.intake.runner import JobRunner
from gateway.lifecycle.records.catalog import ModelCatalog
from gateway.lifecycle.records.jobs import LifecycleStore
from gateway.lifecycle.service import ModelLifecycle
from gateway.lifecycle.warmup.deploy import Deployer
from gateway.lifecycle.warmup.keepwarm import KeepWarm
from gateway.lifecycle.warmup.plan import ConfiguredLoader, ModelLoader, WarmupPlan
from gateway.lifecycle.warmup.preload import Preloader
from gateway.lifecycle.warmup.rollout import Rollouts
from gateway.pools import PoolMember
from gateway.upstream.triton import MemberAdmin

log = logging.getLogger(__name__)


@dataclass
class Warmup:
    """Start-up preloading (the readiness gate), the keep-warm loop, and members that
    come back from the dead restored before they take traffic: one policy
    (:class:`WarmupPlan`), whichever loader (the lifecycle, or the configuration)."""

    core: Core
    plan: WarmupPlan
    loader: ModelLoader
    keepwarm: KeepWarm
    lifecycle: ModelLifecycle | None = None
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    preloader: Preloader = field(init=False)

    def __post_init__(self) -> None:
        self.preloader = Preloader(self.core, self.loader.preload_one)

    async def restore_member(self, member: PoolMember) -> None:
        """Reload what a member that came back empty must serve (see probes.py)."""
        for model in self.plan.preload_models():
            if self.core.state.serves(model, member):
                await self.loader.restore_one(member, model)

    def start(self) -> None:
        """Start preloading (readiness turns true when it is done) and keep-warm, and
        have members that come back from the dead restored before they take traffic."""
        self.core.state.on_recovery(self.restore_member)
        models = self.plan.preload_models()
        if models:
            self.core.state.set_preloaded(False)  # before the first readiness probe
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


def build_warmup(config: GatewayConfig, core: Core, admin: MemberAdmin) -> Warmup:
    """The warm-up, over the lifecycle when one is configured (built and recovered
    here, before any request is served)."""
    plan = WarmupPlan(config)  # with a lifecycle, its catalog's (over its records) below
    keepwarm = KeepWarm(core, admin, lambda: plan.keep_warm_policies())
    if config.lifecycle is None:
        return Warmup(core, plan, ConfiguredLoader(core, admin, plan), keepwarm)
    lifecycle = build_lifecycle(config.lifecycle, config, core, admin,
                                on_version_changed=keepwarm.forget)
    lifecycle.recover()  # explicit, at start-up, before any request is served
    plan = lifecycle.catalog.plan
    return Warmup(core, plan, lifecycle, keepwarm, lifecycle)


def build_lifecycle(spec: LifecycleSpec, config: GatewayConfig, core: Core,
                    admin: MemberAdmin, on_version_changed: Callable[[str], None],
                    workers: ConversionWorkers | None = None) -> ModelLifecycle:
    """The lifecycle's parts over one state folder and repository. Call
    :meth:`ModelLifecycle.recover` before serving requests."""
    store = LifecycleStore(spec.state_dir / "lifecycle.db")
    deployer = Deployer(core, admin, store, spec.repository, spec.retention)
    catalog = ModelCatalog(spec.repository, config, store, core, admin, deployer)
    workers = workers or ConversionWorkers(spec.worker_timeout_s, sandbox=spec.sandbox,
                                           allow_pickled_code=spec.allow_pickled_code)
    rollouts = Rollouts(deployer, store, spec.state_dir / "rollouts")
    jobs = JobRunner(spec, store, catalog, deployer, workers, rollouts, on_version_changed)
    return ModelLifecycle(catalog, jobs, deployer, rollouts, core, admin,
                          on_version_changed)
