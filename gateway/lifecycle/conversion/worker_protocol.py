"""What the gateway and a conversion worker say to each other (both sides import this
module and nothing of each other): the task file the gateway writes, the events the
worker prints on stdout, one JSON object per line (``step``, then ``result`` or
``error``), and the outcome."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

LOG_TAIL_CHARS = 1500


@dataclass(frozen=True)
class WorkerTask:
    """Everything a worker needs, written as JSON next to the uploaded files."""

    job_id: str
    model: str
    repository: str
    model_file: str
    model_format: str
    spec: dict[str, Any]
    work_dir: str
    calibration: str | None = None
    evaluation: str | None = None
    limits: dict[str, Any] = field(default_factory=dict)
    nice: int = 10
    sandbox: dict[str, Any] = field(default_factory=dict)  # a SandboxPlan; set by run()
    # a rollout follows: keep this many evaluation samples (the synthetic ones when no
    # evaluation part was uploaded) to replay (agreement.npz)
    agreement_samples: int = 0
    # the least version number to publish: one above every number the lifecycle ever
    # issued for the model (a failed, rolled-back or deleted version's included)
    min_version: int = 1

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps(asdict(self)))
        return path

    @classmethod
    def read(cls, path: Path) -> WorkerTask:
        return cls(**json.loads(path.read_text()))


@dataclass(frozen=True)
class ConversionOutcome:
    """What the worker published: the new version and the config it was written with."""

    version: int
    config: str
    precision: str | None = None
    report: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    agreement: str | None = None  # the kept evaluation samples (.npz), in the work folder


@dataclass(frozen=True)
class StepEvent:
    name: str
    state: str
    detail: str = ""
    fraction: float | None = None


class ConversionFailed(Exception):
    """The conversion did not produce a version; the message says why."""


def emit(kind: str, **fields: Any) -> None:
    """Worker side: one event on stdout."""
    sys.stdout.write(json.dumps({"event": kind, **fields}) + "\n")
    sys.stdout.flush()


def step(name: str, state: str, detail: str = "", fraction: float | None = None) -> None:
    emit("step", name=name, state=state, detail=detail, fraction=fraction)
