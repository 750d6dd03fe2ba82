"""The lifecycle's job runner: an upload becomes a job, the job a served version.

The body is streamed into the job's folder, the spec checked and the job queued; a
worker process converts (at most ``workers`` at once); the deployer loads, warms and
routes the new version, or, with a rollout policy and a version serving already, the
rollout serves it beside that one and promotes or rolls it back step by step
(:mod:`gateway.lifecycle.warmup.rollout`); retention prunes. Every state change is
written to the job store.

A job that fails after the converter published its version takes the version back out:
the repository is left as it was before the upload (``config.pbtxt`` included), and the
serving version never stopped serving. The version's record stays, ``failed`` or
``rolled_back`` with the job's error, and its number is never issued again: the worker
is told the least number it may publish (:meth:`RecordStore.version_floor`).
:meth:`JobRunner.recover` does the same at start-up for the jobs a previous process left
running.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import shutil
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from converters.model_dir import read_footprint
from gateway.auth import Principal
from gateway.config.lifecycle import LifecycleSpec
from gateway.config.rollout import RolloutSpec
from gateway.errors import DeployFailed, GatewayError, InvalidInput
from gateway.lifecycle.conversion.pickles import PickledCode, refuse_pickled_code
from gateway.lifecycle.conversion.worker_protocol import ConversionFailed, StepEvent, WorkerTask
from gateway.lifecycle.conversion.workers import ConversionWorkers
from gateway.lifecycle.intake.spec import UploadSpec, parse_spec
from gateway.lifecycle.intake.uploads import ReceivedUpload, receive_upload
from gateway.lifecycle.records import versions as repo_edits
from gateway.lifecycle.records.catalog import ModelCatalog, checked_name
from gateway.lifecycle.records.store import (
    JobRecord,
    ModelRecord,
    RecordStore,
    VersionRecord,
    with_step,
)
from gateway.lifecycle.warmup.deploy import Deployer
from gateway.lifecycle.warmup.rollout import INTERRUPTED as ROLLOUT_INTERRUPTED
from gateway.lifecycle.warmup.rollout import Rollouts
from gateway.policy.rollout import effective

log = logging.getLogger(__name__)

INCOMING = "incoming-"  # a form upload's folder until its model is known
RESTART_REASON = "the gateway stopped while this job was running (its worker died with it)"


@dataclass
class JobRunner:
    spec: LifecycleSpec
    store: RecordStore
    catalog: ModelCatalog
    deployer: Deployer
    workers: ConversionWorkers
    rollouts: Rollouts
    # called with the model's name when a job changed its serving version (keep-warm
    # forgets the model's idle clock)
    on_version_changed: Callable[[str], None] = lambda model: None
    _tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict, init=False)
    _closing: bool = field(default=False, init=False)
    _slots: asyncio.Semaphore = field(init=False)

    def __post_init__(self) -> None:
        self._slots = asyncio.Semaphore(self.spec.workers)

    @property
    def repository(self) -> Path:
        return self.spec.repository

    def job(self, job_id: str) -> JobRecord:
        return self.store.job(job_id)

    # -- start-up ----------------------------------------------------------------------------
    def recover(self) -> None:
        """Jobs a previous process left running are reported failed (a conversion's
        worker died with it; a rollout was interrupted: each says which), and whatever
        they left behind (a version published but never served, staging, upload
        folders) is removed."""
        for job_id in self.store.fail_interrupted(RESTART_REASON,
                                                  {"rolling_out": ROLLOUT_INTERRUPTED}):
            self._recover(self.store.job(job_id))
        for incoming in (self.spec.state_dir / "jobs").glob(f"{INCOMING}*"):
            shutil.rmtree(incoming, ignore_errors=True)  # a form body cut by the stop

    def _recover(self, job: JobRecord) -> None:
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
        versions = {v.version: v.config for v in self.store.versions(job.model, live=True)}
        kept = [text for v, text in versions.items() if v != job.version]
        repo_edits.remove_version(self.repository, job.model, job.version,
                                  versions.get(job.version), kept)
        self.store.end_version(job.model, job.version, self._ended_state(job),
                               job.error or RESTART_REASON)
        if serving is not None and serving in versions:
            repo_edits.write_config(self.repository, job.model,
                                    repo_edits.pinned_config_text(versions[serving], serving))
        elif not repo_edits.existing_versions(self.repository, job.model):
            repo_edits.remove_model(self.repository, job.model)
        log.warning("removed version %d of %s, published by the interrupted job %s",
                    job.version, job.model, job.id)

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
        except BaseException as exc:
            self._reject(job, folder, exc)
            raise
        return await self._accept(job, upload, folder)

    async def submit_form(self, chunks: AsyncIterator[bytes], content_type: str | None,
                          content_length: int | None, principal: Principal,
                          fields: tuple[str, ...], check: Callable[[dict[str, str]], str]
                          ) -> JobRecord:
        """An upload whose model name comes in the body (the console's form): the body is
        received first, with the text ``fields`` beside the usual parts; ``check`` reads
        them and answers the model's name (or raises). Then as :meth:`submit`. Nothing
        of a refused body is kept, and no job is recorded for it."""
        incoming = self.spec.state_dir / "jobs" / f"{INCOMING}{secrets.token_hex(8)}"
        try:
            incoming.mkdir(parents=True)
            upload = await receive_upload(chunks, content_type, content_length, incoming,
                                          self.spec.limits, fields)
            model = checked_name(check(dict(upload.fields)))
            job = self.store.create_job(f"job-{secrets.token_hex(8)}", model,
                                        principal.name)  # Conflict if busy
        except BaseException:
            shutil.rmtree(incoming, ignore_errors=True)
            raise
        folder = self.spec.state_dir / "jobs" / job.id
        try:
            incoming.rename(folder)
        except OSError as exc:
            self._reject(job, incoming, exc)
            raise
        job = self._step(job, "upload", "running")
        return await self._accept(job, upload.moved_to(folder), folder)

    async def _accept(self, job: JobRecord, upload: ReceivedUpload, folder: Path) -> JobRecord:
        """A received upload: its spec and samples checked, its conversion queued."""
        try:
            spec = parse_spec(upload.spec_text)
            pools = self.catalog.target_pools(job.model, spec)
            self._check_samples(spec, upload)
            await self._check_pickles(spec, upload)
        except BaseException as exc:
            self._reject(job, folder, exc)
            raise
        job = self._step(job, "upload", "done", f"{upload.model.size} bytes, sha256 "
                                                f"{upload.model.sha256[:12]}")
        job = self.store.update_job(job.id, state="queued",
                                    spec={**spec.model_dump(mode="json"), "pools": pools})
        self._tasks[job.id] = asyncio.create_task(self._run(job, upload, spec, pools, folder),
                                                  name=job.id)
        return job

    def _reject(self, job: JobRecord, folder: Path, exc: BaseException) -> None:
        shutil.rmtree(folder, ignore_errors=True)
        message = exc.message if isinstance(exc, GatewayError) else repr(exc)
        self._finish(job, "failed", f"upload rejected: {message}", "upload")

    @staticmethod
    def _check_samples(spec: UploadSpec, upload: ReceivedUpload) -> None:
        missing = [f"'{part}'" for part, needed, given in (
            ("calibration", spec.needs_calibration, upload.calibration),
            ("evaluation", spec.needs_evaluation, upload.evaluation)) if needed and not given]
        if missing:
            raise InvalidInput(
                "precision int8 needs a 'calibration' and an 'evaluation' part (.npz, .npy or "
                f"an archive each); {' and '.join(missing)} "
                f"{'is' if len(missing) == 1 else 'are'} missing (fp32 and fp16 uploads may "
                "omit both: they are verified on synthetic inputs)")
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
            async with self._slots:
                before = repo_edits.snapshot(self.repository, model)
                try:
                    job = await self._convert_and_deploy(job, upload, spec, pools, folder)
                except asyncio.CancelledError:
                    self._restore(job, before, RESTART_REASON)
                    self._finish(self.store.job(job.id), "failed", RESTART_REASON)
                    raise
                except Exception as exc:  # noqa: BLE001 - every failure ends the job
                    if not isinstance(exc, GatewayError | ConversionFailed):
                        log.exception("job %s (%s) crashed", job.id, model)
                    message = exc.message if isinstance(exc, GatewayError) else str(exc)
                    if self._closing:
                        message = f"{RESTART_REASON} ({message})"
                    self._restore(job, before, message)
                    self._finish(self.store.job(job.id), "failed", message)
                    log.warning("job %s (%s) failed: %s", job.id, model, message)
        finally:
            self._tasks.pop(job.id, None)
            shutil.rmtree(folder, ignore_errors=True)

    def rollout_for(self, model: str, spec: UploadSpec) -> RolloutSpec | None:
        """The upload's rollout, else the model's configured one (None: all at once)."""
        policy = self.catalog.config.models.get(model)
        return effective(spec.rollout, policy.rollout if policy else None)

    async def _convert_and_deploy(self, job: JobRecord, upload: ReceivedUpload,
                                  spec: UploadSpec, pools: list[str], folder: Path
                                  ) -> JobRecord:
        model = job.model
        self.store.update_job(job.id, state="converting")
        await self.catalog.adopt(model, pools)
        rollout = self.rollout_for(model, spec)
        task = WorkerTask(
            job_id=job.id, model=model, repository=str(self.repository.resolve()),
            model_file=str(upload.model.path), model_format=spec.format or upload.model_format,
            spec=spec.model_dump(mode="json"), work_dir=str(folder),
            calibration=str(upload.calibration.path) if upload.calibration else None,
            evaluation=str(upload.evaluation.path) if upload.evaluation else None,
            limits=self.spec.limits.model_dump(mode="json"), nice=self.spec.worker_nice,
            agreement_samples=rollout.agreement_samples if rollout else 0,
            min_version=self.store.version_floor(model),
        )

        def on_step(event: StepEvent) -> None:
            self._step(self.store.job(job.id), event.name, event.state, event.detail,
                       event.fraction)

        def on_start(pid: int) -> None:
            self.store.update_job(job.id, worker_pid=pid)

        outcome = await self.workers.run(task, on_step, on_start)
        self.store.put_version(VersionRecord(  # recorded first: its number is issued
            model, outcome.version, "available", outcome.config, time.time(),
            precision=outcome.precision, job_id=job.id, metadata=outcome.metadata,
            report=outcome.report,
        ))
        self.store.update_job(job.id, version=outcome.version)
        self._check_footprint(model)
        record = self.store.model(model) or ModelRecord(model, "loading", time.time())
        keep_warm = spec.keep_warm.model_dump(mode="json") if spec.keep_warm else None
        self.store.put_model(replace(record, pools=tuple(pools),
                                     keep_warm=keep_warm or record.keep_warm))
        self.catalog.policies_changed()  # the spec may bring a keep-warm policy
        def on_deploy_step(name: str, state: str, detail: str) -> None:
            self._step(self.store.job(job.id), name, state, detail)

        stable = record.serving_version
        if rollout is not None and stable is not None and stable != outcome.version:
            self.store.update_job(job.id, state="rolling_out", version=outcome.version)
            samples = self._keep_samples(job.id, outcome.agreement)
            result = await self.rollouts.run(job.id, model, stable, outcome.version, rollout,
                                             samples, self.catalog.warm_batches(model),
                                             on_deploy_step)
            if not result.promoted:
                raise DeployFailed(f"version {outcome.version} of {model!r}: {result.reason}")
            async with self.deployer.lock(model):
                removed = self.deployer.prune(model)
        else:
            self.store.update_job(job.id, state="deploying", version=outcome.version)
            async with self.deployer.lock(model):
                await self.deployer.activate(model, outcome.version,
                                             self.catalog.warm_batches(model),
                                             on_step=on_deploy_step)
                removed = self.deployer.prune(model)
        self.on_version_changed(model)
        detail = f"version {outcome.version} serving" + (
            f"; retention removed versions {removed}" if removed else "")
        return self._finish(self.store.job(job.id), "succeeded", None, detail=detail)

    def _check_footprint(self, model: str) -> None:
        """A version whose measured footprint fits no member of its pool (residency) is
        refused: the job fails with both figures and the version is taken back out."""
        placement = self.deployer.placement
        size = read_footprint(self.repository / model)
        why = placement.fits(model, size) if placement is not None and size else None
        if why is not None:
            raise InvalidInput(why)

    def _keep_samples(self, job_id: str, path: str | None) -> Path | None:
        """The worker's evaluation sample, moved out of the job's folder (removed when the
        job ends) for the rollout to replay; it removes the file when it ends."""
        if path is None:
            return None
        target = self.rollouts.samples_dir / f"{job_id}.npz"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(path, target)
        return target

    def _restore(self, job: JobRecord, before: repo_edits.RepositorySnapshot,
                 reason: str) -> None:
        """Take out whatever a failed job added: new versions, its config, staging. The
        versions' records stay, ended (failed or rolled back, with ``reason``)."""
        model = job.model
        record = self.store.model(model)
        if not before.versions and record is not None and record.serving_version is None:
            self.store.delete_model(model)  # a first upload that failed serves nothing
        configs = {v.version: v.config for v in self.store.versions(model, live=True)}
        added = repo_edits.restore(self.repository, model, before, configs)
        state = self._ended_state(self.store.job(job.id))
        for version in added:
            self.store.end_version(model, version, state, reason)
        if added:
            log.warning("job for %s failed: removed unpublished versions %s", model, added)

    def _ended_state(self, job: JobRecord) -> str:
        """``rolled_back`` for the candidate of the job's own rollout, else ``failed``."""
        rollout = self.store.rollout(job.model)
        if rollout is not None and rollout.job_id == job.id and \
                rollout.candidate == job.version and rollout.state != "promoted":
            return "rolled_back"
        return "failed"

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

    async def close(self) -> None:
        """Stop: workers first (their jobs fail with RESTART_REASON), then the tasks."""
        self._closing = True
        await self.workers.close()
        for task in list(self._tasks.values()):
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
