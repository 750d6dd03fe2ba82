"""The model lifecycle, transport-free: upload -> convert -> load -> warm -> serve.

:class:`ModelLifecycle` is what the HTTP adapter (:mod:`gateway.control.lifecycle_http`)
and the control plane's start-up (:mod:`.assembly`, which builds it) hold. It is made of

- :class:`~.records.catalog.ModelCatalog`: which models are managed, their versions,
  policies, reports (reads, and adopting models found in the repository);
- :class:`~.intake.runner.JobRunner`: uploads as jobs, run in conversion workers and
  deployed;
- :class:`~.warmup.deploy.Deployer`: load, warm, route, roll back, prune, on every member;
- :class:`~.warmup.rollout.Rollouts`: progressive rollouts, step by step, and their
  control (status, pause, resume, abort);

and adds what spans them: start-up recovery, rollback, deleting a version, preloading
and restoring a member that came back empty.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.core import Core
from gateway.errors import Conflict
from gateway.lifecycle.intake.runner import RESTART_REASON, JobRunner
from gateway.lifecycle.records import versions as repo_edits
from gateway.lifecycle.records.catalog import ModelCatalog
from gateway.lifecycle.warmup.deploy import Deployer, load_as_configured, no_callback
from gateway.lifecycle.warmup.rollout import Rollouts
from gateway.pools import PoolMember
from gateway.upstream.triton import MemberAdmin

__all__ = ["RESTART_REASON", "ModelLifecycle"]


@dataclass(frozen=True)
class ModelLifecycle:
    catalog: ModelCatalog
    jobs: JobRunner
    deployer: Deployer
    rollouts: Rollouts
    core: Core
    admin: MemberAdmin
    # called with a model's name when its serving version changed (keep-warm forgets it)
    on_version_changed: Callable[[str], None]

    def recover(self) -> None:
        """At start-up, before any request: jobs a previous process left running are
        reported failed and their traces removed; models go back to their pools.
        Interrupted rollouts first: their split pins stable before any data plane asks
        this process for a snapshot; their candidate is unloaded by the preload, once
        every data plane routes by that (:meth:`preload_one`)."""
        self.rollouts.recover()  # pinned to stable until preloading serves it alone
        self.jobs.recover()
        self.catalog.reassign_pools()

    def serving_version(self, model: str) -> int | None:
        """The version ``model`` serves by its record (None: none, or not managed)."""
        record = self.catalog.store.model(model)
        return record.serving_version if record is not None else None

    # -- admin -----------------------------------------------------------------------------
    async def rollback(self, name: str, version: int | None) -> str:
        model = (await self.catalog.known(name)).name
        self._no_rollout(model, "roll back")
        async with self.deployer.lock(model):
            await self.deployer.rollback(model, version, self.catalog.warm_batches(model))
        self.on_version_changed(model)
        return model

    async def delete_version(self, name: str, version: int) -> str:
        model = (await self.catalog.known(name)).name
        self._no_rollout(model, "delete a version")
        async with self.deployer.lock(model):
            self.deployer.delete_version(model, version)
        return model

    def _no_rollout(self, model: str, what: str) -> None:
        running = self.rollouts.active(model)
        if running is not None:
            raise Conflict(f"model {model!r} is rolling out version {running.candidate}: "
                           f"abort the rollout before you {what}")

    async def rollout(self, name: str, action: str, who: str) -> dict[str, Any]:
        """``status``, ``pause``, ``resume`` or ``abort`` the model's rollout."""
        model = (await self.catalog.known(name)).name
        if action == "pause":
            self.rollouts.pause(model)
        elif action == "resume":
            self.rollouts.resume(model)
        elif action == "abort":
            self.rollouts.abort(model, who)
        return self.rollouts.status(model)

    # -- start-up and members back from the dead ---------------------------------------------
    async def preload_one(self, model: str) -> None:
        record = self.catalog.store.model(model)
        if record is not None and record.serving_version is not None:
            # an interrupted rollout's candidate goes (the activation below loads stable
            # alone) only once every data plane routes the model to stable
            await self.rollouts.until_stable(model)
            async with self.deployer.lock(model):
                await self.deployer.activate(model, record.serving_version,
                                             self.catalog.warm_batches(model))
            self.rollouts.settled(model)  # an interrupted rollout's split, if any, ends
            return
        await load_as_configured(self.core, self.admin, model,
                                 self.catalog.warm_batches(model))
        if repo_edits.existing_versions(self.catalog.repository, model):
            await self.catalog.adopt(model)

    async def restore_one(self, member: PoolMember, model: str,
                          loaded: Callable[[], None] = no_callback) -> None:
        """Load and warm ``model`` on a member that came back empty (a restarted Triton
        pod): its serving version, pinned, or the repository's config for a model the
        lifecycle does not manage."""
        record = self.catalog.store.model(model)
        version = record.serving_version if record is not None else None
        async with self.deployer.lock(model):
            await self.deployer.restore_on(member, model, version,
                                           self.catalog.warm_batches(model), loaded)

    async def close(self) -> None:
        await self.jobs.close()
        self.catalog.store.close()
