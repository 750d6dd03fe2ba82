"""What the lifecycle records, whatever keeps them: the records (jobs with per-step
progress, versions, models, progressive rollouts with every verdict) and
:class:`RecordStore`, the one interface the lifecycle writes them through.

Two implementations sit behind it: :class:`~.jobs.LifecycleStore` (SQLite, one file in
the state folder: the default, one control-plane process) and
:class:`~.postgres.PostgresStore` (PostgreSQL, shared by every control-plane replica).
:func:`~.backend.open_store` chooses one from the configuration. Both pass the same
contract tests (``tests/gateway/lifecycle/records/test_store_contract.py``).

Version numbers are never reused: per model the store keeps the highest number ever
issued (:meth:`RecordStore.version_floor` is the least number the next upload may
publish; :meth:`RecordStore.issue_version` reserves one atomically, also between two
processes on one PostgreSQL database), and a version that leaves the repository
(failed, rolled back, deleted) keeps its record with that final state and why
(:meth:`RecordStore.end_version`).

A restarted gateway reads them back: finished and failed jobs are reported as they
ended; a job that was still running when the gateway died is marked failed with that
reason (:meth:`RecordStore.fail_interrupted`).

Two records of the control plane's own live beside them, so that a restart or a failover
to another replica does not lose them: the residency's measured demand
(:class:`RecordedDemand`, written whole every few seconds, read at start to preload by
use) and the tenancy changed through the API (:class:`TenancyOverride`, applied over the
configuration file's at start).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

from gateway.errors import Unavailable

ACTIVE_JOB_STATES = ("receiving", "queued", "converting", "deploying", "rolling_out")
ACTIVE_ROLLOUT_STATES = ("running", "paused")
TERMINAL_JOB_STATES = ("succeeded", "failed")
# a version in the repository (loadable) / one that left it, its record kept for history
LIVE_VERSION_STATES = ("available", "serving")
ENDED_VERSION_STATES = ("failed", "rolled_back", "deleted")


@dataclass(frozen=True)
class Step:
    """One step of a job: ``state`` is running, done, failed or skipped."""

    name: str
    state: str
    started_at: float
    finished_at: float | None = None
    detail: str = ""
    fraction: float | None = None  # progress inside the step, 0..1, when known


@dataclass(frozen=True)
class JobRecord:
    id: str
    model: str
    state: str
    created_at: float
    updated_at: float
    version: int | None = None
    steps: tuple[Step, ...] = ()
    error: str | None = None
    spec: dict[str, Any] = field(default_factory=dict)
    submitted_by: str = ""
    worker_pid: int | None = None
    finished_at: float | None = None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["steps"] = [asdict(s) for s in self.steps]
        return data


@dataclass(frozen=True)
class VersionRecord:
    """``state``: available (on disk, loadable) or serving, while the version is in the
    repository; failed (its job failed after publishing it), rolled_back (its rollout
    did not promote it) or deleted (by an operator or retention) once it left it, with
    ``reason`` and ``ended_at``. Its number is never issued again."""

    model: str
    version: int
    state: str
    config: str  # config.pbtxt as published with this version
    created_at: float
    precision: str | None = None
    job_id: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    report: str | None = None  # report file, relative to the version folder
    reason: str = ""  # why it ended (failed, rolled_back, deleted)
    ended_at: float | None = None

    @property
    def live(self) -> bool:
        """In the repository: a serving or rollback target."""
        return self.state in LIVE_VERSION_STATES


@dataclass(frozen=True)
class ModelRecord:
    """``state``: loading (first version on its way), serving, failed, unloaded."""

    name: str
    state: str
    updated_at: float
    serving_version: int | None = None
    previous_version: int | None = None
    pools: tuple[str, ...] = ()
    keep_warm: dict[str, Any] | None = None
    detail: str = ""


@dataclass(frozen=True)
class RolloutRecord:
    """A progressive rollout of ``candidate`` against ``stable`` (the upload job's).
    ``state``: running, paused, promoted, rolled_back, aborted, interrupted (the gateway
    stopped during it: stable serves). ``decisions``: every verdict with its figures."""

    job_id: str
    model: str
    stable: int
    candidate: int
    spec: dict[str, Any]
    state: str
    started_at: float
    updated_at: float
    step: int = 0  # index into spec["steps"]
    percent: int = 0  # the candidate's share of unversioned requests now
    decisions: tuple[dict[str, Any], ...] = ()
    detail: str = ""

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_ROLLOUT_STATES

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "decisions": list(self.decisions)}


def with_step(steps: tuple[Step, ...], name: str, state: str, detail: str = "",
              fraction: float | None = None, now: float | None = None) -> tuple[Step, ...]:
    """``steps`` with step ``name`` started, updated or finished (appended if new).

    Starting a step finishes any other step still running (the pipeline runs one at a
    time); a step that ends keeps its start time."""
    now = time.time() if now is None else now
    finished = None if state == "running" else now
    out = []
    found = False
    for step in steps:
        if step.name == name:
            found = True
            step = replace(step, state=state, finished_at=finished, detail=detail or step.detail,
                           fraction=fraction if fraction is not None else step.fraction)
        elif step.state == "running" and state == "running":
            step = replace(step, state="done", finished_at=now)
        out.append(step)
    if not found:
        out.append(Step(name, state, now, finished, detail, fraction))
    return tuple(out)


def changed_job(job: JobRecord, changes: Mapping[str, Any], now: float) -> JobRecord:
    """``job`` with ``changes`` applied at ``now``; a job that reaches a final state gets
    its ``finished_at`` (both stores update jobs through this)."""
    job = replace(job, **changes, updated_at=now)
    if job.state in TERMINAL_JOB_STATES and job.finished_at is None:
        job = replace(job, finished_at=job.updated_at)
    return job


def conflicting_job(model: str, job_id: str, state: str) -> str:
    return (f"model {model!r} already has job {job_id} in progress (state {state}); "
            "wait for it to finish before uploading again")


@dataclass(frozen=True)
class RecordedDemand:
    """What the residency measured (``gateway/residency/demand.py``): model -> requests
    per second, and when it was saved. Written whole, read whole."""

    rates: dict[str, float]
    saved_at: float


@dataclass(frozen=True)
class TenancyOverride:
    """The tenancy changed through the API (``PUT``/``DELETE /v1/tenants``), over the
    configuration file's: ``document`` is the tenancy document ``PUT`` accepted (its keys
    as digests), None where ``DELETE`` turned tenancy off. No override at all (the
    store's None): the configuration file's tenancy."""

    document: dict[str, Any] | None
    changed_at: float

    @property
    def deleted(self) -> bool:
        return self.document is None


@dataclass(frozen=True)
class RecordSet:
    """Every record a store holds, exactly as stored (timestamps included): what
    :meth:`RecordStore.export_records` reads and :meth:`RecordStore.import_records`
    writes (``infergate records copy``). Ordered, so that two stores holding the same
    records compare equal."""

    jobs: tuple[JobRecord, ...] = ()
    versions: tuple[VersionRecord, ...] = ()
    version_numbers: tuple[tuple[str, int], ...] = ()  # (model, highest number issued)
    rollouts: tuple[RolloutRecord, ...] = ()
    models: tuple[ModelRecord, ...] = ()
    demand: RecordedDemand | None = None
    tenancy: TenancyOverride | None = None

    @classmethod
    def ordered(cls, jobs: list[JobRecord], versions: list[VersionRecord],
                version_numbers: list[tuple[str, int]], rollouts: list[RolloutRecord],
                models: list[ModelRecord], demand: RecordedDemand | None = None,
                tenancy: TenancyOverride | None = None) -> RecordSet:
        return cls(tuple(sorted(jobs, key=lambda j: j.id)),
                   tuple(sorted(versions, key=lambda v: (v.model, v.version))),
                   tuple(sorted(version_numbers)),
                   tuple(sorted(rollouts, key=lambda r: r.job_id)),
                   tuple(sorted(models, key=lambda m: m.name)), demand, tenancy)

    @property
    def empty(self) -> bool:
        return not (self.jobs or self.versions or self.version_numbers or self.rollouts
                    or self.models or self.demand or self.tenancy)

    def counts(self) -> dict[str, int]:
        return {"jobs": len(self.jobs), "versions": len(self.versions),
                "version_numbers": len(self.version_numbers),
                "rollouts": len(self.rollouts), "models": len(self.models),
                "demand_models": len(self.demand.rates) if self.demand else 0,
                "tenancy_overrides": int(self.tenancy is not None)}


class StaleTerm(Unavailable):
    """A write carried a leadership term that is no longer the current one (another
    replica leads now), or came from a replica that does not lead: refused, nothing
    written. Retryable: the new leader takes such writes."""


class Fence(Protocol):
    """What a fenced store asks before each write: the leadership ``name`` and the term
    this process believes it holds (:meth:`fence_term` raises :class:`StaleTerm` when it
    holds none). :class:`~.leader.Leadership` is one."""

    @property
    def name(self) -> str: ...

    def fence_term(self) -> int: ...


class RecordStore(ABC):
    """The lifecycle's records, whatever keeps them. Used by the control plane only
    (uploads, job polls, deploys, rollouts), never on the inference path."""

    # -- jobs ------------------------------------------------------------------------------
    @abstractmethod
    def create_job(self, job_id: str, model: str, submitted_by: str) -> JobRecord:
        """A new job in state ``receiving``; Conflict while another job for the model is
        active (check and insert in one transaction)."""

    @abstractmethod
    def update_job(self, job_id: str, **changes: Any) -> JobRecord:
        """The job with ``changes`` (fields of :class:`JobRecord`), read and written in
        one transaction (:func:`changed_job`); JobNotFound if there is none."""

    @abstractmethod
    def job(self, job_id: str) -> JobRecord:
        """JobNotFound if there is none."""

    @abstractmethod
    def jobs(self, model: str | None = None, limit: int = 50) -> list[JobRecord]:
        """The newest jobs first, of ``model`` or of all."""

    @abstractmethod
    def active_jobs(self) -> list[JobRecord]:
        """Jobs in one of :data:`ACTIVE_JOB_STATES`."""

    def fail_interrupted(self, reason: str,
                         by_state: Mapping[str, str] | None = None) -> list[str]:
        """Jobs left active by a previous gateway process become failed, with
        ``reason``, or the reason ``by_state`` gives for the state the job was in (a job
        cut while ``rolling_out`` had no worker to lose: its wording is the rollout's)."""
        ids = []
        for job in self.active_jobs():
            why = (by_state or {}).get(job.state, reason)
            now = time.time()
            steps = tuple(replace(s, state="failed", finished_at=now, detail=why)
                          if s.state == "running" else s for s in job.steps)
            self.update_job(job.id, state="failed", error=why, steps=steps)
            ids.append(job.id)
        return ids

    # -- versions --------------------------------------------------------------------------
    @abstractmethod
    def put_version(self, record: VersionRecord) -> None:
        """Record (or replace) ``record``; its number counts as issued."""

    @abstractmethod
    def issue_version(self, model: str, at_least: int = 1) -> int:
        """Reserve the next number of ``model``: one above every number ever issued, and
        at least ``at_least``; atomic, so two writers never get the same number."""

    @abstractmethod
    def highest_version(self, model: str) -> int:
        """The highest version number ever issued for ``model`` (0: none yet)."""

    def version_floor(self, model: str) -> int:
        """The least number the next version of ``model`` may take: one above every
        number ever issued (the converter also stays above the versions on disk)."""
        return self.highest_version(model) + 1

    @abstractmethod
    def set_version_state(self, model: str, version: int, state: str) -> None: ...

    @abstractmethod
    def end_version(self, model: str, version: int, state: str, reason: str) -> None:
        """``version`` left the repository: its record keeps ``state`` (one of
        :data:`ENDED_VERSION_STATES`) and ``reason``; a version that was never recorded
        (its job failed between publishing and recording it) gets a record of its own.
        Its number stays issued."""

    def delete_version(self, model: str, version: int, reason: str = "deleted") -> None:
        """The version was removed from the repository: recorded ``deleted``."""
        self.end_version(model, version, "deleted", reason)

    @abstractmethod
    def version(self, model: str, version: int) -> VersionRecord | None:
        """The record of ``version``, whatever became of it (see ``live``)."""

    def live_version(self, model: str, version: int) -> VersionRecord | None:
        """The record of ``version`` while it is in the repository (available or
        serving); None for one that failed, was rolled back or deleted."""
        record = self.version(model, version)
        return record if record is not None and record.live else None

    @abstractmethod
    def versions(self, model: str, live: bool = False) -> list[VersionRecord]:
        """Every version record of ``model`` by number, ended ones included unless
        ``live``."""

    # -- rollouts --------------------------------------------------------------------------
    @abstractmethod
    def put_rollout(self, record: RolloutRecord) -> RolloutRecord:
        """Record (or replace) the rollout, stamped with the time now."""

    @abstractmethod
    def rollout(self, model: str) -> RolloutRecord | None:
        """The model's latest rollout (running or ended), None if it never had one."""

    @abstractmethod
    def active_rollouts(self) -> list[RolloutRecord]: ...

    # -- models ----------------------------------------------------------------------------
    @abstractmethod
    def put_model(self, record: ModelRecord) -> ModelRecord:
        """Record (or replace) the model, stamped with the time now."""

    @abstractmethod
    def model(self, name: str) -> ModelRecord | None: ...

    @abstractmethod
    def models(self) -> list[ModelRecord]:
        """By name."""

    @abstractmethod
    def delete_model(self, name: str) -> None: ...

    # -- the control plane's own: residency demand, live tenancy ---------------------------
    def record_demand(self, rates: Mapping[str, float]) -> RecordedDemand:
        """Replace the recorded demand with ``rates`` (model -> requests per second),
        stamped with the time now. A leader's write (fenced)."""
        record = RecordedDemand(dict(rates), time.time())
        self._put_one(record)
        return record

    @abstractmethod
    def recorded_demand(self) -> RecordedDemand | None:
        """The demand recorded last; None if none ever was."""

    def set_tenancy_override(self, document: Mapping[str, Any] | None) -> TenancyOverride:
        """Record the tenancy changed through the API: ``document`` (``PUT``), or None
        (``DELETE``: tenancy off), stamped with the time now. A leader's write
        (fenced)."""
        record = TenancyOverride(dict(document) if document is not None else None,
                                 time.time())
        self._put_one(record)
        return record

    @abstractmethod
    def tenancy_override(self) -> TenancyOverride | None:
        """The tenancy changed through the API last; None: never (the configuration
        file's applies)."""

    @abstractmethod
    def _put_one(self, record: RecordedDemand | TenancyOverride) -> None:
        """Record ``record`` in place of the one of its kind (each is one row)."""

    # -- the whole -------------------------------------------------------------------------
    @abstractmethod
    def export_records(self) -> RecordSet:
        """Every record, read in one transaction (a consistent snapshot)."""

    @abstractmethod
    def import_records(self, records: RecordSet) -> None:
        """Replace every record with ``records``, exactly (timestamps kept), in one
        transaction."""

    @abstractmethod
    def close(self) -> None: ...
