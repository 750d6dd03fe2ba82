"""A throwaway PostgreSQL for tests and benchmarks: Debian's ``postgresql`` package
(``make test`` installs it, like HAProxy), a cluster initialised into a temporary
folder, listening on a free loopback port, without fsync, stopped by its own ``pg_ctl``
and removed.

``initdb`` and ``postgres`` refuse to run as root (as ``make test`` and CI do): then
they run as the ``postgres`` user the package creates, through ``runuser``, in a folder
that user owns (outside pytest's root-only temporary folder)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import psycopg

from infergate.triton.local import free_port

MISSING = ("PostgreSQL's server is not installed (initdb, pg_ctl in /usr/lib/postgresql/*/bin): "
           "`make test` installs Debian's (make system-deps)")


def find_postgres_bin() -> Path | None:
    """The newest Debian PostgreSQL's binaries, else ``initdb`` on PATH."""
    for bindir in sorted(Path("/usr/lib/postgresql").glob("*/bin"),
                         key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
                         reverse=True):
        if (bindir / "initdb").exists() and (bindir / "pg_ctl").exists():
            return bindir
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


class LocalPostgres:
    def __init__(self, bindir: Path, user: str = "test") -> None:
        self.bindir = bindir
        self.user = user
        self.as_root = os.getuid() == 0
        self.folder: Path | None = None
        self.port = 0

    @property
    def data(self) -> Path:
        assert self.folder is not None
        return self.folder / "data"

    def _run(self, *args: str) -> None:
        command = [str(self.bindir / args[0]), *args[1:]]
        if self.as_root:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            log = self.folder / "log" if self.folder else None
            tail = log.read_text()[-2000:] if log is not None and log.exists() else ""
            raise RuntimeError(f"{' '.join(command)} failed: {done.stderr}{done.stdout}{tail}")

    def start(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="infergate-pg-"))
        if self.as_root:
            shutil.chown(self.folder, "postgres")
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", self.user,
                  "--no-sync", "-E", "UTF8", "--locale=C")
        self.port = free_port()
        options = (f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 "
                   "-c fsync=off -c synchronous_commit=off -c full_page_writes=off")
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l",
                  str(self.folder / "log"), "-w", "start")

    def stop(self) -> None:
        if self.folder is None:
            return
        try:
            if (self.data / "postmaster.pid").exists():
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str, template: str = "template0") -> str:
        """A new database (a copy of ``template``); its URL."""
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name} TEMPLATE {template}")
        return self.url(name)
