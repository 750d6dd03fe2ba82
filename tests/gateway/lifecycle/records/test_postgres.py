"""The PostgreSQL store beyond the contract: numbered migrations applied once each, also
by two replicas starting together; a database newer than the code refused; a store
that outlives its connection; an unreachable database reported as Unavailable; the
database's own guard of one active job per model in step with the code's states."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gateway.errors import Unavailable
from gateway.lifecycle.records.postgres import PostgresStore, connect, migrate, migrations
from gateway.lifecycle.records.store import ACTIVE_JOB_STATES, ModelRecord
from infergate.postgres import LocalPostgres
from infergate.triton.local import free_port
from tests.gateway.lifecycle.records.test_store_contract import _at_once

pytestmark = pytest.mark.integration  # a real PostgreSQL: make test installs it


def test_migrate_applies_each_file_once_when_two_replicas_start_together(
        postgres: LocalPostgres) -> None:
    url = postgres.create_database("fresh_together")
    conns = [connect(url), connect(url)]
    try:
        assert _at_once([lambda c=c: migrate(c) for c in conns]) == [4, 4]
        rows = conns[0].execute("SELECT version, name FROM schema_version ORDER BY version")
        assert [(r["version"], r["name"]) for r in rows] == [
            (n, p.name) for n, p in migrations()]
        assert migrate(conns[0]) == 4  # again: nothing to do
    finally:
        for conn in conns:
            conn.close()


def test_migrate_rolls_back_a_file_whole_when_it_fails(postgres: LocalPostgres,
                                                       tmp_path: Path) -> None:
    (tmp_path / "0001_one.sql").write_text("CREATE TABLE one (x int);")
    (tmp_path / "0002_broken.sql").write_text("CREATE TABLE two (x int); SELECT nope;")
    with connect(postgres.create_database("fresh_broken")) as conn:
        with pytest.raises(Exception, match="nope"):
            migrate(conn, tmp_path)
        tables = {r["tablename"] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
        assert tables == {"schema_version", "one"}  # 0002 left nothing behind
        assert [r["version"] for r in conn.execute("SELECT version FROM schema_version")] == [1]


def test_store_refuses_database_when_its_schema_is_newer(pg_url: str) -> None:
    with connect(pg_url) as conn:
        conn.execute("INSERT INTO schema_version (version, name) VALUES (99, 'future.sql')")
        try:
            with pytest.raises(RuntimeError, match="schema 99, newer than this gateway's 4"):
                PostgresStore(pg_url)
        finally:
            conn.execute("DELETE FROM schema_version WHERE version = 99")


def test_store_reconnects_when_its_connection_was_killed(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    store.put_model(ModelRecord("m", "serving", 0.0))
    with connect(pg_url) as admin:
        admin.execute("SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE "
                      "datname = current_database() AND pid <> pg_backend_pid()")
    with pytest.raises(Unavailable, match="records database failed"):
        store.model("m")  # this call finds the connection dead: not retried
    assert store.model("m") is not None  # the next one opens another
    store.close()


def test_store_raises_unavailable_when_database_cannot_be_reached() -> None:
    with pytest.raises(Unavailable, match="cannot be reached"):
        PostgresStore(f"postgresql://test@127.0.0.1:{free_port()}/records?connect_timeout=2")


def test_one_active_job_index_names_every_active_state_when_migrated(pg_url: str) -> None:
    with connect(pg_url) as conn:
        row = conn.execute("SELECT indexdef FROM pg_indexes WHERE indexname = "
                           "'one_active_job_per_model'").fetchone()
    assert row is not None
    assert set(re.findall(r"'(\w+)'::text", row["indexdef"])) == set(ACTIVE_JOB_STATES)
