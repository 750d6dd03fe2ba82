"""Which models are preloaded and kept warm, and at which batch sizes: one answer
whether or not the gateway manages versions.

:class:`WarmupPlan` reads the configuration's model policies (``preload``,
``keep_warm``) and, with a lifecycle, its records (every model it serves is preloaded;
an upload's spec may ask for keep-warm; the configuration wins). A model is loaded by a
:class:`ModelLoader`: the lifecycle (its serving version, pinned) or, without one,
:class:`ConfiguredLoader` (as the repository's ``config.pbtxt`` says).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from gateway.config import GatewayConfig
from gateway.config.lifecycle import KeepWarmPolicy
from gateway.core import Core
from gateway.lifecycle.records.store import RecordStore
from gateway.lifecycle.warmup.deploy import load_as_configured, no_callback, restore_as_configured
from gateway.pools import PoolMember
from gateway.upstream.triton import MemberAdmin

POLICY_CACHE_S = 1.0  # the keep-warm loop asks several times a second


@dataclass
class WarmupPlan:
    config: GatewayConfig
    store: RecordStore | None = None  # None: no lifecycle, the configuration alone
    _policies: tuple[float, dict[str, KeepWarmPolicy]] = field(
        default=(float("-inf"), {}), init=False)

    def keep_warm_policies(self) -> dict[str, KeepWarmPolicy]:
        """Configuration first; else what the model's upload spec asked for (read from the
        store at most once per POLICY_CACHE_S)."""
        now = time.monotonic()
        if now - self._policies[0] < POLICY_CACHE_S:
            return self._policies[1]
        policies = {} if self.store is None else {
            r.name: KeepWarmPolicy.model_validate(r.keep_warm)
            for r in self.store.models() if r.keep_warm and r.serving_version}
        for model, policy in self.config.models.items():
            if policy.keep_warm is not None:
                policies[model] = policy.keep_warm
        self._policies = (now, policies)
        return policies

    def policies_changed(self) -> None:
        """A record's keep-warm policy changed: the next read goes to the store."""
        self._policies = (float("-inf"), {})

    def warm_batches(self, model: str) -> tuple[int, ...]:
        """The batch sizes a model is warmed at (its keep-warm policy's, else 1)."""
        policy = self.keep_warm_policies().get(model)
        return policy.batch_sizes if policy else (1,)

    def preload_models(self) -> list[str]:
        """Loaded at start-up, before readiness, and on a member that came back empty."""
        configured = {m for m, p in self.config.models.items() if p.preload}
        managed = set() if self.store is None else {
            r.name for r in self.store.models() if r.serving_version is not None}
        return sorted(configured | managed)


class ModelLoader(Protocol):
    async def preload_one(self, model: str) -> None:
        """Load and warm ``model`` on every member serving it."""

    async def restore_one(self, member: PoolMember, model: str,
                          loaded: Callable[[], None] = no_callback) -> None:
        """Load and warm ``model`` on one member that came back empty (``loaded``:
        called between Triton's load and the gateway's warm-up)."""


@dataclass
class ConfiguredLoader:
    """Without a lifecycle: a model is loaded as its ``config.pbtxt`` says."""

    core: Core
    admin: MemberAdmin
    plan: WarmupPlan

    async def preload_one(self, model: str) -> None:
        await load_as_configured(self.core, self.admin, model, self.plan.warm_batches(model))

    async def restore_one(self, member: PoolMember, model: str,
                          loaded: Callable[[], None] = no_callback) -> None:
        await restore_as_configured(self.core, self.admin, member, model,
                                    self.plan.warm_batches(model), loaded)
