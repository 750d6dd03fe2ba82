"""Version numbers are never reused: the store keeps the highest number ever issued per
model, a version that leaves the repository keeps its record with its final state and
why, and a database written before this change opens with its numbers kept."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from gateway.lifecycle.records.jobs import SCHEMA_VERSION, LifecycleStore, VersionRecord

# the tables as a gateway before versioned schemas wrote them (user_version 0)
OLD_SCHEMA = """
CREATE TABLE jobs (
    id TEXT PRIMARY KEY, model TEXT NOT NULL, state TEXT NOT NULL, version INTEGER,
    steps TEXT NOT NULL DEFAULT '[]', error TEXT, spec TEXT NOT NULL DEFAULT '{}',
    submitted_by TEXT NOT NULL DEFAULT '', worker_pid INTEGER, created_at REAL NOT NULL,
    updated_at REAL NOT NULL, finished_at REAL);
CREATE TABLE versions (
    model TEXT NOT NULL, version INTEGER NOT NULL, state TEXT NOT NULL, precision TEXT,
    job_id TEXT, config TEXT NOT NULL, metadata TEXT NOT NULL DEFAULT '{}', report TEXT,
    created_at REAL NOT NULL, PRIMARY KEY (model, version));
CREATE TABLE models (
    name TEXT PRIMARY KEY, serving_version INTEGER, previous_version INTEGER,
    pools TEXT NOT NULL DEFAULT '[]', keep_warm TEXT, state TEXT NOT NULL,
    detail TEXT NOT NULL DEFAULT '', updated_at REAL NOT NULL);
"""


def _versions(store: LifecycleStore, model: str, *states: str) -> None:
    for number, state in enumerate(states, start=1):
        store.put_version(VersionRecord(model, number, state, "name: 'm'", time.time(),
                                        precision="fp32", job_id=f"job-{number}"))


def test_numbers_only_grow_when_a_version_failed(tmp_path: Path) -> None:
    store = LifecycleStore(tmp_path / "db.sqlite")
    assert store.version_floor("m") == 1  # a model never seen starts at 1
    _versions(store, "m", "serving", "available")
    assert store.version_floor("m") == 3
    store.end_version("m", 2, "failed", "version 2 of 'm' did not go live: refused")
    failed = store.version("m", 2)
    assert failed is not None and failed.state == "failed" and not failed.live
    assert failed.reason == "version 2 of 'm' did not go live: refused"
    assert failed.ended_at is not None and failed.precision == "fp32"  # the rest is kept
    assert failed.job_id == "job-2"
    assert store.live_version("m", 2) is None
    assert [v.version for v in store.versions("m", live=True)] == [1]
    assert [(v.version, v.state) for v in store.versions("m")] == [(1, "serving"),
                                                                  (2, "failed")]
    assert store.version_floor("m") == 3  # 2 is never issued again
    assert store.version_floor("other") == 1  # per model
    store.close()
    assert LifecycleStore(tmp_path / "db.sqlite").version_floor("m") == 3


def test_numbers_only_grow_when_a_version_is_deleted_or_its_model_forgotten(
        tmp_path: Path) -> None:
    store = LifecycleStore(tmp_path / "db.sqlite")
    _versions(store, "m", "available", "available", "serving")
    store.delete_version("m", 3, "deleted by an operator")
    store.delete_version("m", 2)
    assert [(v.version, v.state) for v in store.versions("m")] == [
        (1, "available"), (2, "deleted"), (3, "deleted")]
    assert store.version("m", 3).reason == "deleted by an operator"  # type: ignore[union-attr]
    assert store.version_floor("m") == 4
    store.delete_model("m")  # a failed first upload forgets the model, not its numbers
    assert store.version_floor("m") == 4


def test_a_version_never_recorded_gets_a_record_of_its_own_when_it_ends(
        tmp_path: Path) -> None:
    """A job that failed between the converter's publish and the gateway's record."""
    store = LifecycleStore(tmp_path / "db.sqlite")
    _versions(store, "m", "serving")
    store.end_version("m", 7, "failed", "the worker died")
    ended = store.version("m", 7)
    assert ended is not None and (ended.state, ended.reason) == ("failed", "the worker died")
    assert store.version_floor("m") == 8
    with pytest.raises(ValueError, match="not a final version state"):
        store.end_version("m", 1, "available", "")


def test_old_database_opens_with_its_numbers_and_final_states_added(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    old = sqlite3.connect(path)
    old.executescript(OLD_SCHEMA)
    now = time.time()
    old.executemany(
        "INSERT INTO versions (model, version, state, config, created_at) VALUES (?,?,?,?,?)",
        [("a", 1, "available", "name: 'a'", now), ("a", 2, "serving", "name: 'a'", now),
         ("b", 1, "serving", "name: 'b'", now)])
    # b's version 4 was deleted before this change: only its job remembers the number
    old.execute("INSERT INTO jobs (id, model, state, version, created_at, updated_at) "
                "VALUES ('job-b', 'b', 'failed', 4, ?, ?)", (now, now))
    old.commit()
    old.close()

    store = LifecycleStore(path)
    assert store._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert [(v.version, v.state, v.reason, v.ended_at) for v in store.versions("a")] == [
        (1, "available", "", None), (2, "serving", "", None)]
    assert (store.version_floor("a"), store.version_floor("b")) == (3, 5)
    assert store.job("job-b").version == 4
    store.end_version("a", 1, "deleted", "retention")
    store.close()

    reopened = LifecycleStore(path)  # migrating again changes nothing
    assert (reopened.version_floor("a"), reopened.version_floor("b")) == (3, 5)
    assert reopened.version("a", 1).state == "deleted"  # type: ignore[union-attr]
