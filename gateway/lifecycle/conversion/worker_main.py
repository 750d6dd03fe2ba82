"""A conversion worker process: ``python -m gateway.lifecycle.conversion.worker_main TASK.json``.

It enters its sandbox, unpacks the samples (safely) and runs the converter pipeline
(:mod:`gateway.lifecycle.conversion.convert`), printing events (:mod:`worker_protocol`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gateway.config.lifecycle import UploadLimits
from gateway.lifecycle.conversion.sandbox import SandboxPlan, SandboxUnavailable, enter
from gateway.lifecycle.conversion.worker_protocol import WorkerTask, emit, step

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    parent = os.environ.get("INFERGATE_PARENT_PID")
    if parent and os.getppid() != int(parent):
        sys.exit("the gateway that started this worker is gone")


def _terminate(signum: int, frame: Any) -> None:
    # SystemExit unwinds through the converter's `finally` blocks: staging is removed.
    raise SystemExit(128 + signum)


def main(argv: list[str]) -> int:
    _die_with_parent()
    signal.signal(signal.SIGTERM, _terminate)
    task = WorkerTask.read(Path(argv[1]))
    os.nice(task.nice)
    try:
        notes = enter(SandboxPlan.from_json(task.sandbox)) if task.sandbox else []
    except (SandboxUnavailable, OSError) as exc:
        emit("error", message=f"the conversion worker could not be sandboxed: {exc}")
        return 1
    step("sandbox", "done", "; ".join(notes))
    from gateway.lifecycle.conversion.convert import ConversionError, convert_upload
    from gateway.lifecycle.intake.uploads import UnsafeArchive, prepare_samples

    try:
        limits = UploadLimits.model_validate(task.limits)
        samples: dict[str, Path | None] = {}
        step("unpack", "running")
        for part in ("calibration", "evaluation"):
            upload = getattr(task, part)
            samples[part] = (prepare_samples(Path(upload), Path(task.work_dir) / part, limits)
                             if upload else None)
        step("unpack", "done")
        outcome = convert_upload(task, samples["calibration"], samples["evaluation"], step)
    except (ConversionError, UnsafeArchive) as exc:
        emit("error", message=str(exc))
        return 1
    except Exception as exc:  # noqa: BLE001 - reported as the job's error, with context
        traceback.print_exc()
        emit("error", message=f"conversion failed: {type(exc).__name__}: {exc}")
        return 1
    emit("result", **asdict(outcome))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
