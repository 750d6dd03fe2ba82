"""A real PostgreSQL for the records' tests (Debian's, started once per session: see
tests/postgres.py), a fresh database per test, and ``backend``: each storage contract
test runs against SQLite and PostgreSQL alike."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.lifecycle.records.jobs import LifecycleStore
from gateway.lifecycle.records.postgres import TABLES, PostgresStore, connect, migrate
from gateway.lifecycle.records.store import RecordStore
from infergate.postgres import LocalPostgres

RECORDS = "records"  # migrated once, emptied before each test that uses it


@pytest.fixture(scope="session")
def records_db(postgres: LocalPostgres) -> str:
    """The session's records database, migrated once."""
    url = postgres.create_database(RECORDS)
    with connect(url) as conn:
        migrate(conn)
    return url


@pytest.fixture
def pg_url(records_db: str) -> str:
    """The session's records database, migrated and empty (emptying it costs a few
    milliseconds; a database of each test's own, a tenth of a second)."""
    url = records_db
    with connect(url) as conn:
        conn.execute(f"TRUNCATE {', '.join(TABLES)}, leadership")
    return url


@dataclass
class Backend:
    """Opens stores over one place (a SQLite file, a PostgreSQL database): a second
    store over it is another process's view, or the same process restarted."""

    name: str
    open: Callable[[], RecordStore]
    url: str


# PostgreSQL is a real process, like HAProxy's tests: integration (make test installs it)
@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.integration)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    opened: list[RecordStore] = []
    if request.param == "sqlite":
        path = tmp_path / "state" / "lifecycle.db"
        url = str(path)

        def make() -> RecordStore:
            return LifecycleStore(path)
    else:
        url = request.getfixturevalue("pg_url")

        def make() -> RecordStore:
            return PostgresStore(url)

    def open_one() -> RecordStore:
        opened.append(make())
        return opened[-1]

    yield Backend(request.param, open_one, url)
    for store in opened:
        store.close()


@pytest.fixture
def store(backend: Backend) -> RecordStore:
    return backend.open()
