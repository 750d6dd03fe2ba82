"""Pools of Triton servers as declared: members by address or by DNS name, the models
a pool serves, their routing weights and the pool's capacity. Their live state is
:class:`gateway.pools.PoolMember` / :class:`gateway.pools.Pool`."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gateway.config.residency import ResidencySpec
from gateway.netaddr import bare_host, join_host_port


class MemberSpec(BaseModel):
    """One Triton server: host plus its HTTP, gRPC and metrics ports."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = "127.0.0.1"  # a name or an IP address; an IPv6 one kept bare (no brackets)
    http_port: int = Field(8000, ge=1, le=65535)
    grpc_port: int = Field(8001, ge=1, le=65535)
    metrics_port: int = Field(8002, ge=1, le=65535)

    @field_validator("host")
    @classmethod
    def _bare_host(cls, value: str) -> str:
        return bare_host(value)

    @property
    def http_address(self) -> str:
        return join_host_port(self.host, self.http_port)

    @property
    def grpc_address(self) -> str:
        return join_host_port(self.host, self.grpc_port)

    @property
    def metrics_address(self) -> str:
        return join_host_port(self.host, self.metrics_port)

    @property
    def key(self) -> str:
        return self.grpc_address


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
    # requests wait in the gateway, not in Triton: each member gets at most
    # capacity_per_member at once, the rest wait here by class and fairly within a class,
    # at most max_queue_wait_ms (gateway/policy/queueing.py)
    gateway_queue: bool = False
    max_queue_wait_ms: int = Field(10_000, ge=1, le=240_000)
    # with gateway_queue and tenants: slots per member beyond capacity_per_member for a
    # standard request of a light tenant (fewer than this many others of its own in the
    # gateway for this model and pool) that finds the others full: it joins the batch
    # Triton forms next instead of waiting for a slot (gateway/policy/queueing.py)
    lane_per_member: int = Field(2, ge=0, le=64)
    # each member holds only some of the models, within a memory budget
    # (gateway.config.residency); absent: every model on every member
    residency: ResidencySpec | None = None

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
