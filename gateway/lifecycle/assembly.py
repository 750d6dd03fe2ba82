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
import os
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.config import GatewayConfig
from gateway.config.lifecycle import LifecycleSpec
from gateway.core import Core
from gateway.lifecycle.conversion.workers import ConversionWorkers
from gateway.lifecycle.intake.runner import JobRunner
from gateway.lifecycle.records.backend import open_store
from gateway.lifecycle.records.catalog import ModelCatalog
from gateway.lifecycle.records.store import Fence
from gateway.lifecycle.service import ModelLifecycle
from gateway.lifecycle.warmup.deploy import Deployer
from gateway.lifecycle.warmup.keepwarm import KeepWarm
from gateway.lifecycle.warmup.plan import ConfiguredLoader, ModelLoader, WarmupPlan
from gateway.lifecycle.warmup.preload import Preloader, ServedNow, ServedOnMembers
from gateway.lifecycle.warmup.rollout import Rollouts
from gateway.pools import PoolMember
from gateway.residency.manager import Residency, build_residency
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
    # which models each member holds, in pools with a memory budget (gateway.residency)
    residency: Residency | None = None
    # which preloaded models the members serve already: not marked not ready at start
    served: ServedNow | None = None
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    preloader: Preloader = field(init=False)

    def __post_init__(self) -> None:
        self.preloader = Preloader(self.core, self.loader.preload_one, served=self.served)

    async def restore_member(self, member: PoolMember) -> None:
        """Reload what a member that came back empty must serve (see probes.py); in a
        pool with residency, the residency reloads what the member should hold."""
        for model in self._preload_models():
            if self.core.state.serves(model, member):
                await self.loader.restore_one(member, model)

    def _preload_models(self) -> list[str]:
        """The plan's, less the models whose pools have residency (it places those)."""
        return [m for m in self.plan.preload_models() if not self.core.state.managed(m)]

    def start(self, interval_s: float = 1.0) -> None:
        """Start preloading (readiness turns true when it is done, the residency's pinned
        models included), keep-warm and the residency's rounds (every ``interval_s``),
        and have members that come back from the dead restored before they take
        traffic."""
        self.core.state.on_recovery(self.restore_member)
        models = self._preload_models()
        residency = self.residency
        if models or residency is not None:
            self.core.state.set_preloaded(False)  # before the first readiness probe
        jobs: list[tuple[Coroutine[Any, Any, None], str]] = [
            (self.preloader.run(models, residency.preload() if residency else None),
             "preload"),
            (self.keepwarm.run_forever(), "keep-warm")]
        if residency is not None:
            jobs.append((self._residency_rounds(residency, interval_s), "residency"))
        for job, name in jobs:
            task = asyncio.create_task(job, name=name)
            task.add_done_callback(report_failure)
            self.tasks.append(task)

    async def _residency_rounds(self, residency: Residency, interval_s: float) -> None:
        """The residency's rounds, once its preloading is done (it runs rounds itself)."""
        while not self.core.state.preloaded:
            await asyncio.sleep(interval_s / 4)
        await residency.run_forever(interval_s)

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.residency is not None:
            await self.residency.close()
        if self.lifecycle is not None:
            await self.lifecycle.close()


def report_failure(task: asyncio.Task[Any]) -> None:
    """A background task that died: say so (else it dies unseen, and a preload that
    died keeps the gateway unready for good)."""
    if not task.cancelled() and task.exception() is not None:
        log.error("%s failed", task.get_name(), exc_info=task.exception())


def build_warmup(config: GatewayConfig, core: Core, admin: MemberAdmin,
                 fence: Fence | None = None) -> Warmup:
    """The warm-up, over the lifecycle when one is configured (built and recovered
    here, before any request is served); ``fence``: the leadership its record writes
    must hold (several control-plane replicas over PostgreSQL)."""
    plan = WarmupPlan(config)  # with a lifecycle, its catalog's (over its records) below
    keepwarm = KeepWarm(core, admin, lambda: plan.keep_warm_policies())
    if config.lifecycle is None:
        loader = ConfiguredLoader(core, admin, plan)
        return Warmup(core, plan, loader, keepwarm,
                      residency=build_residency(config, core, admin, loader.restore_one),
                      served=ServedOnMembers(core, admin))
    lifecycle = build_lifecycle(config.lifecycle, config, core, admin,
                                on_version_changed=keepwarm.forget, fence=fence)
    # explicit, at start-up, before any request is served: an interrupted rollout's
    # split is pinned to stable here; its candidate goes in the preload, once every
    # data plane routes by that (ModelLifecycle.preload_one)
    lifecycle.recover()
    plan = lifecycle.catalog.plan
    residency = build_residency(config, core, admin, lifecycle.restore_one,
                                lifecycle.catalog.store)
    lifecycle.deployer.placement = residency
    return Warmup(core, plan, lifecycle, keepwarm, lifecycle, residency=residency,
                  served=ServedOnMembers(core, admin, lifecycle.serving_version))


def build_lifecycle(spec: LifecycleSpec, config: GatewayConfig, core: Core,
                    admin: MemberAdmin, on_version_changed: Callable[[str], None],
                    workers: ConversionWorkers | None = None,
                    environ: Mapping[str, str] | None = None,
                    fence: Fence | None = None) -> ModelLifecycle:
    """The lifecycle's parts over one state folder and repository, the records where
    the configuration puts them (``environ``: the process's, read here, at start-up:
    ``$INFERGATE_DATABASE_URL``). Call :meth:`ModelLifecycle.recover` before serving
    requests."""
    store = open_store(spec, os.environ if environ is None else environ, fence)
    deployer = Deployer(core, admin, store, spec.repository, spec.retention)
    catalog = ModelCatalog(spec.repository, config, store, core, admin, deployer)
    workers = workers or ConversionWorkers(spec.worker_timeout_s, sandbox=spec.sandbox,
                                           allow_pickled_code=spec.allow_pickled_code)
    rollouts = Rollouts(deployer, store, spec.state_dir / "rollouts")
    jobs = JobRunner(spec, store, catalog, deployer, workers, rollouts, on_version_changed)
    return ModelLifecycle(catalog, jobs, deployer, rollouts, core, admin,
                          on_version_changed)
