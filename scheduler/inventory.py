"""The fleet inventory as validated input: nodes, their GPUs and current MIG layouts.

Structure and per-field rules are pydantic's; rules that need a GPU's type (is profile
``3g.40gb`` known on this GPU? is slot 3 a start slot of profile 9?) are checked by
:func:`scheduler.request.check_request`, which reports the exact field at fault.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from scheduler.profiles import MEMORY_SLOTS, gpu_type

_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_DRIVER = re.compile(r"^(\d+)(\.\d+)*$")


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Taint(Frozen):
    key: str = Field(min_length=1)
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]

    @property
    def hard(self) -> bool:
        """Whether the taint keeps untolerating pods off the node (PreferNoSchedule does not)."""
        return self.effect != "PreferNoSchedule"


class Toleration(Frozen):
    key: str | None = None
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None

    def tolerates(self, taint: Taint) -> bool:
        """Kubernetes' matching rule: empty key with Exists tolerates everything."""
        if self.effect is not None and self.effect != taint.effect:
            return False
        if self.key is None:
            return self.operator == "Exists"
        if self.key != taint.key:
            return False
        return self.operator == "Exists" or self.value == taint.value


class MigInstanceSpec(Frozen):
    """An existing GPU instance: profile (id or name label), start slot, pool using it."""

    profile: int | str
    start: int = Field(ge=0, lt=MEMORY_SLOTS)
    pool: str | None = None


class MigState(Frozen):
    enabled: bool = True
    instances: tuple[MigInstanceSpec, ...] = ()


class GpuSpec(Frozen):
    index: int = Field(ge=0)
    type: str
    mig: MigState | None = None
    pool: str | None = Field(
        default=None, description="Pool using the whole device (non-MIG GPUs only)."
    )

    @field_validator("type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        try:
            return gpu_type(value).name
        except KeyError as e:
            raise ValueError(str(e.args[0])) from e


class NodeSpec(Frozen):
    name: str
    labels: dict[str, str] = Field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    driver_version: str | None = Field(
        default=None, description="NVIDIA driver, e.g. 550.54.15; None assumes R510 or newer."
    )
    gpus: tuple[GpuSpec, ...] = ()

    @field_validator("name")
    @classmethod
    def _dns_name(cls, value: str) -> str:
        if not _NODE_NAME.match(value):
            raise ValueError("node name must be a lower-case DNS subdomain")
        return value

    @field_validator("driver_version")
    @classmethod
    def _driver(cls, value: str | None) -> str | None:
        if value is not None and not _DRIVER.match(value):
            raise ValueError("driver_version must look like 550.54.15")
        return value

    @property
    def allows_4g_with_3g(self) -> bool:
        """4g (slot 0) beside 3g (slot 4) needs driver R510 or newer (mig.md)."""
        return self.driver_version is None or int(self.driver_version.split(".")[0]) >= 510


class Fleet(Frozen):
    nodes: tuple[NodeSpec, ...] = Field(min_length=1)

    @property
    def gpu_count(self) -> int:
        return sum(len(n.gpus) for n in self.nodes)
