"""The gateway's whole configuration, as frozen data (pydantic): the YAML file
(``--pools``) and the documents changed live (``PUT /v1/tenants``, settings).

- :mod:`.pools`: pools and members as declared;
- :mod:`.access`: API tokens and rate limits;
- :mod:`.tenancy`: tenants and priority classes;
- :mod:`.lifecycle`: uploads, conversions, keep-warm;
- :mod:`.rollout`: progressive delivery;
- :mod:`.residency`: members holding only some models, within a memory budget;
- here: model policies and the file itself (:func:`load_gateway_config`).

Nothing here decides anything (that is :mod:`gateway.policy`, pure functions over this
data and a clock) or changes at run time (that is :mod:`gateway.state` and the members'
live state in :mod:`gateway.pools`). Built once, in ``main()``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from gateway.config.access import AuthSpec, RateLimitSpec
from gateway.config.lifecycle import KeepWarmPolicy, LifecycleSpec
from gateway.config.pools import PoolSpec
from gateway.config.rollout import Rollout, parse_rollout
from gateway.config.tenancy import TenancySpec


class ModelPolicy(BaseModel):
    """Per-model admission limits and latency SLO (absent fields derive from capacity)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_concurrency: int | None = Field(None, ge=1)
    max_queue: int | None = Field(None, ge=0)
    latency_slo_ms: float | None = Field(None, gt=0)
    # loaded into its pools at start-up, before the gateway reports ready
    preload: bool = False
    keep_warm: KeepWarmPolicy | None = None
    # how a new uploaded version goes live: a progressive rollout, or "none" (at once)
    rollout: Annotated[Rollout, BeforeValidator(parse_rollout)] = None
    # in a pool with residency: loaded only where and when its use asks for it
    # (min_replicas 0 unless set); else it is pinned on every member
    on_demand: bool = False
    min_replicas: int | None = Field(None, ge=0)
    # bytes it takes once loaded, when larger than what the converter measured
    footprint_bytes: int | None = Field(None, ge=1)


class RateLimits(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    default: RateLimitSpec | None = None
    keys: dict[str, RateLimitSpec] = Field(default_factory=dict)


class GatewayConfig(BaseModel):
    """The gateway's YAML file: pools, optional model policies and rate limits, the
    members' model repository."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pools: tuple[PoolSpec, ...]
    models: dict[str, ModelPolicy] = Field(default_factory=dict)
    rate_limits: RateLimits = Field(default_factory=RateLimits)
    # requests beyond the concurrency a model may have in the gateway (they wait in
    # Triton), per unit of concurrency, when a model policy does not say
    queue_factor: float = Field(2.0, ge=0)
    # model lifecycle (uploads, versions, rollback); absent = no /v1/models uploads
    lifecycle: LifecycleSpec | None = None
    # the Triton model repository the pools' members load from, as this process sees it
    # (relative to the file's folder), when no lifecycle section names it: the residency
    # reads each model's footprint from the converter's report there before its first
    # load. With a lifecycle, its repository is used.
    model_repository: Path | None = None
    auth: AuthSpec = Field(default_factory=AuthSpec)
    # tenants and priority classes (gateway/policy/tenancy.py); absent: admission per
    # model only, as before tenants existed
    tenancy: TenancySpec | None = None

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
    if config.model_repository is not None:
        config = config.model_copy(update={"model_repository": base / config.model_repository})
    if any(p.residency and p.residency.demand_file for p in config.pools):
        config = config.model_copy(update={"pools": tuple(
            p if not (p.residency and p.residency.demand_file) else p.model_copy(update={
                "residency": p.residency.model_copy(update={
                    "demand_file": base / p.residency.demand_file})})
            for p in config.pools)})
    if config.auth.tokens_file is not None:
        config = config.model_copy(update={"auth": config.auth.model_copy(update={
            "tokens_file": base / config.auth.tokens_file,
        })})
    return config
