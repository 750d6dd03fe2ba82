"""The lifecycle's records in SQLite (:class:`LifecycleStore`, one implementation of
:class:`~.store.RecordStore`; the records themselves are :mod:`.store`'s, re-exported
here): the default, one file in the state folder, one control-plane process.
:class:`~.postgres.PostgresStore` is the other, for several replicas.

The store is used by the control plane only (uploads, job polls, deploys), never on
the inference path. WAL journal with ``synchronous=NORMAL``: a commit does not fsync,
so it costs tens of microseconds on the event loop, and a crashed *process* loses
nothing (the WAL is in the OS page cache); only power loss may drop the last commits.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, cast

from gateway.errors import Conflict, JobNotFound
from gateway.lifecycle.records.store import (
    ACTIVE_JOB_STATES,
    ACTIVE_ROLLOUT_STATES,
    ENDED_VERSION_STATES,
    LIVE_VERSION_STATES,
    TERMINAL_JOB_STATES,
    JobRecord,
    ModelRecord,
    RecordedDemand,
    RecordSet,
    RecordStore,
    RolloutRecord,
    Step,
    TenancyOverride,
    VersionRecord,
    changed_job,
    conflicting_job,
    with_step,
)

__all__ = [  # the records were defined here before the interface: importers keep working
    "ACTIVE_JOB_STATES", "ACTIVE_ROLLOUT_STATES", "ENDED_VERSION_STATES",
    "LIVE_VERSION_STATES", "SCHEMA_VERSION", "TERMINAL_JOB_STATES", "JobRecord",
    "LifecycleStore", "ModelRecord", "RolloutRecord", "Step", "VersionRecord", "with_step",
]

SCHEMA_VERSION = 2  # PRAGMA user_version; see LifecycleStore._migrate

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    state TEXT NOT NULL,
    version INTEGER,
    steps TEXT NOT NULL DEFAULT '[]',
    error TEXT,
    spec TEXT NOT NULL DEFAULT '{}',
    submitted_by TEXT NOT NULL DEFAULT '',
    worker_pid INTEGER,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    finished_at REAL
);
CREATE INDEX IF NOT EXISTS jobs_by_model ON jobs (model, state);
CREATE TABLE IF NOT EXISTS versions (
    model TEXT NOT NULL,
    version INTEGER NOT NULL,
    state TEXT NOT NULL,
    precision TEXT,
    job_id TEXT,
    config TEXT NOT NULL,
    metadata TEXT NOT NULL DEFAULT '{}',
    report TEXT,
    created_at REAL NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    ended_at REAL,
    PRIMARY KEY (model, version)
);
CREATE TABLE IF NOT EXISTS version_numbers (
    model TEXT PRIMARY KEY,
    highest INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS rollouts (
    job_id TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    stable INTEGER NOT NULL,
    candidate INTEGER NOT NULL,
    spec TEXT NOT NULL,
    state TEXT NOT NULL,
    step INTEGER NOT NULL DEFAULT 0,
    percent INTEGER NOT NULL DEFAULT 0,
    decisions TEXT NOT NULL DEFAULT '[]',
    detail TEXT NOT NULL DEFAULT '',
    started_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS rollouts_by_model ON rollouts (model, started_at);
CREATE TABLE IF NOT EXISTS models (
    name TEXT PRIMARY KEY,
    serving_version INTEGER,
    previous_version INTEGER,
    pools TEXT NOT NULL DEFAULT '[]',
    keep_warm TEXT,
    state TEXT NOT NULL,
    detail TEXT NOT NULL DEFAULT '',
    updated_at REAL NOT NULL
);
"""
# user_version 2: the control plane's own records, one row each at most (the residency's
# demand, JSON model -> rps; the tenancy changed through the API, document NULL: deleted)
SCHEMA_2 = (
    "CREATE TABLE IF NOT EXISTS recorded_demand (id INTEGER PRIMARY KEY CHECK (id = 1), "
    "rates TEXT NOT NULL, saved_at REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS tenancy_override (id INTEGER PRIMARY KEY CHECK (id = 1), "
    "document TEXT, changed_at REAL NOT NULL)",
)
TABLES = ("jobs", "versions", "version_numbers", "rollouts", "models", "recorded_demand",
          "tenancy_override")


