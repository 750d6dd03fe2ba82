"""Load -> warm -> route: making a version the serving one, on every member of its pools.

:meth:`Deployer.activate` loads the version on every available member at once, with the
config it was published with pinned to it (see :mod:`gateway.upstream.triton`:
the serving version keeps answering until Triton has loaded *and warmed* the new one,
then swaps). It then sends the gateway's own warm-up requests to the new version on
each member, explicitly by version, and only then records it as serving. A model with
no serving version yet answers 503 + Retry-After meanwhile. If any member refuses or
fails warm-up, the members that took the new version go back to the serving one (or
unload it, for a first version) and the deploy fails; the serving version still serves.

In a pool with residency, a version is loaded on the members that hold the model; on
one the residency picks (:class:`Placement`) when none does.

Rollback is activation of an older version; retention keeps the newest N versions plus
the serving and previous ones. One lock per model serialises all of it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from tritonclient.grpc import model_config_pb2 as mc

from converters.triton_config import parse_model_config
from gateway.core import Core
from gateway.errors import Conflict, DeployFailed, GatewayError, ModelNotFound, Unavailable
from gateway.lifecycle.records import versions as repo_edits
from gateway.lifecycle.records.store import ModelRecord, RecordStore, VersionRecord
from gateway.pools import PoolMember
from gateway.upstream.triton import MemberAdmin, override_for_version, synthetic_request

log = logging.getLogger(__name__)
StepCallback = Callable[[str, str, str], object]


def _no_steps(name: str, state: str, detail: str) -> None:
    pass


def available_members(core: Core, model: str) -> list[PoolMember]:
    members = core.state.members_of(model)
    if not members:
        raise Unavailable(f"no healthy Triton member serves {model!r}")
    return members


async def load_on(admin: MemberAdmin, model: str, override: dict[str, Any] | None,
                  members: Sequence[PoolMember], loaded: list[PoolMember]) -> None:
    """Load on all ``members`` at once; ``loaded`` collects those that succeeded."""
    async def load(member: PoolMember) -> None:
        await admin.load(member, model, override)
        loaded.append(member)

    results = await asyncio.gather(*(load(m) for m in members), return_exceptions=True)
    failures = [r for r in results if isinstance(r, BaseException)]
    if failures:
        raise failures[0]


async def warm_on(core: Core, admin: MemberAdmin, model: str, version: int | None,
                  config: mc.ModelConfig, batches: Sequence[int], member: PoolMember) -> None:
    """Synthetic requests at each batch size to one member (``traffic="warmup"``)."""
    for batch in batches:
        body, headers = synthetic_request(config, batch)

        async def call(m: PoolMember, body: bytes = body,
                       headers: dict[str, str] = headers) -> tuple[int, bytes]:
            return await admin.infer(m, model, version, body, headers)

        status, answer = await core.telemetry.synthetic(
            model, member, call, protocol="http", traffic="warmup",
            outcome=lambda r: "success" if r[0] == 200 else "upstream_error",
        )
        if status != 200:
            raise DeployFailed(f"{member.key}: warm-up at batch {batch} answered {status}: "
                               f"{answer[:4000].decode(errors='replace')}")


def _batches(config: mc.ModelConfig, wanted: Sequence[int]) -> tuple[int, ...]:
    return tuple(b for b in wanted if b <= max(1, config.max_batch_size)) or (1,)


async def load_as_configured(core: Core, admin: MemberAdmin, model: str,
                             warm_batches: Sequence[int] = (1,)) -> None:
    """A model the lifecycle does not manage: load it as its ``config.pbtxt`` says on
    every member, then warm it (unversioned: whatever Triton serves)."""
    members = available_members(core, model)
    await load_on(admin, model, None, members, [])
    config = await admin.config(members[0], model)
    batches = _batches(config, warm_batches)
    await asyncio.gather(*(warm_on(core, admin, model, None, config, batches, m)
                           for m in members))


def no_callback() -> None:
    """No one to tell (a load's ``loaded`` callback by default)."""


async def restore_as_configured(core: Core, admin: MemberAdmin, member: PoolMember,
                                model: str, warm_batches: Sequence[int] = (1,),
                                loaded: Callable[[], None] = no_callback) -> None:
    """Load a model on one member as its ``config.pbtxt`` says, then warm it there
    (``loaded`` called in between)."""
    await load_on(admin, model, None, [member], [])
    loaded()
    config = await admin.config(member, model)
    await warm_on(core, admin, model, None, config, _batches(config, warm_batches),
                  member)


class Placement(Protocol):
    """Where a model of a pool with residency is loaded when no member holds it
    (``gateway.residency``)."""

    async def reserve(self, model: str) -> list[PoolMember]:
        """Members to load it on, room made there."""

    def deployed(self, model: str, members: Collection[PoolMember], ok: bool) -> None:
        """The load on reserved members ended (``ok``: it holds the model now)."""

    def fits(self, model: str, footprint_bytes: int) -> str | None:
        """Why a model of ``footprint_bytes`` fits no member (None: it fits one)."""


@dataclass
class Deployer:
    core: Core
    admin: MemberAdmin
    store: RecordStore
    repository: Path
    retention: int = 3
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    placement: Placement | None = None  # set when a pool has residency

    def lock(self, model: str) -> asyncio.Lock:
        return self.locks.setdefault(model, asyncio.Lock())

    def members(self, model: str) -> list[PoolMember]:
        return available_members(self.core, model)

    async def restore_on(self, member: PoolMember, model: str, version: int | None,
                         warm_batches: Sequence[int] = (1,),
                         loaded: Callable[[], None] = no_callback) -> None:
        """Load and warm what ``model`` serves on one member that came back empty (a
        restarted Triton): ``version`` pinned as published, or the repository's config
        for a model the lifecycle does not manage (``version`` None); ``loaded`` is
        called between Triton's load and the gateway's warm-up."""
        if version is None:
            await restore_as_configured(self.core, self.admin, member, model,
                                        warm_batches, loaded)
            return
        target = self.store.version(model, version)
        if target is None:
            raise ModelNotFound(f"model {model!r} has no version {version}")
        config = parse_model_config(target.config)
        batches = _batches(config, warm_batches)
        await load_on(self.admin, model, override_for_version(config, version, batches),
                      [member], [])
        loaded()
        await warm_on(self.core, self.admin, model, version, config, batches, member)

    # -- activation ------------------------------------------------------------------------
    async def activate(self, model: str, version: int, warm_batches: Sequence[int] = (1,),
                       on_step: StepCallback = _no_steps) -> ModelRecord:
        """Make ``version`` (already published, recorded in the store) the serving one."""
        record = self.store.model(model) or ModelRecord(model, "loading", time.time())
        target = self.store.version(model, version)
        if target is None:
            raise ModelNotFound(f"model {model!r} has no version {version}")
        if record.pools:
            self.core.state.serve(model, record.pools)
        serving = record.serving_version
        reserved: list[PoolMember] = []
        if self.placement is not None and self.core.state.managed(model) and \
                not self.core.state.members_of(model):
            members = reserved = await self.placement.reserve(model)  # resident nowhere
        else:
            members = self.members(model)
        config = parse_model_config(target.config)
        batches = _batches(config, warm_batches)
        if serving is None:
            self.core.state.mark_not_ready(model, f"version {version} is loading")
            self.store.put_model(replace(record, state="loading", detail=""))
        await self.core.state.settle()
        override = override_for_version(config, version, batches)
        loaded: list[PoolMember] = []
        try:
            to_load = members
            if serving == version:  # start-up: members that already serve it keep it
                to_load = await self._not_serving(model, version, members)
            on_step("load", "running", f"version {version} on {len(to_load)} member(s)")
            await load_on(self.admin, model, override, to_load, loaded)
            on_step("load", "done", "")
            on_step("warm", "running", f"batch sizes {list(batches)}")
            await asyncio.gather(*(warm_on(self.core, self.admin, model, version, config,
                                           batches, m) for m in members))
            on_step("warm", "done", "")
        except GatewayError as exc:
            await self._revert(model, serving, loaded)
            self.store.put_model(replace(record, state="serving" if serving else "failed",
                                         detail=f"version {version} failed: {exc.message}"))
            if reserved and self.placement is not None:
                self.placement.deployed(model, reserved, ok=False)
            raise DeployFailed(f"version {version} of {model!r} did not go live: "
                               f"{exc.message}") from exc
        else:
            if reserved and self.placement is not None:
                self.placement.deployed(model, reserved, ok=True)
        finally:
            if serving is None:
                self.core.state.mark_ready(model)
            await self.core.state.settle()
        on_step("route", "done", f"version {version} is serving")
        return self._record_serving(record, target)

    async def _not_serving(self, model: str, version: int, members: Sequence[PoolMember]
                           ) -> list[PoolMember]:
        """Members that do not already serve exactly ``version`` of ``model``, ready. A
        restarted gateway does not ask a Triton to load again what it serves (Triton
        2.51 was seen to hang on such a load after a refused one)."""
        served = await asyncio.gather(*(self.admin.loaded_versions(m, model) for m in members))
        return [m for m, versions in zip(members, served, strict=True) if versions != [version]]

    async def _revert(self, model: str, serving: int | None,
                      loaded: list[PoolMember]) -> None:
        """Members that took the new version go back to the serving one (or unload)."""
        previous = self.store.version(model, serving) if serving is not None else None
        for member in loaded:
            try:
                if previous is None:
                    await self.admin.unload(member, model)
                else:
                    config = parse_model_config(previous.config)
                    await self.admin.load(member, model, override_for_version(config, serving))
            except GatewayError as exc:
                log.error("could not restore %s on %s: %s", model, member.key, exc.message)

    def _record_serving(self, record: ModelRecord, target: VersionRecord) -> ModelRecord:
        serving, version = record.serving_version, target.version
        previous = serving if serving not in (None, version) else record.previous_version
        if serving not in (None, version):
            self.store.set_version_state(record.name, serving, "available")
        self.store.set_version_state(record.name, version, "serving")
        repo_edits.write_config(self.repository, record.name,
                                repo_edits.pinned_config_text(target.config, version))
        return self.store.put_model(replace(
            record, state="serving", serving_version=version, previous_version=previous,
            detail="",
        ))

    # -- rollback, delete, retention -------------------------------------------------------
    async def rollback(self, model: str, version: int | None = None,
                       warm_batches: Sequence[int] = (1,)) -> ModelRecord:
        record = self.store.model(model)
        if record is None:
            raise ModelNotFound(f"model {model!r} has no managed versions")
        target = version if version is not None else record.previous_version
        if target is None:
            raise Conflict(f"model {model!r} has no previous version to roll back to")
        if target == record.serving_version:
            raise Conflict(f"version {target} of {model!r} is already serving")
        if self.store.version(model, target) is None or \
                target not in repo_edits.existing_versions(self.repository, model):
            raise ModelNotFound(f"model {model!r} has no version {target} to roll back to")
        return await self.activate(model, target, warm_batches)

    def delete_version(self, model: str, version: int,
                       reason: str = "deleted by an operator") -> None:
        """Remove ``version`` from the repository; its record stays, ``deleted`` with
        ``reason``, and its number is never issued again."""
        record = self.store.model(model)
        if record is not None and record.serving_version == version:
            raise Conflict(f"version {version} of {model!r} is serving: roll back or deploy "
                           "another version before deleting it")
        target = self.store.version(model, version)
        on_disk = version in repo_edits.existing_versions(self.repository, model)
        if target is not None and not target.live and not on_disk:
            raise ModelNotFound(f"version {version} of {model!r} is already gone "
                                f"({target.state}: {target.reason})")
        if target is None and not on_disk:
            raise ModelNotFound(f"model {model!r} has no version {version}")
        kept = [v.config for v in self.store.versions(model, live=True)
                if v.version != version]
        repo_edits.remove_version(self.repository, model, version,
                                  target.config if target and target.config else None, kept)
        self.store.delete_version(model, version, reason)
        if record is not None and record.previous_version == version:
            self.store.put_model(replace(record, previous_version=None))

    def prune(self, model: str) -> list[int]:
        """Delete versions beyond the newest ``retention`` (never serving or previous)."""
        record = self.store.model(model)
        protected = {record.serving_version, record.previous_version} if record else set()
        on_disk = repo_edits.existing_versions(self.repository, model)
        keep = set(on_disk[-self.retention:]) | protected
        removed = [v for v in on_disk if v not in keep]
        for version in removed:
            self.delete_version(model, version, f"retention keeps the newest "
                                                f"{self.retention} versions")
        return removed
