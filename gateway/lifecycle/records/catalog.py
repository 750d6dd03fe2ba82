"""The lifecycle's catalog: the models the gateway manages, their versions and policies.

:class:`RecordedCatalog` is the read side: what any control-plane replica can answer
from the records and the shared repository alone, a standby included
(:mod:`gateway.control.standby`). :class:`ModelCatalog`, the leader's (or the only
control plane's), adds what needs the pools and writes: adoption (a model found in the
repository that the lifecycle never saw is recorded on first sight, its on-disk
versions becoming rollback targets), whether a model is loading now, and pools. Jobs
(:mod:`..intake.runner`) and deployments (:mod:`..warmup.deploy`) write the records; the
HTTP adapter (:mod:`gateway.control.lifecycle_http`) shapes them for clients.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from converters.repository import InvalidModelName, validate_model_name
from gateway.config import GatewayConfig
from gateway.config.lifecycle import KeepWarmPolicy
from gateway.core import Core
from gateway.errors import GatewayError, InvalidInput, ModelNotFound
from gateway.lifecycle.intake.spec import UploadSpec
from gateway.lifecycle.records import versions as repo_edits
from gateway.lifecycle.records.store import (
    JobRecord,
    ModelRecord,
    RecordStore,
    VersionRecord,
)
from gateway.lifecycle.warmup.deploy import Deployer
from gateway.lifecycle.warmup.plan import WarmupPlan
from gateway.pools import pools_for_model
from gateway.upstream.triton import MemberAdmin


def checked_name(name: str) -> str:
    try:
        return validate_model_name(name)
    except InvalidModelName as exc:
        raise InvalidInput(str(exc)) from None


class NotRecorded(ModelNotFound):
    """A model in the repository that the records do not know yet: the leader records
    it on first sight (:meth:`ModelCatalog.known`); a replica that only reads cannot."""

    def __init__(self, model: str) -> None:
        super().__init__(f"model {model!r} is in the repository but not yet in the records")
        self.model = model


@dataclass
class RecordedCatalog:
    """The catalog as recorded: reads over the records and the repository, no pools,
    no writes (what a standby serves)."""

    repository: Path
    config: GatewayConfig
    store: RecordStore
    plan: WarmupPlan = field(init=False)

    def __post_init__(self) -> None:
        self.plan = WarmupPlan(self.config, self.store)

    # -- records ---------------------------------------------------------------------------
    def record(self, model: str) -> ModelRecord:
        record = self.store.model(model)
        if record is None:
            raise ModelNotFound(f"model {model!r} is not managed by the gateway")
        return record

    def model_names(self) -> list[str]:
        return [r.name for r in self.store.models()]

    def repository_models(self) -> list[str]:
        """Models with at least one version folder in the repository (managed or not)."""
        if not self.repository.is_dir():
            return []
        return sorted(p.name for p in self.repository.iterdir()
                      if p.is_dir() and repo_edits.existing_versions(self.repository, p.name))

    def versions(self, model: str, live: bool = False) -> list[VersionRecord]:
        """Every version record of ``model``, those that left the repository (failed,
        rolled back, deleted: ``live`` False) included unless ``live``."""
        return self.store.versions(model, live)

    def recent_jobs(self, model: str, limit: int = 5) -> list[JobRecord]:
        return self.store.jobs(model, limit=limit)

    def loading(self, model: str) -> bool | None:
        """Whether the model is loading now; None: not known here (only the replica that
        probes the pools, the leader, knows)."""
        return None

    def report_path(self, name: str, version: int) -> Path:
        model = checked_name(name)
        record = self.store.version(model, version)
        if record is None or not record.report:
            raise ModelNotFound(f"model {model!r} version {version} has no report")
        if not record.live:
            raise ModelNotFound(f"version {version} of {model!r} is gone ({record.state}), "
                                "its report with it")
        folder = (self.repository / model / str(version)).resolve()
        path = (folder / record.report).resolve()
        if not path.is_relative_to(folder) or not path.is_file():
            raise ModelNotFound(f"report of {model!r} version {version} is missing")
        return path

    def recorded(self, name: str) -> ModelRecord:
        """The model's record; :class:`NotRecorded` for one found only in the
        repository."""
        model = checked_name(name)
        record = self.store.model(model)
        if record is not None:
            return record
        if not repo_edits.existing_versions(self.repository, model):
            raise ModelNotFound(f"model {model!r} is neither managed by the gateway nor in "
                                "its repository")
        raise NotRecorded(model)

    async def known(self, name: str) -> ModelRecord:
        """The model's record, as recorded (:meth:`recorded`)."""
        return self.recorded(name)

    async def recorded_rollout(self, name: str) -> dict[str, Any]:
        """The model's latest rollout as recorded: its state, step, split and every
        verdict; not the running step's windows, which only the leader counts."""
        model = (await self.known(name)).name
        record = self.store.rollout(model)
        if record is None:
            raise ModelNotFound(f"model {model!r} has had no rollout")
        return record.to_json()

    # -- policies (gateway/lifecycle/warmup/plan.py) -----------------------------------------
    def keep_warm_policies(self) -> dict[str, KeepWarmPolicy]:
        return self.plan.keep_warm_policies()


