"""A progressive rollout as configured (``rollout:`` in an upload's spec or a model's
policy). The split and the verdicts are :mod:`gateway.policy.rollout`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

DEFAULT_STEPS = (5, 25, 50, 100)
SHADOW_MIN_REQUESTS = 50  # the shadow step's default: min(this, the policy's min_requests)


class ShadowSpec(BaseModel):
    """``shadow:`` in a rollout: the step before the first real one, in which a sample
    of the model's live unversioned requests is also sent to the candidate (the user
    gets stable's answer) and the two answers are compared. ``seconds`` and
    ``min_requests`` left out follow the rollout's ``step_seconds`` and
    ``min(50, min_requests)``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    percent: int = Field(20, ge=1, le=100)  # of the model's unversioned requests, mirrored
    seconds: float | None = Field(None, gt=0, le=86400)
    min_requests: int | None = Field(None, ge=0)  # mirrored answers its verdict needs
    max_in_flight: int = Field(8, ge=1, le=1024)  # mirrors at once; beyond: not mirrored


class RolloutSpec(BaseModel):
    """``rollout:`` in an upload's spec or a model's configuration (docs/lifecycle.md, "Progressive
    delivery"). ``"none"`` instead of the mapping keeps the all-at-once switch."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    steps: tuple[int, ...] = DEFAULT_STEPS  # the candidate's percent of unversioned traffic
    step_seconds: float = Field(60.0, gt=0, le=86400)
    min_requests: int = Field(200, ge=0)  # candidate answers a verdict needs
    max_error_rate_delta: float = Field(0.01, ge=0, le=1)
    max_p99_ratio: float = Field(1.3, ge=1)
    # a p99 worse by less than this is timer noise (HAProxy logs milliseconds)
    p99_tolerance_ms: float = Field(5.0, ge=0)
    min_agreement: float = Field(0.99, ge=0, le=1)
    agreement_samples: int = Field(32, ge=0, le=256)  # 0: no replay, no agreement check
    # the shadow step (on by default); "none" or false: straight to the first step
    shadow: ShadowSpec | None = ShadowSpec()

    @field_validator("shadow", mode="before")
    @classmethod
    def _shadow(cls, value: Any) -> Any:
        if value is None or value is False or value == "none":
            return None
        if value is True:
            return ShadowSpec()
        if isinstance(value, dict | ShadowSpec):
            return value
        raise ValueError("expected 'none', false, true or a mapping (percent, seconds, "
                         "min_requests, max_in_flight)")

    @property
    def shadow_seconds(self) -> float:
        return (self.shadow.seconds if self.shadow and self.shadow.seconds is not None
                else self.step_seconds)

    @property
    def shadow_min_requests(self) -> int:
        if self.shadow is not None and self.shadow.min_requests is not None:
            return self.shadow.min_requests
        return min(SHADOW_MIN_REQUESTS, self.min_requests)

    @field_validator("steps")
    @classmethod
    def _increasing(cls, steps: tuple[int, ...]) -> tuple[int, ...]:
        if not steps:
            raise ValueError("at least one step (a percent of traffic, 1..100)")
        for i, step in enumerate(steps):
            if not 1 <= step <= 100:
                raise ValueError(f"step {i} is {step}: each step is a percent, 1..100")
            if i and step <= steps[i - 1]:
                raise ValueError(f"steps must increase: step {i} ({step}) is not above "
                                 f"step {i - 1} ({steps[i - 1]})")
        return steps


Rollout = RolloutSpec | Literal["none"] | None  # None: the model's configured default


def parse_rollout(value: Any) -> RolloutSpec | Literal["none"] | None:
    """``"none"``, a mapping of :class:`RolloutSpec` fields, or None; ValueError naming
    the field otherwise."""
    if value is None or isinstance(value, RolloutSpec):
        return value
    if value == "none":
        return "none"
    if not isinstance(value, dict):
        raise ValueError("expected 'none' or a mapping (steps, step_seconds, min_requests, "
                         "max_error_rate_delta, max_p99_ratio, min_agreement, shadow, ...)")
    try:
        return RolloutSpec.model_validate(value)
    except ValidationError as exc:
        raise ValueError("; ".join(
            f"{'.'.join(str(p) for p in err['loc'] if not isinstance(p, int)) or 'rollout'}: "
            f"{err['msg'].removeprefix('Value error, ')}" for err in exc.errors()
        )) from None
