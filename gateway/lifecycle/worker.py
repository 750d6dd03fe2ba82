"""Conversions in worker processes, outside the gateway's event loop.

Gateway side, :class:`ConversionWorkers` starts ``python -m gateway.lifecycle.worker
TASK.json`` per job and follows its progress: the worker prints one JSON event per line
on stdout (``step``, then ``result`` or ``error``); stderr goes to the job's
``worker.log``. The process runs at a lower CPU priority (``nice``) so serving keeps the
CPU, dies with the gateway (``PR_SET_PDEATHSIG``), and cleans up on SIGTERM. It runs
sandboxed (:mod:`gateway.lifecycle.sandbox`): an allow-listed environment, resource
limits, and (Landlock) reads and writes confined to what a conversion needs. A worker
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
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from gateway.lifecycle.config import SandboxSpec, UploadLimits
from gateway.lifecycle.sandbox import (
    SandboxPlan,
    SandboxUnavailable,
    child_environment,
    enter,
    plan_for,
)

_PR_SET_PDEATHSIG = 1
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
    def __init__(self, timeout_s: float = 3600.0, python: str = sys.executable,
                 sandbox: SandboxSpec | None = None, allow_pickled_code: bool = False) -> None:
        self.timeout_s = timeout_s
        self.python = python
        self.sandbox = sandbox or SandboxSpec.model_validate({})
        self.allow_pickled_code = allow_pickled_code
        self.running: dict[str, asyncio.subprocess.Process] = {}

    async def run(self, task: WorkerTask, on_step: Callable[[StepEvent], None],
                  on_start: Callable[[int], None] = lambda pid: None) -> ConversionOutcome:
        folder = Path(task.work_dir)
        folder.mkdir(parents=True, exist_ok=True)
        scratch = folder / "tmp"  # the converter's temporary files: removed with the job
        scratch.mkdir(exist_ok=True)
        with _model_folder(Path(task.repository), task.model) as writable:
            plan = plan_for(self.sandbox, folder, writable, readable=[Path(task.repository)],
                            gpu=task.spec.get("target") == "tensorrt")
            task_file = replace(task, sandbox=plan.to_json()).write(folder / "task.json")
            return await self._run(task, task_file, scratch, on_step, on_start)

    async def _run(self, task: WorkerTask, task_file: Path, scratch: Path,
                   on_step: Callable[[StepEvent], None],
                   on_start: Callable[[int], None]) -> ConversionOutcome:
        log_path = Path(task.work_dir) / "worker.log"
        with log_path.open("wb") as log:
            # cwd: the scratch folder, since some ONNX Runtime tools write into the cwd
            proc = await asyncio.create_subprocess_exec(
                self.python, "-m", "gateway.lifecycle.worker", str(task_file), cwd=scratch,
                stdout=asyncio.subprocess.PIPE, stderr=log, stdin=asyncio.subprocess.DEVNULL,
                env=child_environment(os.environ, scratch, self.sandbox,
                                      self.allow_pickled_code),
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


@contextlib.contextmanager
def _model_folder(repository: Path, model: str) -> Iterator[list[Path]]:
    """The folders a worker for ``model`` may write besides its job folder: the
    repository's staging area and the model's own folder, made here for a new model (a
    sandboxed worker cannot create folders in the repository), and removed again if
    the worker left it empty."""
    staging = repository.resolve().parent / f".{repository.resolve().name}.staging"
    staging.mkdir(parents=True, exist_ok=True)
    model_dir = repository / model
    created = not model_dir.exists()
    model_dir.mkdir(parents=True, exist_ok=True)
    try:
        yield [staging, model_dir]
    finally:
        if created:
            with contextlib.suppress(OSError):
                model_dir.rmdir()  # fails, as it should, once a version was published


_LIMIT_SIGNALS = {"SIGXCPU": " (past lifecycle.sandbox.cpu_seconds)",
                  "SIGXFSZ": " (a file past lifecycle.sandbox.file_size_bytes)"}


def _exit_reason(returncode: int | None, log_path: Path) -> str:
    if returncode is not None and returncode < 0:
        name = signal.Signals(-returncode).name
        reason = f"conversion worker was killed by {name}{_LIMIT_SIGNALS.get(name, '')}"
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
    try:
        notes = enter(SandboxPlan.from_json(task.sandbox)) if task.sandbox else []
    except (SandboxUnavailable, OSError) as exc:
        emit("error", message=f"the conversion worker could not be sandboxed: {exc}")
        return 1
    step("sandbox", "done", "; ".join(notes))
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
