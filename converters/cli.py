"""``infergate convert SOURCE --name NAME ...``: the converter pipeline on the command line.

Progress goes to stderr (a rich display on a terminal), the summary table or, with
``--json``, the result document to stdout. Exit status: 0 published, 2 refused (the
message names the problem; the repository is untouched), 1 an unexpected error.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Annotated, Any, cast

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from converters.errors import ConversionError, InvalidRequest, wrap_message
from converters.images import preprocessing_from_text
from converters.metrics import AccuracyBudget
from converters.pipeline import ConversionFailed, ConversionRequest, ConversionResult, convert
from converters.report import synthetic_warning
from converters.spec import parse_input_spec
from converters.steps.base import ProgressEvent
from converters.variants import PRECISIONS, Precision

EXIT_REFUSED = 2


def convert_command(
    source: Annotated[str, typer.Argument(
        help="Model: .onnx, torch.export .pt2, TorchScript .pt, or package.module:factory.")],
    name: Annotated[str, typer.Option("--name", help="Model name in the repository.")],
    precisions: Annotated[str, typer.Option(
        "--precisions", help="Comma-separated: fp32, fp16, int8.")] = "fp32,fp16,int8",
    calib: Annotated[Path | None, typer.Option(
        "--calib", help="Calibration set: .npy/.npz file or folder, or an image folder "
                        "(INT8 needs it).")] = None,
    eval_set: Annotated[Path | None, typer.Option(
        "--eval", help="Evaluation set, separate from the calibration set (INT8 needs it). "
                       "Without it FP32/FP16 are verified on synthetic inputs.")] = None,
    max_top1_drop: Annotated[float | None, typer.Option(
        "--max-top1-drop",
        help="Classifiers: allowed top-1 drop (disagreement without labels).")] = 0.01,
    min_cosine: Annotated[float | None, typer.Option(
        "--min-cosine", help="Minimum mean cosine similarity to FP32 (primary output).")] = 0.99,
    target: Annotated[str, typer.Option("--target", help="cpu | onnxruntime | tensorrt.")] = "cpu",
    repo: Annotated[Path, typer.Option("--repo", help="Triton model repository.")] = Path(
        "model_repo"),
    json_output: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    input_spec: Annotated[str | None, typer.Option(
        "--input-spec", help="name:dtype[batch,...];... (PyTorch sources).")] = None,
    output_names: Annotated[str | None, typer.Option(
        "--output-names", help="Comma-separated output names (PyTorch sources).")] = None,
    preprocess: Annotated[str | None, typer.Option(
        "--preprocess", help="Image folders: efficientnet-lite | imagenet | JSON.")] = None,
    task: Annotated[str, typer.Option("--task", help="auto | classification | other.")] = "auto",
    calibration_method: Annotated[str, typer.Option(
        "--calibration",
        help="minmax | entropy | percentile | auto (each measured, the best kept).")] = "minmax",
    per_channel: Annotated[bool, typer.Option("--per-channel/--per-tensor")] = True,
    repair: Annotated[bool, typer.Option(
        "--repair/--no-repair", help="INT8 accuracy repair.")] = True,
    max_batch_size: Annotated[int, typer.Option("--max-batch-size")] = 32,
    latency_budget_ms: Annotated[float | None, typer.Option(
        "--latency-budget-ms", help="p99 budget: sets max batch and queue delay.")] = None,
    drop_expired: Annotated[bool, typer.Option(
        "--drop-expired", help="Triton's queue drops a request that waited the latency "
                               "budget (and honours shorter client timeouts). Off by "
                               "default: on Triton it costs throughput under deep queues "
                               "until a reload (server#8870).")] = False,
    instances: Annotated[int, typer.Option("--instances", help="Triton instance count.")] = 1,
    threads: Annotated[int, typer.Option(
        "--threads", help="ONNX Runtime intra-op threads (0 = all cores).")] = 0,
    profile_iterations: Annotated[int, typer.Option("--profile-iterations")] = 20,
    max_calib_samples: Annotated[int | None, typer.Option("--max-calib-samples")] = 512,
    max_eval_samples: Annotated[int | None, typer.Option("--max-eval-samples")] = None,
    trt_accelerator: Annotated[bool, typer.Option(
        "--trt-accelerator", help="onnxruntime target: TensorRT accelerator.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Convert a model into verified FP32/FP16/INT8 variants, choose one within the
    accuracy budget, and publish it as the next version of a Triton model.

    INT8 needs a calibration set (--calib) and an evaluation set (--eval). FP32 and FP16
    convert without either: the variants are then verified against the source model on
    synthetic inputs (seed 0), which shows they compute the same function, not how
    accurate they are on real data."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    err = Console(stderr=True)
    try:
        request = ConversionRequest(
            source=source, name=name, repo=repo,
            precisions=_precisions(precisions), target=cast(Any, target),
            calibration=calib, evaluation=eval_set,
            input_spec=parse_input_spec(input_spec) if input_spec else None,
            output_names=tuple(n.strip() for n in (output_names or "").split(",") if n.strip()),
            preprocessing=_preprocessing(preprocess),
            budget=AccuracyBudget(max_top1_drop, min_cosine),
            task=cast(Any, task), calibration_method=cast(Any, calibration_method),
            per_channel=per_channel, repair=repair, max_batch_size=max_batch_size,
            latency_budget_ms=latency_budget_ms, drop_expired=drop_expired,
            instance_count=instances,
            intra_op_threads=threads, profile_iterations=profile_iterations,
            max_calibration_samples=max_calib_samples,
            max_evaluation_samples=max_eval_samples, trt_accelerator=trt_accelerator,
        )
        _check_choices(task, calibration_method)
        with _ProgressDisplay(err) as display:
            result = convert(request, progress=display.update)
    except ConversionError as exc:
        step = exc.step if isinstance(exc, ConversionFailed) else "request"
        if json_output:
            typer.echo(json.dumps({"error": str(exc), "action": exc.action,
                                   "reason": exc.reason, "step": step,
                                   "kind": type(getattr(exc, "cause", exc)).__name__}))
        else:
            message = str(exc) if isinstance(exc, ConversionFailed) else \
                f"{exc.action.rstrip('.')}.\n{exc}"
            # markup off: a reason may hold "[batch,3,224,224]"; soft_wrap: wrapped here,
            # between words, not by rich (which would fold inside a long token)
            err.print(wrap_message(f"error: {message}", err.width), style="red",
                      markup=False, highlight=False, soft_wrap=True)
            err.print(f"repository {repo} left unchanged", markup=False, highlight=False,
                      soft_wrap=True)
        raise typer.Exit(EXIT_REFUSED) from None
    if json_output:
        typer.echo(json.dumps(result.to_dict(), default=str))
    else:
        Console().print(summary_table(result))
        warning = synthetic_warning(result.report["evaluation"])
        if warning:
            Console().print(warning, style="yellow", markup=False, highlight=False)
        Console().print(f"published [bold]{result.name}[/] version {result.version} "
                        f"({result.precision}) at {result.path / str(result.version)}; "
                        f"report {result.report_files.get('report.md')}")


def _precisions(text: str) -> tuple[Precision, ...]:
    values = tuple(p.strip().lower() for p in text.split(",") if p.strip())
    unknown = [p for p in values if p not in PRECISIONS]
    if unknown or not values:
        raise InvalidRequest(f"precisions {text!r}: choose from {', '.join(PRECISIONS)}")
    return cast(tuple[Precision, ...], tuple(dict.fromkeys(values)))


def _preprocessing(text: str | None) -> Any:
    if not text:
        return None
    try:
        return preprocessing_from_text(text)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None


def _check_choices(task: str, calibration: str) -> None:
    if task not in ("auto", "classification", "other"):
        raise InvalidRequest(f"task {task!r}: choose auto, classification or other")
    if calibration not in ("minmax", "entropy", "percentile", "auto"):
        raise InvalidRequest(
            f"calibration {calibration!r}: choose minmax, entropy, percentile or auto")


def summary_table(result: ConversionResult) -> Table:
    table = Table(title=f"{result.name}: variants on {result.target} "
                        f"(served: {result.chosen})")
    for column in ("variant", "MB", "cosine", "top-1", "b1 ms", "best/s", "speed-up"):
        table.add_column(column, no_wrap=True)
    table.add_column("verdict", ratio=1, overflow="fold")
    for v in result.report["variants"]:
        acc, prof = v.get("accuracy") or {}, v.get("profile") or {}
        timings = prof.get("timings") or []
        verdict = v.get("verdict") or {}
        table.add_row(
            ("* " if verdict.get("chosen") else "") + v["name"],
            f"{v.get('size_bytes', 0) / 1e6:.1f}",
            _fmt(acc.get("cosine"), 4), _fmt(acc.get("top1"), 3),
            _fmt(timings[0]["p50_ms"] if timings else None, 2),
            _fmt(max((t["throughput"] for t in timings), default=None), 0),
            _fmt(v.get("speedup"), 2, "x"),
            verdict.get("reason") or v.get("failure") or "",
        )
    return table


def _fmt(value: float | None, digits: int, suffix: str = "") -> str:
    return "–" if value is None else f"{value:.{digits}f}{suffix}"


class _ProgressDisplay:
    """Rich progress on a terminal; plain step lines otherwise."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.live = console.is_terminal
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                 TimeElapsedColumn(), console=console, transient=False)
        self.tasks: dict[str, TaskID] = {}

    def __enter__(self) -> _ProgressDisplay:
        if self.live:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live:
            self.progress.stop()

    def update(self, event: ProgressEvent) -> None:
        label = f"{event.index}/{event.total} {event.title} ({event.step})"
        if not self.live:
            if event.state in ("done", "skipped", "failed"):
                print(f"{label}: {event.state} {event.elapsed_s:.1f}s {event.detail}",
                      file=sys.stderr)
            return
        if event.step not in self.tasks:
            self.tasks[event.step] = self.progress.add_task(label, total=1.0)
        task = self.tasks[event.step]
        text = escape(f"{label} - {event.detail[:80]}" if event.detail else label)
        colour = {"failed": "red", "skipped": "yellow", "done": "green"}.get(event.state, "")
        description = f"[{colour}]{text}[/]" if colour else text
        completed = 1.0 if event.state in ("done", "skipped", "failed") else event.fraction
        self.progress.update(task, description=description,
                             completed=completed if completed is not None else None)
