"""Which store keeps the records: SQLite in the state folder unless a PostgreSQL URL is
configured (``lifecycle.database_url``, or ``$INFERGATE_DATABASE_URL``, which wins)."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest

from gateway.config.lifecycle import LifecycleSpec
from gateway.errors import grpc_status_name, http_status
from gateway.lifecycle.records.backend import DATABASE_URL_ENV, open_store
from gateway.lifecycle.records.jobs import LifecycleStore
from gateway.lifecycle.records.postgres import PostgresStore
from gateway.lifecycle.records.store import StaleTerm


def spec(tmp_path: Path, **fields: str) -> LifecycleSpec:
    return LifecycleSpec(repository=tmp_path / "repo", state_dir=tmp_path / "state",
                         **fields)  # type: ignore[arg-type]


def test_store_is_sqlite_in_state_dir_when_no_database_is_configured(tmp_path: Path) -> None:
    store = open_store(spec(tmp_path), {})
    assert isinstance(store, LifecycleStore)
    assert store.path == tmp_path / "state" / "lifecycle.db" and store.path.exists()
    store.close()
    with pytest.raises(ValueError, match="needs PostgreSQL"):  # nothing to fence there
        open_store(spec(tmp_path), {}, fence=object())  # type: ignore[arg-type]


@pytest.mark.integration  # a real PostgreSQL: make test installs it
def test_store_is_postgres_when_url_configured_or_in_environment(tmp_path: Path,
                                                                 pg_url: str) -> None:
    for configured, environ in ((pg_url, {}), (None, {DATABASE_URL_ENV: pg_url}),
                                ("postgresql://nobody@127.0.0.1:1/x",
                                 {DATABASE_URL_ENV: pg_url})):  # the environment wins
        fields = {"database_url": configured} if configured else {}
        store = open_store(spec(tmp_path, **fields), environ)
        assert isinstance(store, PostgresStore) and store.url == pg_url
        store.close()
    assert not (tmp_path / "state" / "lifecycle.db").exists()


def test_database_url_refused_when_not_postgresql(tmp_path: Path) -> None:
    with pytest.raises(pydantic.ValidationError, match="postgresql:// URL"):
        spec(tmp_path, database_url="sqlite:///x.db")
    with pytest.raises(ValueError, match=f"\\${DATABASE_URL_ENV} must be a postgresql://"):
        open_store(spec(tmp_path), {DATABASE_URL_ENV: "mysql://x"})


def test_stale_term_answers_retryable_503_when_a_write_reaches_a_deposed_leader() -> None:
    error = StaleTerm("not the leader")
    assert (http_status(error), grpc_status_name(error)) == (503, "UNAVAILABLE")
    assert error.retry_after_s == 1.0
