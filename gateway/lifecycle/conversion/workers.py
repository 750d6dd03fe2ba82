"""Conversions in worker processes, outside the gateway's event loop: the gateway side.

:class:`ConversionWorkers` starts ``python -m gateway.lifecycle.conversion.worker_main TASK.json``
per job and follows its progress: the worker prints one JSON event per line
on stdout (``step``, then ``result`` or ``error``); stderr goes to the job's
``worker.log``. The process runs at a lower CPU priority (``nice``) so serving keeps the
CPU, dies with the gateway (``PR_SET_PDEATHSIG``), and cleans up on SIGTERM. It runs
sandboxed (:mod:`gateway.lifecycle.conversion.sandbox`): an allow-listed environment, resource
limits, and (Landlock) reads and writes confined to what a conversion needs. A worker
that is killed outright leaves at most a staging folder beside the repository (the
converter publishes a version with one ``rename``), never a partial version; the
caller clears that folder.

The worker's side is :mod:`gateway.lifecycle.conversion.worker_main`; what they exchange is
:mod:`gateway.lifecycle.conversion.worker_protocol`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

from gateway.config.lifecycle import SandboxSpec
from gateway.lifecycle.conversion.sandbox import child_environment, plan_for
from gateway.lifecycle.conversion.worker_protocol import (
    LOG_TAIL_CHARS,
    ConversionFailed,
    ConversionOutcome,
    StepEvent,
    WorkerTask,
)


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
                self.python, "-m", "gateway.lifecycle.conversion.worker_main", str(task_file),
                cwd=scratch,
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
