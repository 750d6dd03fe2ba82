"""The lifecycle's records in PostgreSQL (:class:`PostgresStore`, the other
implementation of :class:`~.store.RecordStore`): one database that every control-plane
replica reads, and the leader writes.

- **Schema**: numbered SQL files in ``migrations/`` (``0001_records.sql``, ...), each
  applied in one transaction together with its row in ``schema_version``, under a
  transaction-scoped advisory lock so that two replicas starting at once apply each file
  once (:func:`migrate`). A database newer than this code is refused.
- **Version numbers**: ``version_numbers`` keeps the highest number issued per model;
  :meth:`PostgresStore.issue_version` raises it in one ``INSERT ... ON CONFLICT DO
  UPDATE ... RETURNING``, which takes the row's lock: two stores on one database never
  get the same number.
- **Fencing**: a store built with a :class:`~.store.Fence` (the replica's
  :class:`~.leader.Leadership`) checks, inside every write's transaction, that the
  leadership's term in the database is still the one it holds (``SELECT ... FOR
  SHARE``, so a new leader's term bump waits for the write, or the write sees the new
  term): a write from a replica that lost leadership is refused with
  :class:`~.store.StaleTerm`, nothing written.
- **Connection**: one connection, autocommit, each operation one transaction under a
  lock (the control plane calls the store from its event loop, rarely from threads);
  one that broke is opened again on the next call. A database that cannot be reached
  is :class:`~gateway.errors.Unavailable`; a write that failed is not retried (it may
  have committed).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import DictRow, dict_row
from psycopg.types.json import Jsonb

from gateway.errors import Conflict, JobNotFound, Unavailable
from gateway.lifecycle.records.store import (
    ACTIVE_JOB_STATES,
    ACTIVE_ROLLOUT_STATES,
    ENDED_VERSION_STATES,
    Fence,
    JobRecord,
    ModelRecord,
    RecordedDemand,
    RecordSet,
    RecordStore,
    RolloutRecord,
    StaleTerm,
    Step,
    TenancyOverride,
    VersionRecord,
    changed_job,
    conflicting_job,
)

log = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).with_name("migrations")
# pg_advisory_xact_lock key of the schema migrations (any constant; "infergat" in ASCII)
MIGRATION_LOCK = 0x696E666572676174
TABLES = ("jobs", "versions", "version_numbers", "rollouts", "models", "recorded_demand",
          "tenancy_override")
Connection = psycopg.Connection[DictRow]
Cursor = psycopg.Cursor[DictRow]


def migrations(folder: Path = MIGRATIONS) -> list[tuple[int, Path]]:
    """The numbered SQL files, in order (``0001_name.sql`` is number 1)."""
    found = sorted((int(p.name.split("_", 1)[0]), p) for p in folder.glob("[0-9]*_*.sql"))
    numbers = [n for n, _ in found]
    if numbers != list(range(1, len(numbers) + 1)):
        raise RuntimeError(f"migrations in {folder} are not numbered 1..n: {numbers}")
    return found


def migrate(conn: Connection, folder: Path = MIGRATIONS) -> int:
    """Apply the migrations the database lacks, each in one transaction with its row in
    ``schema_version``; return the schema version now. ``conn`` is in autocommit."""
    known = migrations(folder)
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version integer PRIMARY "
                     "KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())")
    for number, path in known:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            row = conn.execute("SELECT max(version) AS v FROM schema_version").fetchone()
            current = row["v"] if row and row["v"] is not None else 0
            if current > len(known):
                raise RuntimeError(
                    f"the records database is at schema {current}, newer than this "
                    f"gateway's {len(known)}: run the newer gateway")
            if number <= current:
                continue
            conn.execute(path.read_text())  # no parameters: one script
            conn.execute("INSERT INTO schema_version (version, name) VALUES (%s, %s)",
                         (number, path.name))
            log.info("records database: applied %s", path.name)
    return len(known)


def connect(url: str, **options: Any) -> Connection:
    """A connection in autocommit, rows as dicts; Unavailable if it cannot be had."""
    try:
        return psycopg.connect(url, autocommit=True, row_factory=dict_row,
                               connect_timeout=options.pop("connect_timeout", 5), **options)
    except psycopg.OperationalError as exc:
        raise Unavailable(f"the records database cannot be reached: {exc}") from exc


class PostgresStore(RecordStore):
    """The records in one PostgreSQL database (see the module's docstring). ``fence``:
    the leadership every write must still hold (None: writes unfenced, for one writer,
    tests and ``infergate records copy``)."""

    def __init__(self, url: str, fence: Fence | None = None) -> None:
        self.url = url
        self.fence = fence
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        with self._lock:
            migrate(self._connection())

    def _connection(self) -> Connection:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = connect(self.url)
        return self._conn

    @contextlib.contextmanager
    def _transaction(self, write: bool = True) -> Iterator[Cursor]:
        """One transaction; a write's first checks the fence."""
        with self._lock:
            try:
                conn = self._connection()
                with conn.transaction(), conn.cursor() as cur:
                    if write:
                        self._check_term(cur)
                    yield cur
            except psycopg.OperationalError as exc:
                raise Unavailable(f"the records database failed: {exc}") from exc

    def _check_term(self, cur: Cursor) -> None:
        if self.fence is None:
            return
        term = self.fence.fence_term()  # StaleTerm: this replica knows it does not lead
        row = cur.execute("SELECT term FROM leadership WHERE name = %s FOR SHARE",
                          (self.fence.name,)).fetchone()
        if row is None or row["term"] != term:
            now = row["term"] if row else None
            raise StaleTerm(f"write refused: it carries leadership term {term} of "
                            f"{self.fence.name!r}, the current term is {now}")

    def _one(self, query: str, args: tuple[Any, ...]) -> DictRow | None:
        with self._transaction(write=False) as cur:
            return cur.execute(query, args).fetchone()

    def _all(self, query: str, args: tuple[Any, ...] = ()) -> list[DictRow]:
        with self._transaction(write=False) as cur:
            return cur.execute(query, args).fetchall()

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()

    # -- jobs ------------------------------------------------------------------------------
    def create_job(self, job_id: str, model: str, submitted_by: str) -> JobRecord:
        now = time.time()
        try:
            with self._transaction() as cur:
                row = cur.execute("SELECT id, state FROM jobs WHERE model = %s AND state = "
                                  "ANY(%s)", (model, list(ACTIVE_JOB_STATES))).fetchone()
                if row is not None:
                    raise Conflict(conflicting_job(model, row["id"], row["state"]))
                cur.execute("INSERT INTO jobs (id, model, state, submitted_by, created_at, "
                            "updated_at) VALUES (%s, %s, 'receiving', %s, %s, %s)",
                            (job_id, model, submitted_by, now, now))
        except psycopg.errors.UniqueViolation as exc:
            if exc.diag.constraint_name != "one_active_job_per_model":
                raise Conflict(f"job {job_id!r} exists already") from exc
            # another replica's job, committed between the check and the insert
            raise Conflict(conflicting_job(model, "(another)", "active")) from exc
        return self.job(job_id)

    def update_job(self, job_id: str, **changes: Any) -> JobRecord:
        with self._transaction() as cur:
            row = cur.execute("SELECT * FROM jobs WHERE id = %s FOR UPDATE",
                              (job_id,)).fetchone()
            if row is None:
                raise JobNotFound(f"no job {job_id!r}")
            job = changed_job(_job(row), changes, time.time())
            cur.execute(
                "UPDATE jobs SET state=%s, version=%s, steps=%s, error=%s, spec=%s, "
                "worker_pid=%s, updated_at=%s, finished_at=%s WHERE id=%s",
                (job.state, job.version, Jsonb([asdict(s) for s in job.steps]), job.error,
                 Jsonb(job.spec), job.worker_pid, job.updated_at, job.finished_at, job.id))
        return job

    def job(self, job_id: str) -> JobRecord:
        row = self._one("SELECT * FROM jobs WHERE id = %s", (job_id,))
        if row is None:
            raise JobNotFound(f"no job {job_id!r}")
        return _job(row)

    def jobs(self, model: str | None = None, limit: int = 50) -> list[JobRecord]:
        if model is None:
            rows = self._all("SELECT * FROM jobs ORDER BY created_at DESC LIMIT %s", (limit,))
        else:
            rows = self._all("SELECT * FROM jobs WHERE model = %s ORDER BY created_at DESC "
                             "LIMIT %s", (model, limit))
        return [_job(r) for r in rows]

    def active_jobs(self) -> list[JobRecord]:
        rows = self._all("SELECT * FROM jobs WHERE state = ANY(%s) ORDER BY created_at",
                         (list(ACTIVE_JOB_STATES),))
        return [_job(r) for r in rows]

    # -- versions --------------------------------------------------------------------------
    def put_version(self, record: VersionRecord) -> None:
        row = _version_row(record)
        with self._transaction() as cur:
            cur.execute(_upsert("versions", row, ("model", "version")), tuple(row.values()))
            _issued(cur, record.model, record.version)

    def issue_version(self, model: str, at_least: int = 1) -> int:
        with self._transaction() as cur:
            row = cur.execute(
                "INSERT INTO version_numbers AS n (model, highest) VALUES (%s, %s) "
                "ON CONFLICT (model) DO UPDATE SET highest = GREATEST(n.highest + 1, "
                "excluded.highest) RETURNING highest", (model, max(at_least, 1))).fetchone()
        assert row is not None
        return int(row["highest"])

    def highest_version(self, model: str) -> int:
        row = self._one("SELECT highest FROM version_numbers WHERE model = %s", (model,))
        return int(row["highest"]) if row else 0

    def set_version_state(self, model: str, version: int, state: str) -> None:
        with self._transaction() as cur:
            cur.execute("UPDATE versions SET state = %s WHERE model = %s AND version = %s",
                        (state, model, version))

    def end_version(self, model: str, version: int, state: str, reason: str) -> None:
        if state not in ENDED_VERSION_STATES:
            raise ValueError(f"{state!r} is not a final version state {ENDED_VERSION_STATES}")
        now = time.time()
        with self._transaction() as cur:
            cur.execute(
                "INSERT INTO versions (model, version, state, config, created_at, reason, "
                "ended_at) VALUES (%s, %s, %s, '', %s, %s, %s) ON CONFLICT (model, version) "
                "DO UPDATE SET state = excluded.state, reason = excluded.reason, "
                "ended_at = excluded.ended_at", (model, version, state, now, reason, now))
            _issued(cur, model, version)

    def version(self, model: str, version: int) -> VersionRecord | None:
        row = self._one("SELECT * FROM versions WHERE model = %s AND version = %s",
                        (model, version))
        return _version(row) if row else None

    def versions(self, model: str, live: bool = False) -> list[VersionRecord]:
        records = [_version(r) for r in self._all(
            "SELECT * FROM versions WHERE model = %s ORDER BY version", (model,))]
        return [r for r in records if r.live] if live else records

    # -- rollouts --------------------------------------------------------------------------
    def put_rollout(self, record: RolloutRecord) -> RolloutRecord:
        record = replace(record, updated_at=time.time())
        row = _rollout_row(record)
        with self._transaction() as cur:
            cur.execute(_upsert("rollouts", row, ("job_id",)), tuple(row.values()))
        return record

    def rollout(self, model: str) -> RolloutRecord | None:
        row = self._one("SELECT * FROM rollouts WHERE model = %s ORDER BY started_at DESC "
                        "LIMIT 1", (model,))
        return _rollout(row) if row else None

    def active_rollouts(self) -> list[RolloutRecord]:
        return [_rollout(r) for r in self._all(
            "SELECT * FROM rollouts WHERE state = ANY(%s) ORDER BY started_at",
            (list(ACTIVE_ROLLOUT_STATES),))]

    # -- models ----------------------------------------------------------------------------
    def put_model(self, record: ModelRecord) -> ModelRecord:
        record = replace(record, updated_at=time.time())
        row = _model_row(record)
        with self._transaction() as cur:
            cur.execute(_upsert("models", row, ("name",)), tuple(row.values()))
        return record

    def model(self, name: str) -> ModelRecord | None:
        row = self._one("SELECT * FROM models WHERE name = %s", (name,))
        return _model(row) if row else None

    def models(self) -> list[ModelRecord]:
        return [_model(r) for r in self._all("SELECT * FROM models ORDER BY name")]

    def delete_model(self, name: str) -> None:
        with self._transaction() as cur:
            cur.execute("DELETE FROM models WHERE name = %s", (name,))

    # -- the control plane's own: residency demand, live tenancy ---------------------------
    def _put_one(self, record: RecordedDemand | TenancyOverride) -> None:
        table, row = _one_row(record)
        with self._transaction() as cur:
            cur.execute(_upsert(table, row, ("id",)), tuple(row.values()))

    def recorded_demand(self) -> RecordedDemand | None:
        row = self._one("SELECT * FROM recorded_demand", ())
        return _demand(row) if row else None

    def tenancy_override(self) -> TenancyOverride | None:
        row = self._one("SELECT * FROM tenancy_override", ())
        return _tenancy(row) if row else None

    # -- the whole -------------------------------------------------------------------------
    def export_records(self) -> RecordSet:
        with self._transaction(write=False) as cur:
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            rows = {t: cur.execute(f"SELECT * FROM {t}").fetchall()
                    for t in TABLES}
        return RecordSet.ordered(
            [_job(r) for r in rows["jobs"]], [_version(r) for r in rows["versions"]],
            [(r["model"], int(r["highest"])) for r in rows["version_numbers"]],
            [_rollout(r) for r in rows["rollouts"]], [_model(r) for r in rows["models"]],
            next((_demand(r) for r in rows["recorded_demand"]), None),
            next((_tenancy(r) for r in rows["tenancy_override"]), None))

    def import_records(self, records: RecordSet) -> None:
        with self._transaction() as cur:
            cur.execute(f"TRUNCATE {', '.join(TABLES)}")
            batches: list[tuple[str, list[dict[str, Any]]]] = [
                ("jobs", [_job_row(j) for j in records.jobs]),
                ("versions", [_version_row(v) for v in records.versions]),
                ("version_numbers", [{"model": m, "highest": n}
                                     for m, n in records.version_numbers]),
                ("rollouts", [_rollout_row(r) for r in records.rollouts]),
                ("models", [_model_row(m) for m in records.models])]
            for one in (records.demand, records.tenancy):
                if one is not None:
                    table, row = _one_row(one)
                    batches.append((table, [row]))
            for table, rows in batches:
                if rows:
                    cur.executemany(_insert(table, rows[0]),
                                    [tuple(r.values()) for r in rows])


def _issued(cur: Cursor, model: str, version: int) -> None:
    cur.execute("INSERT INTO version_numbers AS n (model, highest) VALUES (%s, %s) ON "
                "CONFLICT (model) DO UPDATE SET highest = GREATEST(n.highest, "
                "excluded.highest)", (model, version))


def _insert(table: str, row: dict[str, Any]) -> str:
    return (f"INSERT INTO {table} ({', '.join(row)}) "
            f"VALUES ({', '.join(['%s'] * len(row))})")


def _upsert(table: str, row: dict[str, Any], key: tuple[str, ...]) -> Any:
    """INSERT, or replace every column of the row with this key (INSERT OR REPLACE)."""
    columns = ", ".join(f"{c} = excluded.{c}" for c in row if c not in key)
    return f"{_insert(table, row)} ON CONFLICT ({', '.join(key)}) DO UPDATE SET {columns}"


# the columns of each record as stored here (JSON as jsonb): the writers' one shape
def _job_row(job: JobRecord) -> dict[str, Any]:
    return {**asdict(job), "steps": Jsonb([asdict(s) for s in job.steps]),
            "spec": Jsonb(job.spec)}


def _version_row(record: VersionRecord) -> dict[str, Any]:
    return {**asdict(record), "metadata": Jsonb(record.metadata)}


def _rollout_row(record: RolloutRecord) -> dict[str, Any]:
    return {**asdict(record), "spec": Jsonb(record.spec),
            "decisions": Jsonb(list(record.decisions))}


def _model_row(record: ModelRecord) -> dict[str, Any]:
    return {**asdict(record), "pools": Jsonb(list(record.pools)),
            "keep_warm": Jsonb(record.keep_warm) if record.keep_warm is not None else None}


def _one_row(record: RecordedDemand | TenancyOverride) -> tuple[str, dict[str, Any]]:
    """The table of ``record``'s kind, and its one row."""
    if isinstance(record, RecordedDemand):
        return "recorded_demand", {"id": 1, "rates": Jsonb(record.rates),
                                   "saved_at": record.saved_at}
    return "tenancy_override", {
        "id": 1, "document": Jsonb(record.document) if record.document is not None else None,
        "changed_at": record.changed_at}


def _job(row: DictRow) -> JobRecord:
    return JobRecord(**{**row, "steps": tuple(Step(**s) for s in row["steps"])})


def _version(row: DictRow) -> VersionRecord:
    return VersionRecord(**row)


def _model(row: DictRow) -> ModelRecord:
    return ModelRecord(**{**row, "pools": tuple(row["pools"])})


def _rollout(row: DictRow) -> RolloutRecord:
    return RolloutRecord(**{**row, "decisions": tuple(row["decisions"])})


def _demand(row: DictRow) -> RecordedDemand:
    return RecordedDemand(rates={m: float(r) for m, r in row["rates"].items()},
                          saved_at=row["saved_at"])


def _tenancy(row: DictRow) -> TenancyOverride:
    return TenancyOverride(document=row["document"], changed_at=row["changed_at"])
