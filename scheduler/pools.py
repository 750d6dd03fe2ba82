"""Pools as validated input: one Triton model served by N identical replicas (or, with
``working_set``, many models that the gateway's residency places by demand).

A pool states what it needs (memory, target load, latency SLO, replica bounds, priority,
placement constraints) and what one replica can serve on each profile it may run on.
Throughput per profile can be given directly (requests/s at the SLO) or as a batching
latency model, from which the sustainable rate at the SLO is derived as in Nexus.
"""

from __future__ import annotations

import math
import re

from pydantic import Field, field_validator, model_validator

from scheduler.inventory import Frozen, Toleration
from scheduler.profiles import gpu_type
from scheduler.working_set import WorkingSet, floor_gib, working_set_gib

_POOL_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")
_PRIORITY_CLASS = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


class LatencyModel(Frozen):
    """Batch latency ``base_ms + per_item_ms * batch`` on one profile."""

    base_ms: float = Field(gt=0)
    per_item_ms: float = Field(ge=0)
    max_batch: int = Field(default=64, ge=1)

    def batch_latency_ms(self, batch: int) -> float:
        return self.base_ms + self.per_item_ms * batch

    def throughput_at_slo(self, slo_ms: float) -> float:
        """Requests/s of the largest batch whose worst case meets the SLO.

        A request may arrive just after a batch started, so it waits for that batch and
        then runs in the next one: worst-case latency is twice the batch latency
        (Nexus' rule). Zero when even batch 1 misses the SLO.
        """
        if self.per_item_ms == 0:
            batch = self.max_batch if 2 * self.base_ms <= slo_ms else 0
        else:
            batch = min(self.max_batch, math.floor((slo_ms / 2 - self.base_ms) / self.per_item_ms))
        if batch < 1:
            return 0.0
        return batch * 1000.0 / self.batch_latency_ms(batch)


class CapacityEntry(Frozen):
    """What one replica serves on a profile (id or name), optionally for one GPU type.

    Omit ``profile`` for whole non-MIG devices (then ``gpu_type`` is required).
    """

    gpu_type: str | None = None
    profile: int | str | None = None
    rps: float | None = Field(default=None, gt=0)
    latency: LatencyModel | None = None

    @field_validator("gpu_type")
    @classmethod
    def _known_type(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            return gpu_type(value).name
        except KeyError as e:
            raise ValueError(str(e.args[0])) from e

    @model_validator(mode="after")
    def _one_figure(self) -> CapacityEntry:
        if (self.rps is None) == (self.latency is None):
            raise ValueError("give exactly one of rps or latency")
        if self.profile is None and self.gpu_type is None:
            raise ValueError("give a profile, or a gpu_type for a whole device")
        return self

    def replica_rps(self, slo_ms: float) -> float:
        if self.rps is not None:
            return self.rps
        assert self.latency is not None
        return self.latency.throughput_at_slo(slo_ms)


class PoolConstraints(Frozen):
    gpu_types: tuple[str, ...] = ()
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    max_replicas_per_gpu: int | None = Field(default=None, ge=1)
    max_replicas_per_node: int | None = Field(default=None, ge=1)

    @field_validator("gpu_types")
    @classmethod
    def _known_types(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        names = []
        for name in value:
            try:
                names.append(gpu_type(name).name)
            except KeyError as e:
                raise ValueError(str(e.args[0])) from e
        return tuple(names)


class PoolSpec(Frozen):
    name: str
    model: str = Field(min_length=1)
    memory_gib: float | None = Field(
        default=None, gt=0, description="Memory one replica needs on the device (every "
        "model it serves loaded). Omit it with working_set.")
    target_rps: float = Field(ge=0)
    slo_ms: float = Field(default=100.0, gt=0, description="Latency SLO (p99) in ms.")
    min_replicas: int = Field(default=1, ge=0)
    max_replicas: int = Field(default=16, ge=1)
    priority: int = Field(default=0, ge=-(10**9), le=10**9)
    priority_class: str | None = None
    constraints: PoolConstraints = PoolConstraints()
    capacity: tuple[CapacityEntry, ...] = Field(min_length=1)
    working_set: WorkingSet | None = Field(
        default=None, description="Many models under the gateway's residency: a replica "
        "needs the memory of what it holds at the measured demand (scheduler.working_set).")

    @field_validator("name")
    @classmethod
    def _dns_label(cls, value: str) -> str:
        if not _POOL_NAME.match(value):
            raise ValueError(
                "pool name must be a DNS-1035 label of at most 40 characters "
                "(lower-case letters, digits, '-'; starts with a letter)"
            )
        return value

    @field_validator("priority_class")
    @classmethod
    def _class_name(cls, value: str | None) -> str | None:
        if value is not None and not _PRIORITY_CLASS.match(value):
            raise ValueError("priority_class must be a lower-case DNS subdomain")
        return value

    @model_validator(mode="after")
    def _replica_bounds(self) -> PoolSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas {self.min_replicas} > max_replicas {self.max_replicas}")
        return self

    @model_validator(mode="after")
    def _memory(self) -> PoolSpec:
        if (self.memory_gib is None) == (self.working_set is None):
            raise ValueError("give exactly one of memory_gib (every model on every replica) "
                             "or working_set (models resident by demand)")
        return self

    def memory_need_gib(self, replicas: int) -> float:
        """Memory one of ``replicas`` replicas needs: ``memory_gib``, or the largest
        working set a replica holds when the pool has that many."""
        if self.memory_gib is not None:
            return self.memory_gib
        assert self.working_set is not None
        return working_set_gib(self.working_set, replicas)

    def memory_floor_gib(self) -> float:
        """Memory any replica needs, whatever the replica count: ``memory_gib``, or what a
        working set cannot do without (:func:`scheduler.working_set.floor_gib`)."""
        if self.memory_gib is not None:
            return self.memory_gib
        assert self.working_set is not None
        return floor_gib(self.working_set)

    @property
    def priority_class_name(self) -> str:
        if self.priority_class:
            return self.priority_class
        sign = "m" if self.priority < 0 else ""
        return f"infergate-priority-{sign}{abs(self.priority)}"