class LifecycleStore(RecordStore):
    """The records in one SQLite file (see the module's docstring)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(SCHEMA)
        self._migrate()

    def _migrate(self) -> None:
        """Bring a database written by an older gateway up to :data:`SCHEMA_VERSION`
        (``PRAGMA user_version``; 0: before versioned schemas). Each step is idempotent
        and runs in one transaction with the bump."""
        current = self._db.execute("PRAGMA user_version").fetchone()[0]
        if current >= SCHEMA_VERSION:
            return
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            if current < 1:  # final states of versions; the highest number ever issued
                columns = {r["name"] for r in self._db.execute("PRAGMA table_info(versions)")}
                if "reason" not in columns:
                    self._db.execute(
                        "ALTER TABLE versions ADD COLUMN reason TEXT NOT NULL DEFAULT ''")
                if "ended_at" not in columns:
                    self._db.execute("ALTER TABLE versions ADD COLUMN ended_at REAL")
                # existing records keep their numbers: the highest recorded so far (a
                # version record, or a job's, whose version record was deleted)
                self._db.execute(
                    "INSERT INTO version_numbers (model, highest) SELECT model, MAX(v) FROM ("
                    "SELECT model, version AS v FROM versions UNION ALL "
                    "SELECT model, version AS v FROM jobs WHERE version IS NOT NULL) "
                    "WHERE true GROUP BY model ON CONFLICT (model) DO UPDATE SET "
                    "highest = MAX(highest, excluded.highest)")
            if current < 2:  # residency demand and live tenancy (were a file / memory)
                for statement in SCHEMA_2:
                    self._db.execute(statement)
            self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def close(self) -> None:
        self._db.close()

    # -- jobs ------------------------------------------------------------------------------
    def create_job(self, job_id: str, model: str, submitted_by: str) -> JobRecord:
        """A new job in state ``receiving``; Conflict while another job for the model is
        active (check and insert in one transaction)."""
        now = time.time()
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            row = self._db.execute(
                f"SELECT id, state FROM jobs WHERE model = ? AND state IN "
                f"({','.join('?' * len(ACTIVE_JOB_STATES))})",
                (model, *ACTIVE_JOB_STATES),
            ).fetchone()
            if row is not None:
                raise Conflict(conflicting_job(model, row["id"], row["state"]))
            self._db.execute(
                "INSERT INTO jobs (id, model, state, submitted_by, created_at, updated_at) "
                "VALUES (?, ?, 'receiving', ?, ?, ?)",
                (job_id, model, submitted_by, now, now),
            )
        return self.job(job_id)

    def update_job(self, job_id: str, **changes: Any) -> JobRecord:
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            job = changed_job(self.job(job_id), changes, time.time())
            self._write_job(job)
        return job

    def _write_job(self, job: JobRecord) -> None:
        self._db.execute(
            "UPDATE jobs SET state=?, version=?, steps=?, error=?, spec=?, worker_pid=?, "
            "updated_at=?, finished_at=? WHERE id=?",
            (job.state, job.version, json.dumps([asdict(s) for s in job.steps]), job.error,
             json.dumps(job.spec), job.worker_pid, job.updated_at, job.finished_at, job.id),
        )

    def job(self, job_id: str) -> JobRecord:
        row = self._db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise JobNotFound(f"no job {job_id!r}")
        return _job(row)

    def jobs(self, model: str | None = None, limit: int = 50) -> list[JobRecord]:
        query, args = "SELECT * FROM jobs", cast(tuple[str, ...], ())
        if model is not None:
            query, args = query + " WHERE model = ?", (model,)
        rows = self._db.execute(query + " ORDER BY created_at DESC LIMIT ?", (*args, limit))
        return [_job(r) for r in rows]

    def active_jobs(self) -> list[JobRecord]:
        rows = self._db.execute(
            f"SELECT * FROM jobs WHERE state IN ({','.join('?' * len(ACTIVE_JOB_STATES))}) "
            "ORDER BY created_at", ACTIVE_JOB_STATES)
        return [_job(r) for r in rows]

    # -- versions --------------------------------------------------------------------------
    def put_version(self, record: VersionRecord) -> None:
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute(
                "INSERT OR REPLACE INTO versions (model, version, state, precision, job_id, "
                "config, metadata, report, created_at, reason, ended_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (record.model, record.version, record.state, record.precision,
                 record.job_id, record.config, json.dumps(record.metadata), record.report,
                 record.created_at, record.reason, record.ended_at),
            )
            self._issued(record.model, record.version)

    def _issued(self, model: str, version: int) -> None:
        self._db.execute(
            "INSERT INTO version_numbers (model, highest) VALUES (?, ?) ON CONFLICT (model) "
            "DO UPDATE SET highest = MAX(highest, excluded.highest)", (model, version))

    def highest_version(self, model: str) -> int:
        """The highest version number ever issued for ``model`` (0: none yet)."""
        row = self._db.execute("SELECT highest FROM version_numbers WHERE model = ?",
                               (model,)).fetchone()
        return int(row["highest"]) if row else 0

    def issue_version(self, model: str, at_least: int = 1) -> int:
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")  # the write lock: one issuer at a time
            number = max(self.highest_version(model) + 1, at_least)
            self._issued(model, number)
        return number

    def set_version_state(self, model: str, version: int, state: str) -> None:
        self._db.execute("UPDATE versions SET state = ? WHERE model = ? AND version = ?",
                         (state, model, version))

    def end_version(self, model: str, version: int, state: str, reason: str) -> None:
        """``version`` left the repository: its record keeps ``state`` (one of
        :data:`ENDED_VERSION_STATES`) and ``reason``; a version that was never recorded
        (its job failed between publishing and recording it) gets a record of its own.
        Its number stays issued."""
        if state not in ENDED_VERSION_STATES:
            raise ValueError(f"{state!r} is not a final version state {ENDED_VERSION_STATES}")
        now = time.time()
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute(
                "INSERT INTO versions (model, version, state, config, created_at, reason, "
                "ended_at) VALUES (?, ?, ?, '', ?, ?, ?) ON CONFLICT (model, version) DO "
                "UPDATE SET state = excluded.state, reason = excluded.reason, "
                "ended_at = excluded.ended_at",
                (model, version, state, now, reason, now))
            self._issued(model, version)

    def version(self, model: str, version: int) -> VersionRecord | None:
        """The record of ``version``, whatever became of it (see ``live``)."""
        row = self._db.execute("SELECT * FROM versions WHERE model = ? AND version = ?",
                               (model, version)).fetchone()
        return _version(row) if row else None

    def versions(self, model: str, live: bool = False) -> list[VersionRecord]:
        """Every version record of ``model`` by number, ended ones included unless
        ``live``."""
        rows = self._db.execute("SELECT * FROM versions WHERE model = ? ORDER BY version",
                                (model,))
        records = [_version(r) for r in rows]
        return [r for r in records if r.live] if live else records

    # -- rollouts --------------------------------------------------------------------------
    def put_rollout(self, record: RolloutRecord) -> RolloutRecord:
        record = replace(record, updated_at=time.time())
        self._db.execute(
            "INSERT OR REPLACE INTO rollouts (job_id, model, stable, candidate, spec, state, "
            "step, percent, decisions, detail, started_at, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (record.job_id, record.model, record.stable, record.candidate,
             json.dumps(record.spec), record.state, record.step, record.percent,
             json.dumps(list(record.decisions)), record.detail, record.started_at,
             record.updated_at),
        )
        return record

    def rollout(self, model: str) -> RolloutRecord | None:
        """The model's latest rollout (running or ended), None if it never had one."""
        row = self._db.execute("SELECT * FROM rollouts WHERE model = ? ORDER BY started_at "
                               "DESC LIMIT 1", (model,)).fetchone()
        return _rollout(row) if row else None

    def active_rollouts(self) -> list[RolloutRecord]:
        rows = self._db.execute(
            f"SELECT * FROM rollouts WHERE state IN "
            f"({','.join('?' * len(ACTIVE_ROLLOUT_STATES))})", ACTIVE_ROLLOUT_STATES)
        return [_rollout(r) for r in rows]

    # -- models ----------------------------------------------------------------------------
    def put_model(self, record: ModelRecord) -> ModelRecord:
        record = replace(record, updated_at=time.time())
        self._db.execute(
            "INSERT OR REPLACE INTO models (name, serving_version, previous_version, pools, "
            "keep_warm, state, detail, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (record.name, record.serving_version, record.previous_version,
             json.dumps(list(record.pools)),
             json.dumps(record.keep_warm) if record.keep_warm is not None else None,
             record.state, record.detail, record.updated_at),
        )
        return record

    def model(self, name: str) -> ModelRecord | None:
        row = self._db.execute("SELECT * FROM models WHERE name = ?", (name,)).fetchone()
        return _model(row) if row else None

    def models(self) -> list[ModelRecord]:
        return [_model(r) for r in self._db.execute("SELECT * FROM models ORDER BY name")]

    def delete_model(self, name: str) -> None:
        self._db.execute("DELETE FROM models WHERE name = ?", (name,))

    # -- the control plane's own: residency demand, live tenancy ---------------------------
    def _put_one(self, record: RecordedDemand | TenancyOverride) -> None:
        table, row = _one_row(record)
        self._insert(table, [row], or_replace=True)

    def recorded_demand(self) -> RecordedDemand | None:
        row = self._db.execute("SELECT * FROM recorded_demand").fetchone()
        return _demand(row) if row else None

    def tenancy_override(self) -> TenancyOverride | None:
        row = self._db.execute("SELECT * FROM tenancy_override").fetchone()
        return _tenancy(row) if row else None

    # -- the whole -------------------------------------------------------------------------
    def export_records(self) -> RecordSet:
        with self._db:
            self._db.execute("BEGIN")  # one snapshot (WAL: writers go on meanwhile)
            return RecordSet.ordered(
                [_job(r) for r in self._db.execute("SELECT * FROM jobs")],
                [_version(r) for r in self._db.execute("SELECT * FROM versions")],
                [(r["model"], int(r["highest"]))
                 for r in self._db.execute("SELECT * FROM version_numbers")],
                [_rollout(r) for r in self._db.execute("SELECT * FROM rollouts")],
                [_model(r) for r in self._db.execute("SELECT * FROM models")],
                self.recorded_demand(), self.tenancy_override())

    def import_records(self, records: RecordSet) -> None:
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            for table in TABLES:
                self._db.execute(f"DELETE FROM {table}")
            self._insert("jobs", (_job_row(j) for j in records.jobs))
            self._insert("versions", (_version_row(v) for v in records.versions))
            self._insert("version_numbers", ({"model": m, "highest": n}
                                             for m, n in records.version_numbers))
            self._insert("rollouts", (_rollout_row(r) for r in records.rollouts))
            self._insert("models", (_model_row(m) for m in records.models))
            for one in (records.demand, records.tenancy):
                if one is not None:
                    table, row = _one_row(one)
                    self._insert(table, [row])

    def _insert(self, table: str, rows: Iterable[dict[str, Any]],
                or_replace: bool = False) -> None:
        verb = "INSERT OR REPLACE" if or_replace else "INSERT"
        for row in rows:
            self._db.execute(f"{verb} INTO {table} ({', '.join(row)}) VALUES "
                             f"({', '.join('?' * len(row))})", tuple(row.values()))