@dataclass
class ModelCatalog(RecordedCatalog):
    """The catalog of the control plane that acts: reads, adoption, pools, policies."""

    core: Core
    admin: MemberAdmin
    deployer: Deployer

    def loading(self, model: str) -> bool:
        return self.core.state.not_ready_reason(model) is not None

    async def known(self, name: str) -> ModelRecord:
        """The model's record; a model found only in the repository is adopted."""
        try:
            record = self.recorded(name)
        except NotRecorded as exc:
            return await self.adopt(exc.model)
        self._record_disk_versions(record.name)
        return record

    # -- adopting models the lifecycle did not create ---------------------------------------
    async def adopt(self, model: str, pools: list[str] | None = None) -> ModelRecord:
        """Record a model that exists in the repository (and maybe serves) but that the
        lifecycle has never seen: its on-disk versions become rollback targets."""
        record = self.store.model(model)
        if record is not None:
            return record
        self._record_disk_versions(model)
        serving = None
        if self._routable(model):
            loaded = await self.admin.loaded_versions(self.deployer.members(model)[0], model)
            serving = max(loaded) if loaded else None
        if serving is not None and self.store.live_version(model, serving) is not None:
            self.store.set_version_state(model, serving, "serving")
        else:
            serving = None
        return self.store.put_model(ModelRecord(
            model, "serving" if serving else "unloaded", time.time(), serving_version=serving,
            pools=tuple(pools or ()),
        ))

    def _record_disk_versions(self, model: str) -> None:
        """Versions that reached the repository without an upload (``infergate
        convert``, a copy) are recorded with the model's current config.pbtxt, the best
        knowledge of how they were published. A number whose version left the repository
        keeps its record (history), even if a folder of that number appears again."""
        text_path = self.repository / model / "config.pbtxt"
        if not text_path.is_file():
            return
        text = None
        for version in repo_edits.existing_versions(self.repository, model):
            if self.store.version(model, version) is None:
                text = text or text_path.read_text()
                self.store.put_version(VersionRecord(model, version, "available", text,
                                                     time.time(), metadata={"adopted": True}))

    def _routable(self, model: str) -> bool:
        try:
            self.core.state.serving_pools(model)
            self.deployer.members(model)
        except GatewayError:
            return False
        return True

    # -- pools -----------------------------------------------------------------------------
    def target_pools(self, model: str, spec: UploadSpec) -> list[str]:
        """Where an upload of ``model`` goes: the spec's pools, else where the model lives
        now, else the pools that serve it by configuration."""
        names = [p.name for p in self.core.state.pools]
        if spec.pools:
            unknown = [p for p in spec.pools if p not in names]
            if unknown:
                raise InvalidInput(f"unknown pools {unknown}: this gateway has {names}")
            return list(spec.pools)
        record = self.store.model(model)
        if record is not None and record.pools:
            return list(record.pools)
        serving = [p.name for p in pools_for_model(self.core.state.pools, model)]
        if not serving:
            raise InvalidInput(f"no pool serves {model!r} by configuration: name the target "
                               f"pools in the spec ('pools': one or more of {names})")
        return serving

    def reassign_pools(self) -> None:
        """At start-up: every managed model goes back to the pools it was deployed to."""
        for record in self.store.models():
            if record.pools:
                self.core.state.serve(record.name, record.pools)

    # -- policies (gateway/lifecycle/warmup/plan.py) -----------------------------------------
    def policies_changed(self) -> None:
        self.plan.policies_changed()

    def warm_batches(self, model: str) -> tuple[int, ...]:
        return self.plan.warm_batches(model)

    def preload_models(self) -> list[str]:
        return self.plan.preload_models()
