"""``infergate records``: the lifecycle's records outside a running gateway.

``infergate records copy SQLITE_FILE POSTGRES_URL`` moves a single-replica control
plane's records (``<state_dir>/lifecycle.db``) into the PostgreSQL database several
replicas share (see docs/lifecycle.md, "Records in PostgreSQL")."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import psycopg
import typer

from gateway.errors import GatewayError
from gateway.lifecycle.records.backend import DATABASE_URL_ENV, is_postgres_url
from gateway.lifecycle.records.copy import copy_records
from gateway.lifecycle.records.jobs import LifecycleStore
from gateway.lifecycle.records.postgres import PostgresStore

app = typer.Typer(help="The lifecycle's records (jobs, versions, rollouts, models, "
                  "recorded demand, live tenancy).",
                  no_args_is_help=True)


@app.callback()
def _group() -> None:
    """The lifecycle's records (a group, also while it has one command)."""


def _where(url: str) -> str:
    """The URL without its password, to print."""
    info = psycopg.conninfo.conninfo_to_dict(url)
    return f"postgresql://{info.get('user') or ''}@{info.get('host') or ''}" \
           f"{':' + str(info['port']) if info.get('port') else ''}/{info.get('dbname') or ''}"


@app.command("copy")
def copy_command(
    source: Annotated[Path, typer.Argument(
        help="The SQLite file (the state folder's lifecycle.db). Stop its gateway first.")],
    target: Annotated[str, typer.Argument(
        envvar=DATABASE_URL_ENV, help="The PostgreSQL URL (postgresql://user@host/db).")],
    replace: bool = typer.Option(
        False, "--replace", help="Overwrite a target that holds other records."),
) -> None:
    """Copy every record from SQLite to PostgreSQL, as they are (the highest version
    number ever issued included), in one transaction, read back to check. Run it again
    and it changes nothing; a target holding other records is refused unless --replace."""
    if not source.is_file():
        raise typer.BadParameter(f"no SQLite file {source}", param_hint="SOURCE")
    if not is_postgres_url(target):
        raise typer.BadParameter("must be a postgresql:// URL", param_hint="TARGET")
    from_store = LifecycleStore(source)
    try:
        to_store = PostgresStore(target)
    except GatewayError as exc:
        from_store.close()
        typer.echo(f"[infergate] {exc}", err=True)
        raise typer.Exit(1) from None
    try:
        outcome = copy_records(from_store, to_store, replace=replace)
    except GatewayError as exc:
        typer.echo(f"[infergate] {exc}", err=True)
        raise typer.Exit(1) from None
    finally:
        from_store.close()
        to_store.close()
    counts = ", ".join(f"{n} {kind}" for kind, n in outcome.counts.items())
    verb = "copied" if outcome.copied else "already there, nothing changed"
    typer.echo(f"[infergate] records {verb}: {counts} -> {_where(target)}")
