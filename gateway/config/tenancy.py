"""Tenants and priority classes as configured (``tenancy:``, ``--tenants``, ``PUT
/v1/tenants``): validated whole, a malformed document refused with every bad field
named. The rule they feed is :mod:`gateway.policy.tenancy`."""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gateway.config.access import RateLimitSpec
from gateway.policy.access import configured_digest

DEFAULT_TENANT = "default"
# a refusal of the tenancy rules is answered this long after it is decided
# (gateway.policy.tenancy.refusal_delay_ms; 0: at once). At most the Retry-After (1 s):
# a client that honours it never waits for the delay
DEFAULT_REFUSAL_DELAY_MS, MAX_REFUSAL_DELAY_MS = 50, 1000
# a tenant's refusals answered a second, at most, however many it keeps waiting for their
# answers: each waits at least its share of a second (gateway.policy.tenancy.refusal_delay_ms)
DEFAULT_REFUSALS_PER_S, MAX_REFUSALS_PER_S = 100, 100_000
# tenants are HAProxy map keys and stick-table keys ("t:<name>", at most 64 bytes)
NAME_PATTERN = r"^[a-z0-9]([a-z0-9_-]{0,46}[a-z0-9])?$"


class Priority(StrEnum):
    """Refused in this order as a pool fills: sheddable, then standard, then critical."""

    CRITICAL = "critical"
    STANDARD = "standard"
    SHEDDABLE = "sheddable"


class TenantLimits(BaseModel):
    """What a tenant (or the default one) gets: its class, weight and limits."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    priority: Priority = Priority.STANDARD
    weight: float = Field(1.0, gt=0, le=1000)
    max_in_flight: int | None = Field(None, ge=1)
    rate: RateLimitSpec | None = None


class DefaultTenantSpec(TenantLimits):
    """Requests without a key, or with a key no tenant names."""


class TenantSpec(TenantLimits):
    name: str = Field(pattern=NAME_PATTERN)
    # plain keys or sha256:<64 hex digits> (a file need not hold the key)
    keys: tuple[str, ...] = ()

    @field_validator("keys")
    @classmethod
    def _keys_well_formed(cls, keys: tuple[str, ...]) -> tuple[str, ...]:
        for key in keys:
            if not key:
                raise ValueError("an empty key is no key (requests without one are the "
                                 "default tenant's)")
            configured_digest(key)  # ValueError names the malformed one
        return keys


class RefuseAt(BaseModel):
    """Class ceilings as multiples of a pool's capacity (None: from queue_factor; for
    sheddable, 1 in a pool that queues in Triton and 1 + queue_factor / 4 in one that
    queues in the gateway: :meth:`gateway.policy.tenancy.Tenancy.from_spec`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sheddable: float | None = Field(None, gt=0)
    standard: float | None = Field(None, gt=0)
    critical: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> RefuseAt:
        given = [(p, v) for p, v in (("sheddable", self.sheddable), ("standard", self.standard),
                                     ("critical", self.critical)) if v is not None]
        for (low, a), (high, b) in zip(given, given[1:], strict=False):
            if a > b:
                raise ValueError(f"refuse_at.{low} ({a}) is above refuse_at.{high} ({b}): "
                                 "sheddable is refused first, critical last")
        return self


class TenancySpec(BaseModel):
    """The ``tenancy:`` section (and the document ``--tenants`` / ``PUT /v1/tenants``
    take). A malformed one is refused whole."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    default: DefaultTenantSpec = Field(default_factory=DefaultTenantSpec)
    tenants: tuple[TenantSpec, ...] = ()
    refuse_at: RefuseAt = Field(default_factory=RefuseAt)
    refusal_delay_ms: int = Field(DEFAULT_REFUSAL_DELAY_MS, ge=0, le=MAX_REFUSAL_DELAY_MS)
    refusals_per_s: int = Field(DEFAULT_REFUSALS_PER_S, ge=1, le=MAX_REFUSALS_PER_S)
    # a request's class as its Triton priority level at a model with levels, in place of
    # the client's own (gateway/policy/triton_priority.py); false: the client's, if any
    triton_levels: bool = True

    @model_validator(mode="after")
    def _consistent(self) -> TenancySpec:
        names = [t.name for t in self.tenants]
        if DEFAULT_TENANT in names:
            raise ValueError(f"tenants: '{DEFAULT_TENANT}' is the tenant of requests no "
                             "tenant's key names; configure it under 'default'")
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"tenants: names declared twice: {twice}")
        owner: dict[str, str] = {}
        for tenant in self.tenants:
            for key in tenant.keys:
                digest = configured_digest(key)
                if digest in owner:
                    raise ValueError(f"tenants.{tenant.name}.keys: a key is named twice "
                                     f"(also by tenant '{owner[digest]}')")
                owner[digest] = tenant.name
        return self


def parse_tenancy(data: object, source: str = "tenancy") -> TenancySpec:
    """Validate a tenancy document whole; ValueError naming each bad field (a tenant by
    its name where it has one), nothing applied."""
    try:
        return TenancySpec.model_validate(data)
    except ValidationError as exc:
        raise ValueError(f"{source}: " + "; ".join(
            f"{_field(data, err['loc'])}: {err['msg'].removeprefix('Value error, ')}"
            for err in exc.errors())) from None


def _field(data: object, loc: tuple[int | str, ...]) -> str:
    parts = [str(p) for p in loc]
    if len(loc) >= 2 and loc[0] == "tenants" and isinstance(loc[1], int) \
            and isinstance(data, dict) and isinstance(data.get("tenants"), list):
        entry = data["tenants"][loc[1]] if loc[1] < len(data["tenants"]) else None
        name = entry.get("name") if isinstance(entry, dict) else None
        if isinstance(name, str) and re.fullmatch(NAME_PATTERN, name):
            parts[1] = name
    return ".".join(parts) or "tenancy"


def load_tenancy_file(path: Path) -> TenancySpec:
    """A YAML (or JSON) tenancy document from a file (``--tenants``); ValueError naming
    the file and the field."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    if isinstance(data, dict) and set(data) == {"tenancy"}:  # a gateway file's section
        data = data["tenancy"]
    return parse_tenancy(data or {}, str(path))
