"""Control plane toward the pools: repository calls routed to the pools that own a
model, and the dynamic-batching policy applied through Triton's load API.

Loads and unloads go to *every* member of every pool serving the model (a model must be
loaded wherever traffic for it can be routed); the index merges one member per pool.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from gateway.control.batching import BatchingDecision, batch_latency_from_stats, derive_batching
from gateway.core import Core
from gateway.errors import InvalidInput, Unavailable
from gateway.policy.upstream import RETRIES
from gateway.pools import PoolMember
from gateway.upstream.triton import MemberAdmin, synthetic_request

T = TypeVar("T")


class ModelControl:
    def __init__(self, core: Core, admin: MemberAdmin) -> None:
        self.core = core
        self.admin = admin

    # -- generic routing ---------------------------------------------------------------
    def owners(self, model: str) -> list[PoolMember]:
        members = self.core.state.members_of(model, available=False)
        if not members:
            raise Unavailable(f"no member serves '{model}'")
        return members

    def index_members(self) -> list[PoolMember]:
        """One available member per pool."""
        now = self.core.clock()
        chosen = []
        for pool in self.core.state.pools:
            alive = [m for m in pool.members if m.available(now)]
            if alive:
                chosen.append(alive[0])
        if not chosen:
            raise Unavailable("no healthy Triton member")
        return chosen

    async def ask(self, model: str, call: Callable[[PoolMember], Awaitable[T]]) -> T:
        """A call about ``model`` (metadata, readiness, config, statistics) on one
        available member serving it, the least busy; on the next when that one cannot
        be reached (no inference: neither admitted nor counted). A model of a pool with
        residency that no member holds is loaded first, as for a request that missed it
        (a client asks for metadata right before it infers)."""
        state, held_by = self.core.state, None
        if state.managed(model):
            held_by = await state.wait_resident(model, None)
        members = sorted(state.members_of(model) or state.available_among(model, held_by or ()),
                         key=lambda m: m.in_flight + m.external_in_flight)
        if not members:
            raise Unavailable(f"no healthy Triton member serves model '{model}'")
        tried = []
        for member in members[:1 + RETRIES]:
            try:
                return await call(member)
            except Unavailable:
                tried.append(member.key)
        raise Unavailable(f"all members serving '{model}' failed ({', '.join(tried)})")

    async def broadcast(self, model: str, call: Callable[[PoolMember], Awaitable[T]]) -> list[T]:
        """Run ``call`` on every member owning ``model``; the first failure is raised
        after all calls finish (no member is left half-way because another failed)."""
        results = await asyncio.gather(*(call(m) for m in self.owners(model)),
                                       return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return results  # type: ignore[return-value]

    async def index(self, call: Callable[[PoolMember], Awaitable[T]]) -> list[T]:
        return list(await asyncio.gather(*(call(m) for m in self.index_members())))

    # -- dynamic batching ---------------------------------------------------------------
    async def apply_batching(self, model: str, latency_slo_ms: float,
                             probe_batches: bool = True) -> BatchingDecision:
        """Measure per-batch latency on one member, derive settings, reload everywhere."""
        member = self.owners(model)[0]
        config = await self.admin.get_json(member, f"/v2/models/{model}/config")
        max_batch = int(config.get("max_batch_size", 0))
        if max_batch <= 0:
            raise InvalidInput(f"model '{model}' does not batch (max_batch_size 0)")
        if probe_batches:
            await self._probe_batches(member, model, config, max_batch)
        stats = await self.admin.get_json(member, f"/v2/models/{model}/stats")
        model_stats: dict[str, Any] = next(iter(stats.get("model_stats", [])), {})
        latency = batch_latency_from_stats(model_stats)
        if not latency:
            raise Unavailable(f"no batch statistics for '{model}' yet: send traffic first")
        decision = derive_batching(latency_slo_ms, latency, max_batch)
        config["dynamic_batching"] = {**config.get("dynamic_batching", {}),
                                      **decision.as_config()}

        async def load(m: PoolMember) -> None:  # over gRPC: HTTP inference never waits on it
            await self.admin.load(m, model, config)
            # its priority levels now, not at the probes' next reading of its config
            m.read_levels(model, decision.priority_levels, self.core.clock())

        await self.broadcast(model, load)
        return decision

    async def _probe_batches(self, member: PoolMember, model: str, config: dict[str, Any],
                             max_batch: int) -> None:
        """A few synthetic requests per power-of-two batch size, so Triton's batch
        statistics cover the range the policy interpolates over."""
        sizes = [b for b in (1, 2, 4, 8, 16, 32, 64, 128) if b <= max_batch]
        parsed = json_format.ParseDict(config, mc.ModelConfig(), ignore_unknown_fields=True)
        for batch in sizes:
            body, headers = synthetic_request(parsed, batch)
            for _ in range(3):
                await self.admin.post_ok(member, f"/v2/models/{model}/infer", body, headers)