def _job(row: sqlite3.Row) -> JobRecord:
    return JobRecord(
        id=row["id"], model=row["model"], state=row["state"], version=row["version"],
        steps=tuple(Step(**s) for s in json.loads(row["steps"])), error=row["error"],
        spec=json.loads(row["spec"]), submitted_by=row["submitted_by"],
        worker_pid=row["worker_pid"], created_at=row["created_at"],
        updated_at=row["updated_at"], finished_at=row["finished_at"],
    )


def _version(row: sqlite3.Row) -> VersionRecord:
    return VersionRecord(
        model=row["model"], version=row["version"], state=row["state"],
        precision=row["precision"], job_id=row["job_id"], config=row["config"],
        metadata=json.loads(row["metadata"]), report=row["report"],
        created_at=row["created_at"], reason=row["reason"], ended_at=row["ended_at"],
    )


def _model(row: sqlite3.Row) -> ModelRecord:
    return ModelRecord(
        name=row["name"], state=row["state"], serving_version=row["serving_version"],
        previous_version=row["previous_version"], pools=tuple(json.loads(row["pools"])),
        keep_warm=json.loads(row["keep_warm"]) if row["keep_warm"] else None,
        detail=row["detail"], updated_at=row["updated_at"],
    )


def _rollout(row: sqlite3.Row) -> RolloutRecord:
    return RolloutRecord(
        job_id=row["job_id"], model=row["model"], stable=row["stable"],
        candidate=row["candidate"], spec=json.loads(row["spec"]), state=row["state"],
        step=row["step"], percent=row["percent"],
        decisions=tuple(json.loads(row["decisions"])), detail=row["detail"],
        started_at=row["started_at"], updated_at=row["updated_at"],
    )


