"""Who may call what, and how often: API tokens (``auth:``) and rate limits as
configuration writes them (``rate_limits:``, a tenant's ``rate``). The decisions are
:mod:`gateway.auth` and :mod:`gateway.policy.rate`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class RateLimitSpec(BaseModel):
    """A limit as configuration writes it (``rate_limits``, a tenant's ``rate``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rate_per_s: float = Field(gt=0)
    burst: float = Field(ge=1)


class AuthSpec(BaseModel):
    """API tokens. Without tokens (no file, no environment) the gateway is open."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tokens_file: Path | None = None
    # "open": inference needs no token; "token": a token with the predict scope.
    predict: Literal["open", "token"] = "open"
