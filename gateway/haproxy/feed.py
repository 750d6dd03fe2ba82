"""The control plane's feed of data-plane snapshots, for data-plane replicas that run
elsewhere (Kubernetes: the data-plane Deployment, each pod HAProxy + an agent).

Replicas long-poll ``GET /v1/dataplane/snapshot?have=<version>&agent=<id>``: the answer
comes as soon as the snapshot differs from ``have`` (or after ``wait`` seconds with
304). Each poll also says which version that replica has applied, so a lifecycle step
can wait (bounded) until every live replica routes by what it just changed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fastapi import APIRouter, Depends, Query, Response
from fastapi.responses import JSONResponse

from gateway.auth import Scope, TokenTable
from gateway.control.lifecycle_http import requires
from gateway.core import Core
from gateway.haproxy.controller import snapshot_of
from gateway.haproxy.snapshot import Snapshot, snapshot_to_dict, snapshot_version

POLL_S = 0.1
LIVE_AGENT_S = 10.0  # a replica that polled within this long counts as live


@dataclass
class SnapshotFeed:
    core: Core
    auth: TokenTable
    settle_timeout_s: float = 5.0
    clock: Callable[[], float] = time.monotonic
    agents: dict[str, tuple[str, float]] = field(default_factory=dict)  # id -> (have, seen)

    def current(self) -> tuple[str, Snapshot]:
        snapshot = snapshot_of(self.core.state, self.auth, self.core.clock())
        return snapshot_version(snapshot), snapshot

    def saw(self, agent: str, have: str) -> None:
        self.agents[agent] = (have, self.clock())
        if len(self.agents) > 1000:  # bounded: forget the longest silent
            oldest = min(self.agents, key=lambda a: self.agents[a][1])
            del self.agents[oldest]

    async def next_after(self, have: str, wait_s: float) -> tuple[str, Snapshot] | None:
        """The snapshot once it differs from ``have``; None after ``wait_s``."""
        deadline = self.clock() + wait_s
        while True:
            version, snapshot = self.current()
            if version != have:
                return version, snapshot
            if self.clock() >= deadline:
                return None
            await asyncio.sleep(POLL_S)

    async def settle(self) -> None:
        """Until every live replica has applied the current snapshot (bounded)."""
        deadline = self.clock() + self.settle_timeout_s
        while self.clock() < deadline:
            version, _ = self.current()
            now = self.clock()
            behind = [a for a, (have, seen) in self.agents.items()
                      if now - seen <= LIVE_AGENT_S and have != version]
            if not behind:
                return
            await asyncio.sleep(POLL_S)


def feed_router(feed: SnapshotFeed, auth: TokenTable) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/dataplane/snapshot", dependencies=[Depends(requires(auth, Scope.ADMIN))])
    async def snapshot(have: str = "", agent: str = "",
                       wait: float = Query(0.0, ge=0.0, le=30.0)) -> Response:
        """The data-plane snapshot (versioned by content); long-polls up to ``wait``
        seconds for one newer than ``have``."""
        if agent:
            feed.saw(agent[:128], have)
        found = await feed.next_after(have, wait)
        if found is None:
            return Response(status_code=304)
        version, current = found
        return JSONResponse({"version": version, "snapshot": snapshot_to_dict(current)},
                            headers={"ETag": f'"{version}"'})

    return router
