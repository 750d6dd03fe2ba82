"""Conversions in worker processes, outside the gateway's event loop.

Gateway side, :class:`ConversionWorkers` starts ``python -m gateway.lifecycle.worker
TASK.json`` per job and follows its progress: the worker prints one JSON event per line
on stdout (``step``, then ``result`` or ``error``); stderr goes to the job's
``worker.log``. The process runs at a lower CPU priority (``nice``) so serving keeps the
CPU, dies with the gateway (``PR_SET_PDEATHSIG``), and cleans up on SIGTERM. A worker
that is killed outright leaves at most a staging folder beside the repository (the
converter publishes a version with one ``rename``), never a partial version; the
caller clears that folder.

Worker side, :func:`main` unpacks the samples (safely) and runs the converter pipeline
(:mod:`gateway.lifecycle.conversion`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import signal
import sys
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gateway.lifecycle.config import UploadLimits

_PR_SET_PDEATHSIG = 1
LOG_TAIL_CHARS = 1500
SOURCE_ROOT = Path(__file__).resolve().parents[2]  # holds gateway/ and converters/


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


@dataclass(frozen=True)
class StepEvent:
    name: str
    state: str
    detail: str = ""
    fraction: float | None = None


class ConversionFailed(Exception):
    """The conversion did not produce a version; the message says why."""


# -- gateway side ------------------------------------------------------------------------
class ConversionWorkers:
    def __init__(self, timeout_s: float = 3600.0, python: str = sys.executable) -> None:
        self.timeout_s = timeout_s
        self.python = python
        self.running: dict[str, asyncio.subprocess.Process] = {}

    async def run(self, task: WorkerTask, on_step: Callable[[StepEvent], None],
                  on_start: Callable[[int], None] = lambda pid: None) -> ConversionOutcome:
        folder = Path(task.work_dir)
        folder.mkdir(parents=True, exist_ok=True)
        task_file = task.write(folder / "task.json")
        log_path = folder / "worker.log"
        scratch = folder / "tmp"  # the converter's temporary files: removed with the job
        scratch.mkdir(exist_ok=True)
        with log_path.open("wb") as log:
            # cwd: the job folder too, since some ONNX Runtime tools write into the cwd
            proc = await asyncio.create_subprocess_exec(
                self.python, "-m", "gateway.lifecycle.worker", str(task_file), cwd=scratch,
                stdout=asyncio.subprocess.PIPE, stderr=log, stdin=asyncio.subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(scratch),
                     "INFERGATE_PARENT_PID": str(os.getpid()),
                     "PYTHONPATH": os.pathsep.join(filter(None, (
                         str(SOURCE_ROOT), os.environ.get("PYTHONPATH"))))},
            )
        self.running[task.job_id] = proc
        on_start(proc.pid)
        try:
            outcome, error = await asyncio.wait_for(self._follow(proc, on_step), self.timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise ConversionFailed(f"conversion took longer than {self.timeout_s:.0f} s") from None
        finally:
            self.running.pop(task.job_id, None)
        if outcome is not None and proc.returncode == 0:
            return outcome
        raise ConversionFailed(error or _exit_reason(proc.returncode, log_path))

    async def _follow(self, proc: asyncio.subprocess.Process,
                      on_step: Callable[[StepEvent], None]
                      ) -> tuple[ConversionOutcome | None, str | None]:
        assert proc.stdout is not None
        outcome, error = None, None
        async for line in proc.stdout:
            try:
                event = json.loads(line)
                kind = event.pop("event")
            except (ValueError, KeyError, AttributeError):
                continue  # a stray print from a library, not an event
            if kind == "step":
                on_step(StepEvent(**event))
            elif kind == "result":
                outcome = ConversionOutcome(**event)
            elif kind == "error":
                error = str(event.get("message", "conversion failed"))
        await proc.wait()
        return outcome, error

    def kill(self, job_id: str) -> bool:
        proc = self.running.get(job_id)
        if proc is None or proc.returncode is not None:
            return False
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        return True

    async def close(self, timeout_s: float = 10.0) -> None:
        procs = list(self.running.values())
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                await asyncio.wait_for(proc.wait(), timeout_s)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()


def _exit_reason(returncode: int | None, log_path: Path) -> str:
    if returncode is not None and returncode < 0:
        reason = f"conversion worker was killed by {signal.Signals(-returncode).name}"
    else:
        reason = f"conversion worker exited with status {returncode}"
    try:
        tail = log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:].strip()
    except OSError:
        tail = ""
    return f"{reason}; log tail: {tail}" if tail else reason


# -- worker side -------------------------------------------------------------------------
def emit(kind: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": kind, **fields}) + "\n")
    sys.stdout.flush()


def step(name: str, state: str, detail: str = "", fraction: float | None = None) -> None:
    emit("step", name=name, state=state, detail=detail, fraction=fraction)


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
    from gateway.lifecycle.conversion import ConversionError, convert_upload
    from gateway.lifecycle.uploads import UnsafeArchive, prepare_samples

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
