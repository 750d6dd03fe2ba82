"""One HAProxy process that follows snapshots: rendered at start, then moved to each
next snapshot by runtime commands when they can, else by a seamless reload. Shared by
the control plane's own HAProxy and the data-plane agent's."""

from __future__ import annotations

import asyncio
import logging

from gateway.haproxy.changes import runtime_commands
from gateway.haproxy.process import HAProxyProcess, write_files
from gateway.haproxy.render import Rendered, render
from gateway.haproxy.runtime import RuntimeAPI
from gateway.haproxy.snapshot import Layout, Snapshot

log = logging.getLogger(__name__)


class SnapshotProxy:
    def __init__(self, layout: Layout, process: HAProxyProcess) -> None:
        self.layout = layout
        self.process = process
        self.applied: Snapshot | None = None
        self._written: Rendered | None = None  # the files on disk
        self.reloads = 0
        self._lock = asyncio.Lock()

    @property
    def api(self) -> RuntimeAPI:
        return RuntimeAPI(self.layout.admin_socket)

    def start(self, snapshot: Snapshot) -> None:
        """Files, then the process (blocking)."""
        self.layout.run_dir.mkdir(parents=True, exist_ok=True)
        self._write(render(snapshot, self.layout))
        self.process.start()
        self.applied = snapshot

    def move(self, snapshot: Snapshot) -> str:
        """Blocking; ``same``, ``runtime`` or ``reload``. Files first, so that a reload
        or a restart renders what runs."""
        if snapshot == self.applied:
            return "same"
        assert self.applied is not None, "start() first"
        commands = runtime_commands(self.applied, snapshot, self.layout)
        self._write(render(snapshot, self.layout))
        if commands is None:
            log.info("HAProxy: structural change, reloading")
            self.process.reload()
            self.reloads += 1
        elif commands:
            self.api.run(commands)
        self.applied = snapshot
        return "reload" if commands is None else "runtime"

    def _write(self, rendered: Rendered) -> None:
        # a failed write leaves the cache empty: the next one writes every file again
        written, self._written = self._written, None
        write_files(rendered, self.layout, written)
        self._written = rendered

    async def amove(self, snapshot: Snapshot) -> str:
        async with self._lock:
            return await asyncio.to_thread(self.move, snapshot)
