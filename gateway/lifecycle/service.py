"""The model lifecycle's core: upload -> convert -> load -> warm -> serve, transport-free.

:class:`ModelLifecycle` is what the HTTP router calls. An upload becomes a job: the
body is streamed into the job's folder, the spec checked, and the job queued; a worker
process converts (at most ``workers`` at once); the deployer loads, warms and routes
the new version; retention prunes. Every state change is written to the job store.

A job that fails after the converter published its version takes the version back out:
the repository is left as it was before the upload (``config.pbtxt`` included), and the
serving version never stopped serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import shutil
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from converters.repository import InvalidModelName, validate_model_name
from gateway.auth import Principal
from gateway.dataplane import DataPlane
from gateway.errors import GatewayError, InvalidInput, ModelNotFound
from gateway.lifecycle import versions as repo_edits
from gateway.lifecycle.config import KeepWarmPolicy, LifecycleSpec
from gateway.lifecycle.deploy import Deployer, load_as_configured, serves
from gateway.lifecycle.jobs import JobRecord, LifecycleStore, ModelRecord, VersionRecord, with_step
from gateway.lifecycle.keepwarm import KeepWarm
from gateway.lifecycle.pickles import PickledCode, refuse_pickled_code
from gateway.lifecycle.spec import UploadSpec, parse_spec
from gateway.lifecycle.uploads import ReceivedUpload, receive_upload
from gateway.lifecycle.worker_protocol import ConversionFailed, StepEvent, WorkerTask
from gateway.lifecycle.workers import ConversionWorkers
from gateway.pools import GatewayConfig, PoolMember, pools_for_model
from gateway.upstream.triton import MemberAdmin

log = logging.getLogger(__name__)
RESTART_REASON = "the gateway stopped while this job was running (its worker died with it)"


def checked_name(name: str) -> str:
    try:
        return validate_model_name(name)
    except InvalidModelName as exc:
        raise InvalidInput(str(exc)) from None


@dataclass
class ModelLifecycle:
    spec: LifecycleSpec
    config: GatewayConfig
    dataplane: DataPlane
    store: LifecycleStore
    admin: MemberAdmin
    deployer: Deployer
    workers: ConversionWorkers
    keepwarm: KeepWarm | None = None
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    closing: bool = False
    slots: asyncio.Semaphore = field(init=False)
    _policies: tuple[float, dict[str, KeepWarmPolicy]] = (float("-inf"), {})

    def __post_init__(self) -> None:
        self.slots = asyncio.Semaphore(self.spec.workers)

    def recover(self) -> None:
        """At start-up, before any request: jobs a previous process left running are
        reported failed and their traces removed; models go back to their pools."""
        for job_id in self.store.fail_interrupted(RESTART_REASON):
            self._recover(self.store.job(job_id))
        for record in self.store.models():
            if record.pools:
                self.dataplane.assign_pools(record.name, record.pools)

    def _recover(self, job: JobRecord) -> None:
        """After a crash: a job that died mid-way leaves no version it published but
        never served, no staging folder and no upload folder."""
        log.warning("job %s (%s) was running when the gateway stopped: marked failed",
                    job.id, job.model)
        repo_edits.clear_staging_leftovers(self.repository, job.model)
        shutil.rmtree(self.spec.state_dir / "jobs" / job.id, ignore_errors=True)
        with contextlib.suppress(OSError):  # made for the worker of a new model, left empty
            (self.repository / job.model).rmdir()
        record = self.store.model(job.model)
        serving = record.serving_version if record else None
        if job.version is None or job.version == serving:
            return
        versions = {v.version: v.config for v in self.store.versions(job.model)}
        kept = [text for v, text in versions.items() if v != job.version]
        repo_edits.remove_version(self.repository, job.model, job.version,
                                  versions.get(job.version), kept)
        self.store.delete_version(job.model, job.version)
        if serving is not None and serving in versions:
            repo_edits.write_config(self.repository, job.model,
                                    repo_edits.pinned_config_text(versions[serving], serving))
        elif not repo_edits.existing_versions(self.repository, job.model):
            repo_edits.remove_model(self.repository, job.model)
        log.warning("removed version %d of %s, published by the interrupted job %s",
                    job.version, job.model, job.id)

    @property
    def repository(self) -> Path:
        return self.spec.repository

    # -- uploads ---------------------------------------------------------------------------
    async def submit(self, name: str, chunks: AsyncIterator[bytes], content_type: str | None,
                     content_length: int | None, principal: Principal) -> JobRecord:
        """Receive an upload and queue its conversion; returns the job (state queued)."""
        model = checked_name(name)
        job_id = f"job-{secrets.token_hex(8)}"
        job = self.store.create_job(job_id, model, principal.name)  # Conflict if busy
        folder = self.spec.state_dir / "jobs" / job_id
        try:
            folder.mkdir(parents=True)
            job = self._step(job, "upload", "running")
            upload = await receive_upload(chunks, content_type, content_length, folder,
                                          self.spec.limits)
            spec = parse_spec(upload.spec_text)
            pools = self._target_pools(model, spec)
            self._check_samples(spec, upload)
            await self._check_pickles(spec, upload)
        except BaseException as exc:
            shutil.rmtree(folder, ignore_errors=True)
            message = exc.message if isinstance(exc, GatewayError) else repr(exc)
            self._finish(job, "failed", f"upload rejected: {message}", "upload")
            raise
        job = self._step(job, "upload", "done", f"{upload.model.size} bytes, sha256 "
                                                f"{upload.model.sha256[:12]}")
        job = self.store.update_job(job.id, state="queued",
                                    spec={**spec.model_dump(mode="json"), "pools": pools})
        self.tasks[job.id] = asyncio.create_task(self._run(job, upload, spec, pools, folder),
                                                 name=job.id)
        return job

    def _target_pools(self, model: str, spec: UploadSpec) -> list[str]:
        names = [p.name for p in self.dataplane.pools]
        if spec.pools:
            unknown = [p for p in spec.pools if p not in names]
            if unknown:
                raise InvalidInput(f"unknown pools {unknown}: this gateway has {names}")
            return list(spec.pools)
        record = self.store.model(model)
        if record is not None and record.pools:
            return list(record.pools)
        serving = [p.name for p in pools_for_model(self.dataplane.pools, model)]
        if not serving:
            raise InvalidInput(f"no pool serves {model!r} by configuration: name the target "
                               f"pools in the spec ('pools': one or more of {names})")
        return serving

    @staticmethod
    def _check_samples(spec: UploadSpec, upload: ReceivedUpload) -> None:
        if spec.needs_calibration and upload.calibration is None:
            raise InvalidInput("precision int8 needs calibration samples (a 'calibration' "
                               "part: .npz, .npy or an archive)")
        if spec.needs_evaluation and upload.evaluation is None:
            raise InvalidInput("evaluation samples are needed (an 'evaluation' part: .npz, "
                               ".npy or an archive): every variant is verified on them")
        if spec.format is not None and spec.format != upload.model_format:
            raise InvalidInput(f"spec says format {spec.format!r} but the model file "
                               f"{upload.model.filename!r} is {upload.model_format!r}")

    async def _check_pickles(self, spec: UploadSpec, upload: ReceivedUpload) -> None:
        if self.spec.allow_pickled_code or (spec.format or upload.model_format) == "onnx":
            return
        try:
            await asyncio.to_thread(refuse_pickled_code, upload.model.path,
                                    upload.model.filename or "the model file")
        except PickledCode as exc:
            raise InvalidInput(str(exc)) from None

    # -- one job ---------------------------------------------------------------------------
    async def _run(self, job: JobRecord, upload: ReceivedUpload, spec: UploadSpec,
                   pools: list[str], folder: Path) -> None:
        model = job.model
        try:
            async with self.slots:
                before = self._snapshot(model)
                try:
                    job = await self._convert_and_deploy(job, upload, spec, pools, folder)
                except asyncio.CancelledError:
                    self._restore(model, before)
                    self._finish(self.store.job(job.id), "failed", RESTART_REASON)
                    raise
                except Exception as exc:  # noqa: BLE001 - every failure ends the job
                    if not isinstance(exc, GatewayError | ConversionFailed):
                        log.exception("job %s (%s) crashed", job.id, model)
                    message = exc.message if isinstance(exc, GatewayError) else str(exc)
                    if self.closing:
                        message = f"{RESTART_REASON} ({message})"
                    self._restore(model, before)
                    self._finish(self.store.job(job.id), "failed", message)
                    log.warning("job %s (%s) failed: %s", job.id, model, message)
        finally:
            self.tasks.pop(job.id, None)
            shutil.rmtree(folder, ignore_errors=True)

    async def _convert_and_deploy(self, job: JobRecord, upload: ReceivedUpload,
                                  spec: UploadSpec, pools: list[str], folder: Path
                                  ) -> JobRecord:
        model = job.model
        self.store.update_job(job.id, state="converting")
        await self.adopt(model, pools)
        task = WorkerTask(
            job_id=job.id, model=model, repository=str(self.repository.resolve()),
            model_file=str(upload.model.path), model_format=spec.format or upload.model_format,
            spec=spec.model_dump(mode="json"), work_dir=str(folder),
            calibration=str(upload.calibration.path) if upload.calibration else None,
            evaluation=str(upload.evaluation.path) if upload.evaluation else None,
            limits=self.spec.limits.model_dump(mode="json"), nice=self.spec.worker_nice,
        )

        def on_step(event: StepEvent) -> None:
            self._step(self.store.job(job.id), event.name, event.state, event.detail,
                       event.fraction)

        def on_start(pid: int) -> None:
            self.store.update_job(job.id, worker_pid=pid)

        outcome = await self.workers.run(task, on_step, on_start)
        self.store.put_version(VersionRecord(
            model, outcome.version, "available", outcome.config, time.time(),
            precision=outcome.precision, job_id=job.id, metadata=outcome.metadata,
            report=outcome.report,
        ))
        record = self.store.model(model) or ModelRecord(model, "loading", time.time())
        keep_warm = spec.keep_warm.model_dump(mode="json") if spec.keep_warm else None
        self.store.put_model(replace(record, pools=tuple(pools),
                                     keep_warm=keep_warm or record.keep_warm))
        self._policies = (float("-inf"), {})  # the spec may bring a keep-warm policy
        self.store.update_job(job.id, state="deploying", version=outcome.version)
        async with self.deployer.lock(model):
            await self.deployer.activate(
                model, outcome.version, self.warm_batches(model),
                on_step=lambda n, s, d: self._step(self.store.job(job.id), n, s, d),
            )
            removed = self.deployer.prune(model)
        if self.keepwarm is not None:
            self.keepwarm.forget(model)
        detail = f"version {outcome.version} serving" + (
            f"; retention removed versions {removed}" if removed else "")
        return self._finish(self.store.job(job.id), "succeeded", None, detail=detail)

    def _snapshot(self, model: str) -> repo_edits.RepositorySnapshot:
        return repo_edits.snapshot(self.repository, model)

    def _restore(self, model: str, before: repo_edits.RepositorySnapshot) -> None:
        """Take out whatever a failed job added: new versions, its config, staging."""
        record = self.store.model(model)
        if not before.versions and record is not None and record.serving_version is None:
            self.store.delete_model(model)  # a first upload that failed leaves no trace
        configs = {v.version: v.config for v in self.store.versions(model)}
        added = repo_edits.restore(self.repository, model, before, configs)
        for version in added:
            self.store.delete_version(model, version)
        if added:
            log.warning("job for %s failed: removed unpublished versions %s", model, added)

    def _step(self, job: JobRecord, name: str, state: str, detail: str = "",
              fraction: float | None = None) -> JobRecord:
        return self.store.update_job(job.id, steps=with_step(job.steps, name, state, detail,
                                                             fraction))

    def _finish(self, job: JobRecord, state: str, error: str | None, step: str | None = None,
                detail: str = "") -> JobRecord:
        steps = job.steps
        running = [s.name for s in steps if s.state == "running"]
        for name in running or ([step] if step else []):
            steps = with_step(steps, name, "failed" if error else "done", error or detail)
        return self.store.update_job(job.id, state=state, error=error, steps=steps)

    # -- adopting models the lifecycle did not create ---------------------------------------
    async def adopt(self, model: str, pools: list[str] | None = None) -> ModelRecord:
        """Record a model that exists in the repository (and maybe serves) but that the
        lifecycle has never seen: its on-disk versions become rollback targets."""
        record = self.store.model(model)
        if record is not None:
            return record
        self._record_disk_versions(model)
        now = time.time()
        serving = None
        if self._routable(model):
            loaded = await self.admin.loaded_versions(self.deployer.members(model)[0], model)
            serving = max(loaded) if loaded else None
        if serving is not None and self.store.version(model, serving) is not None:
            self.store.set_version_state(model, serving, "serving")
        else:
            serving = None
        return self.store.put_model(ModelRecord(
            model, "serving" if serving else "unloaded", now, serving_version=serving,
            pools=tuple(pools or ()),
        ))

    def _record_disk_versions(self, model: str) -> None:
        """Versions that reached the repository without an upload (``infergate
        convert``, a copy) are recorded with the model's current config.pbtxt, the best
        knowledge of how they were published."""
        text_path = self.repository / model / "config.pbtxt"
        if not text_path.is_file():
            return
        text = None
        for version in repo_edits.existing_versions(self.repository, model):
            if self.store.version(model, version) is None:
                text = text or text_path.read_text()
                self.store.put_version(VersionRecord(model, version, "available", text,
                                                     time.time(), metadata={"adopted": True}))

    async def known(self, name: str) -> ModelRecord:
        """The model's record; a model found only in the repository is adopted."""
        model = checked_name(name)
        record = self.store.model(model)
        if record is not None:
            self._record_disk_versions(model)
            return record
        if not repo_edits.existing_versions(self.repository, model):
            raise ModelNotFound(f"model {model!r} is neither managed by the gateway nor in "
                                "its repository")
        return await self.adopt(model)

    def _routable(self, model: str) -> bool:
        try:
            self.dataplane.route(model)
            self.deployer.members(model)
        except GatewayError:
            return False
        return True

    # -- reads -----------------------------------------------------------------------------
    def job(self, job_id: str) -> JobRecord:
        return self.store.job(job_id)

    async def show(self, name: str) -> str:
        """The managed model's name (adopted from the repository on first sight)."""
        return (await self.known(name)).name

    def record(self, model: str) -> ModelRecord:
        record = self.store.model(model)
        if record is None:
            raise ModelNotFound(f"model {model!r} is not managed by the gateway")
        return record

    def model_names(self) -> list[str]:
        return [r.name for r in self.store.models()]

    def loading(self, model: str) -> bool:
        return model in self.dataplane.not_ready

    def report_path(self, name: str, version: int) -> Path:
        model = checked_name(name)
        record = self.store.version(model, version)
        if record is None or not record.report:
            raise ModelNotFound(f"model {model!r} version {version} has no report")
        folder = (self.repository / model / str(version)).resolve()
        path = (folder / record.report).resolve()
        if not path.is_relative_to(folder) or not path.is_file():
            raise ModelNotFound(f"report of {model!r} version {version} is missing")
        return path

    # -- admin -----------------------------------------------------------------------------
    async def rollback(self, name: str, version: int | None) -> str:
        model = (await self.known(name)).name
        async with self.deployer.lock(model):
            await self.deployer.rollback(model, version, self.warm_batches(model))
        if self.keepwarm is not None:
            self.keepwarm.forget(model)
        return model

    async def delete_version(self, name: str, version: int) -> str:
        model = (await self.known(name)).name
        async with self.deployer.lock(model):
            self.deployer.delete_version(model, version)
        return model

    # -- policies and start-up ---------------------------------------------------------------
    def keep_warm_policies(self) -> dict[str, KeepWarmPolicy]:
        """Configuration first; else what the model's upload spec asked for. Read from
        the store at most once a second (the keep-warm loop asks several times a second)."""
        now = time.monotonic()
        if now - self._policies[0] < 1.0:
            return self._policies[1]
        policies = {r.name: KeepWarmPolicy.model_validate(r.keep_warm)
                    for r in self.store.models() if r.keep_warm and r.serving_version}
        for model, policy in self.config.models.items():
            if policy.keep_warm is not None:
                policies[model] = policy.keep_warm
        self._policies = (now, policies)
        return policies

    def warm_batches(self, model: str) -> tuple[int, ...]:
        policy = self.keep_warm_policies().get(model)
        return policy.batch_sizes if policy else (1,)

    def preload_models(self) -> list[str]:
        managed = [r.name for r in self.store.models() if r.serving_version is not None]
        configured = [m for m, p in self.config.models.items() if p.preload]
        return sorted(set(managed) | set(configured))

    async def restore_member(self, member: PoolMember) -> None:
        """A member back from the dead (e.g. a restarted Triton pod, nothing loaded):
        load and warm there every preloaded model its pool serves, before it takes
        traffic (the data plane keeps it out of routing meanwhile)."""
        for model in self.preload_models():
            if not serves(self.dataplane, model, member):
                continue
            record = self.store.model(model)
            version = record.serving_version if record is not None else None
            async with self.deployer.lock(model):
                await self.deployer.restore_on(member, model, version,
                                               self.warm_batches(model))

    async def preload_one(self, model: str) -> None:
        record = self.store.model(model)
        if record is not None and record.serving_version is not None:
            async with self.deployer.lock(model):
                await self.deployer.activate(model, record.serving_version,
                                             self.warm_batches(model))
            return
        await load_as_configured(self.dataplane, self.admin, model, self.warm_batches(model))
        if repo_edits.existing_versions(self.repository, model):
            await self.adopt(model)

    async def close(self) -> None:
        self.closing = True
        await self.workers.close()
        for task in list(self.tasks.values()):
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
