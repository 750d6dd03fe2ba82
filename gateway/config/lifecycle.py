"""The model lifecycle as configured: where versions are written, how conversions run
and what they may use, upload bounds, and keep-warm (``lifecycle:`` and a model's
``keep_warm``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class KeepWarmPolicy(BaseModel):
    """Synthetic requests to every pool member once a model has been idle.

    Every ``interval_s`` the keep-warm loop looks at the model: when no user request
    arrived for ``idle_after_s``, one request per batch size in ``batch_sizes`` goes to
    each member serving it (labelled ``traffic="warmup"`` in metrics).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    interval_s: float = Field(10.0, gt=0)
    idle_after_s: float = Field(30.0, ge=0)
    batch_sizes: tuple[int, ...] = (1,)

    @field_validator("batch_sizes")
    @classmethod
    def _positive(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value or any(b < 1 for b in value):
            raise ValueError("batch_sizes must be a non-empty list of sizes >= 1")
        return tuple(sorted(set(value)))


class UploadLimits(BaseModel):
    """Bounds on what an upload may write to disk (checked while streaming)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_model_bytes: int = Field(2 << 30, ge=1)
    max_samples_bytes: int = Field(1 << 30, ge=1)  # each of calibration / evaluation
    max_spec_bytes: int = Field(64 << 10, ge=1)
    max_request_bytes: int = Field(4 << 30, ge=1)
    # archives of samples (.zip / .tar[.gz]): extracted size, member count, and the
    # expansion ratio that gives a zip bomb away
    max_extracted_bytes: int = Field(2 << 30, ge=1)
    max_archive_members: int = Field(100_000, ge=1)
    max_compression_ratio: float = Field(200.0, gt=1)


class SandboxSpec(BaseModel):
    """What a conversion worker may use (see :mod:`gateway.lifecycle.conversion.sandbox`).

    A limit of ``null`` leaves the gateway's own in place. The address-space limit
    applies to CPU conversions: CUDA reserves far more virtual memory than it uses, so
    a TensorRT conversion gets ``gpu_address_space_bytes`` (no limit by default).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    address_space_bytes: int | None = Field(32 << 30, ge=1 << 30)
    gpu_address_space_bytes: int | None = Field(None, ge=1 << 30)
    cpu_seconds: int | None = Field(4 * 3600, ge=1)  # all threads together
    file_size_bytes: int | None = Field(16 << 30, ge=1 << 20)  # any one file written
    open_files: int | None = Field(4096, ge=64)
    # tasks (processes and threads) beyond those the gateway's user already runs
    processes: int | None = Field(512, ge=16)
    # "required": refuse to convert where Landlock cannot confine the worker's files
    filesystem: Literal["required", "if_available", "off"] = "required"
    network: bool = False  # TCP from the worker (converters need none: no downloads)
    read_paths: tuple[Path, ...] = ()  # more readable places (an entry point's package)
    pass_env: tuple[str, ...] = ()  # more environment variables handed to the worker

    @field_validator("pass_env")
    @classmethod
    def _no_secrets(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        secret = [name for name in value if name.startswith("INFERGATE_")]
        if secret:
            raise ValueError(f"{secret}: the gateway's own variables never reach a worker")
        return value


class LifecycleSpec(BaseModel):
    """Where versions are written and how conversions run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # The Triton model repository the pools' servers load from (shared volume in
    # Kubernetes). New versions are published here atomically.
    repository: Path
    # SQLite job store and upload scratch space (not inside the repository).
    state_dir: Path
    # The records in PostgreSQL instead of SQLite (postgresql://user@host/db; several
    # control-plane replicas share it). $INFERGATE_DATABASE_URL wins over this.
    database_url: str | None = None
    retention: int = Field(3, ge=2)  # versions kept per model (serving + rollback target + ...)
    workers: int = Field(1, ge=1)  # conversions running at once (each its own process)
    worker_nice: int = Field(10, ge=0, le=19)  # conversions yield the CPU to serving
    worker_timeout_s: float = Field(3600.0, gt=0)
    limits: UploadLimits = Field(default_factory=lambda: UploadLimits.model_validate({}))
    load_timeout_s: float = Field(600.0, gt=0)  # one repository load on one member
    sandbox: SandboxSpec = Field(default_factory=lambda: SandboxSpec.model_validate({}))
    # Uploaded PyTorch files whose pickles import more than tensors are refused unless
    # this is set: loading them runs the uploader's code (inside the sandbox).
    allow_pickled_code: bool = False

    @field_validator("database_url")
    @classmethod
    def _postgres(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("postgresql://", "postgres://")):
            raise ValueError("database_url must be a postgresql:// URL (without it: SQLite "
                             "in state_dir)")
        return value
