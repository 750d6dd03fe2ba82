"""Pools of Triton servers: what the gateway routes over.

A pool is a set of equivalent Triton servers (members) serving the same models. Pool
declarations are data (YAML, validated with pydantic); :class:`PoolMember` carries the
live state the router reads (in-flight count, scraped queue depth, health).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gateway.lifecycle.config import AuthSpec, KeepWarmPolicy, LifecycleSpec


class MemberSpec(BaseModel):
    """One Triton server: host plus its HTTP, gRPC and metrics ports."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    http_port: int = Field(8000, ge=1, le=65535)
    grpc_port: int = Field(8001, ge=1, le=65535)
    metrics_port: int = Field(8002, ge=1, le=65535)

    @property
    def key(self) -> str:
        return f"{self.host}:{self.grpc_port}"


class PoolSpec(BaseModel):
    """A pool as declared in pools.yaml."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
    members: tuple[MemberSpec, ...] = ()
    # DNS name of a Kubernetes headless Service; every address it resolves to becomes a
    # member with the ports of ``dns_ports`` (re-resolved by the probe loop).
    dns: str | None = None
    dns_ports: MemberSpec = MemberSpec()
    models: tuple[str, ...] = ("*",)
    # model -> routing weight in this pool (canary); absent models weigh 1.0
    weights: dict[str, float] = Field(default_factory=dict)
    # requests the pool can have in flight per member before it is saturated
    capacity_per_member: int = Field(8, ge=1)

    @field_validator("weights")
    @classmethod
    def _weights_non_negative(cls, value: dict[str, float]) -> dict[str, float]:
        bad = {k: v for k, v in value.items() if v < 0}
        if bad:
            raise ValueError(f"weights must be >= 0: {bad}")
        return value

    @model_validator(mode="after")
    def _has_members(self) -> PoolSpec:
        if not self.members and not self.dns:
            raise ValueError(f"pool {self.name!r} needs 'members' or 'dns'")
        return self

    def serves(self, model: str) -> bool:
        return "*" in self.models or model in self.models

    def weight(self, model: str) -> float:
        return self.weights.get(model, 1.0)


class ModelPolicy(BaseModel):
    """Per-model admission limits and latency SLO (absent fields derive from capacity)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_concurrency: int | None = Field(None, ge=1)
    max_queue: int | None = Field(None, ge=0)
    latency_slo_ms: float | None = Field(None, gt=0)
    # loaded into its pools at start-up, before the gateway reports ready
    preload: bool = False
    keep_warm: KeepWarmPolicy | None = None


class RateLimitSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    rate_per_s: float = Field(gt=0)
    burst: float = Field(ge=1)


class RateLimits(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    default: RateLimitSpec | None = None
    keys: dict[str, RateLimitSpec] = Field(default_factory=dict)


class GatewayConfig(BaseModel):
    """The gateway's YAML file: pools, optional model policies and rate limits."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pools: tuple[PoolSpec, ...]
    models: dict[str, ModelPolicy] = Field(default_factory=dict)
    rate_limits: RateLimits = Field(default_factory=RateLimits)
    # requests beyond the concurrency a model may have in the gateway (they wait in
    # Triton), per unit of concurrency, when a model policy does not say
    queue_factor: float = Field(2.0, ge=0)
    # model lifecycle (uploads, versions, rollback); absent = no /v1/models uploads
    lifecycle: LifecycleSpec | None = None
    auth: AuthSpec = Field(default_factory=AuthSpec)

    @field_validator("pools")
    @classmethod
    def _unique_names(cls, pools: tuple[PoolSpec, ...]) -> tuple[PoolSpec, ...]:
        names = [p.name for p in pools]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate pool names: {duplicates}")
        return pools


def load_gateway_config(path: Path) -> GatewayConfig:
    """Parse the YAML file; relative paths in it are relative to the file's folder."""
    data = yaml.safe_load(path.read_text()) or {}
    config = GatewayConfig.model_validate(data)
    base = path.resolve().parent
    if config.lifecycle is not None:
        config = config.model_copy(update={"lifecycle": config.lifecycle.model_copy(update={
            "repository": base / config.lifecycle.repository,
            "state_dir": base / config.lifecycle.state_dir,
        })})
    if config.auth.tokens_file is not None:
        config = config.model_copy(update={"auth": config.auth.model_copy(update={
            "tokens_file": base / config.auth.tokens_file,
        })})
    return config


@dataclass(eq=False)
class PoolMember:
    """Live state of one member, owned by the data plane's event loop."""

    pool: str
    spec: MemberSpec
    in_flight: int = 0
    # requests HAProxy has at this member right now (the native data plane's count)
    external_in_flight: int = 0
    upstream_queue: int = 0  # nv_inference_pending_request_count summed over models
    queue_scraped_at: float = float("-inf")
    healthy: bool = True
    ejected_until: float = 0.0
    consecutive_failures: int = 0
    # back from the dead, its models being reloaded: healthy but not routable yet
    restoring: bool = False
    # what its server metadata (GET /v2) said at the last healthy probe: None when that
    # call failed; ``version_probed`` turns True at the first read, failed or not
    triton_version: str | None = None
    version_probed: bool = False
    failed_probes: int = 0  # health probes failed in a row (probes.py, HEALTH_FALL)

    @property
    def key(self) -> str:
        return self.spec.key

    def available(self, now: float) -> bool:
        return self.healthy and not self.restoring and now >= self.ejected_until


@dataclass
class Pool:
    spec: PoolSpec
    members: list[PoolMember] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def capacity(self) -> int:
        return self.spec.capacity_per_member * max(1, len(self.members))


def build_pools(specs: Iterable[PoolSpec]) -> list[Pool]:
    pools = []
    for spec in specs:
        pools.append(Pool(spec, [PoolMember(spec.name, m) for m in spec.members]))
    return pools


def pools_for_model(pools: Sequence[Pool], model: str) -> list[Pool]:
    return [p for p in pools if p.spec.serves(model) and p.spec.weight(model) > 0]
