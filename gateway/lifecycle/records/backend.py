"""Which store keeps the lifecycle's records, chosen in one place: PostgreSQL when a
database URL is configured (``lifecycle.database_url``, or ``$INFERGATE_DATABASE_URL``,
which wins: credentials come from a Kubernetes Secret as an environment variable),
else SQLite in the state folder (the default: ``make run`` needs no database)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from gateway.config.lifecycle import LifecycleSpec
from gateway.lifecycle.records.jobs import LifecycleStore
from gateway.lifecycle.records.postgres import PostgresStore
from gateway.lifecycle.records.store import Fence, RecordStore

DATABASE_URL_ENV = "INFERGATE_DATABASE_URL"
SQLITE_FILE = "lifecycle.db"


def database_url(spec: LifecycleSpec, environ: Mapping[str, str]) -> str | None:
    """The PostgreSQL URL the records go to, None for SQLite."""
    url = environ.get(DATABASE_URL_ENV)
    if url and not is_postgres_url(url):
        raise ValueError(f"${DATABASE_URL_ENV} must be a postgresql:// URL")
    return url or spec.database_url


def is_postgres_url(url: str) -> bool:
    return url.startswith(("postgresql://", "postgres://"))


def open_url(url: str, fence: Fence | None = None) -> RecordStore:
    """A store over ``url``: ``postgresql://...`` (or ``postgres://``), else a path to
    a SQLite file (``sqlite:///path`` or the path itself)."""
    if is_postgres_url(url):
        return PostgresStore(url, fence=fence)
    if fence is not None:  # one process writes SQLite: there is nothing to fence
        raise ValueError("a fenced store needs PostgreSQL (lifecycle.database_url)")
    return LifecycleStore(Path(url.removeprefix("sqlite://")))


def open_store(spec: LifecycleSpec, environ: Mapping[str, str],
               fence: Fence | None = None) -> RecordStore:
    """The configured store (see the module's docstring)."""
    url = database_url(spec, environ)
    return open_url(url if url is not None else str(spec.state_dir / SQLITE_FILE), fence)
