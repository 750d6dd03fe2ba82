"""Keep-warm: synthetic requests to every member of an idle model's pools.

A model that has seen no user request for ``idle_after_s`` gets, every ``interval_s``,
one request per configured batch size on each available member serving it (so every
instance stays hot: caches, thread pools, on GPUs the clocks and the CUDA context).
Busy models get nothing: real traffic keeps them warm. The requests go through the
upstream client to the member itself and are counted by
:meth:`gateway.telemetry.Telemetry.synthetic` with ``traffic="warmup"``, apart from
user traffic and so out of SLO figures.

The decision (:func:`due_models`) is a pure function of the policies, the last user
request per model and the clock; :class:`KeepWarm` does the I/O.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from tritonclient.grpc import model_config_pb2 as mc

from gateway.config.lifecycle import KeepWarmPolicy
from gateway.core import Core
from gateway.errors import GatewayError
from gateway.pools import PoolMember
from gateway.upstream.triton import MemberAdmin, synthetic_request

log = logging.getLogger(__name__)
PolicySource = Callable[[], Mapping[str, KeepWarmPolicy]]


def due_models(policies: Mapping[str, KeepWarmPolicy], last_request: Mapping[str, float],
               last_ping: Mapping[str, float], now: float) -> list[str]:
    """Models whose interval has passed and that have been idle long enough."""
    due = []
    for model, policy in policies.items():
        idle_for = now - last_request.get(model, float("-inf"))
        since_ping = now - last_ping.get(model, float("-inf"))
        if idle_for >= policy.idle_after_s and since_ping >= policy.interval_s:
            due.append(model)
    return sorted(due)


@dataclass
class KeepWarm:
    core: Core
    admin: MemberAdmin
    policies: PolicySource
    tick_s: float = 0.5
    last_ping: dict[str, float] = field(default_factory=dict)
    configs: dict[str, mc.ModelConfig] = field(default_factory=dict)
    pings: int = 0  # synthetic requests sent (for tests and logs)

    def forget(self, model: str) -> None:
        """A new version is serving: its config (inputs) may differ."""
        self.configs.pop(model, None)

    async def run_forever(self) -> None:
        while True:
            intervals: list[float] = []
            try:
                intervals = [p.interval_s for p in self.policies().values()]
                await self.tick()
            except Exception:  # noqa: BLE001 - the loop must outlive one bad round
                log.exception("keep-warm round failed")
            # look twice per shortest interval, so a policy of 0.2 s is kept
            await asyncio.sleep(max(0.02, min([self.tick_s, *intervals]) / 2))

    async def tick(self) -> None:
        policies = {m: p for m, p in self.policies().items()
                    if self.core.state.not_ready_reason(m) is None}
        now = self.core.clock()
        last_request = self.core.state.last_used()
        due = due_models(policies, last_request, self.last_ping, now)
        for model in due:
            self.last_ping[model] = now
        await asyncio.gather(*(self.ping(model, policies[model]) for model in due))

    async def ping(self, model: str, policy: KeepWarmPolicy) -> None:
        try:
            members = self.core.state.members_of(model)
            if not members:
                return
            config = self.configs.get(model)
            if config is None:
                config = self.configs[model] = await self.admin.config(members[0], model)
        except GatewayError as exc:
            log.warning("keep-warm %s: %s", model, exc.message)
            return
        await asyncio.gather(*(self._ping_member(model, config, policy, m) for m in members))

    async def _ping_member(self, model: str, config: mc.ModelConfig, policy: KeepWarmPolicy,
                           member: PoolMember) -> None:
        limit = max(1, config.max_batch_size)
        for batch in (b for b in policy.batch_sizes if b <= limit):
            body, headers = synthetic_request(config, batch)

            async def call(m: PoolMember, body: bytes = body,
                           headers: dict[str, str] = headers) -> tuple[int, bytes]:
                return await self.admin.infer(m, model, None, body, headers)

            try:
                status, answer = await self.core.telemetry.synthetic(
                    model, member, call, protocol="http", traffic="warmup",
                    outcome=lambda r: "success" if r[0] == 200 else "upstream_error",
                )
            except GatewayError as exc:
                log.warning("keep-warm %s on %s: %s", model, member.key, exc.message)
                return
            self.pings += 1
            if status != 200:
                log.warning("keep-warm %s on %s answered %d: %s", model, member.key, status,
                            answer[:200].decode(errors="replace"))
                self.forget(model)
                return