def _demand(row: sqlite3.Row) -> RecordedDemand:
    return RecordedDemand(rates={m: float(r) for m, r in json.loads(row["rates"]).items()},
                          saved_at=row["saved_at"])


def _tenancy(row: sqlite3.Row) -> TenancyOverride:
    document = row["document"]
    return TenancyOverride(json.loads(document) if document is not None else None,
                           row["changed_at"])


# the columns of each record as SQLite stores them (JSON as text): the writers' one shape
def _job_row(job: JobRecord) -> dict[str, Any]:
    return {**asdict(job), "steps": json.dumps([asdict(s) for s in job.steps]),
            "spec": json.dumps(job.spec)}


def _version_row(record: VersionRecord) -> dict[str, Any]:
    return {**asdict(record), "metadata": json.dumps(record.metadata)}


def _rollout_row(record: RolloutRecord) -> dict[str, Any]:
    return {**asdict(record), "spec": json.dumps(record.spec),
            "decisions": json.dumps(list(record.decisions))}


def _model_row(record: ModelRecord) -> dict[str, Any]:
    return {**asdict(record), "pools": json.dumps(list(record.pools)),
            "keep_warm": _json_or_null(record.keep_warm)}


def _one_row(record: RecordedDemand | TenancyOverride) -> tuple[str, dict[str, Any]]:
    """The table of ``record``'s kind, and its one row."""
    if isinstance(record, RecordedDemand):
        return "recorded_demand", {"id": 1, "rates": json.dumps(record.rates),
                                   "saved_at": record.saved_at}
    return "tenancy_override", {"id": 1, "document": _json_or_null(record.document),
                                "changed_at": record.changed_at}


def _json_or_null(value: dict[str, Any] | None) -> str | None:
    return json.dumps(value) if value is not None else None
