"""The runner: failure policy, skips, timing and progress, with stand-in steps."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from converters.errors import InvalidDataset, StepSkipped
from converters.pipeline import ConversionFailed, build_pipeline, run_steps
from converters.steps.base import (
    ConversionRequest,
    ConversionState,
    ProgressEvent,
    Step,
    StepContext,
)


@dataclass(frozen=True)
class Note:
    text: str


class AddNote(Step[Note, str]):
    name, title = "note", "Add a note"

    def __init__(self, text: str, fatal: bool = True, error: Exception | None = None,
                 skip: str | None = None) -> None:
        self.text, self.error, self.skip = text, error, skip
        self.fatal = fatal  # type: ignore[misc]

    @property
    def label(self) -> str:
        return f"note-{self.text}"

    def inputs(self, state: ConversionState) -> Note:
        if self.skip:
            raise StepSkipped(self.skip)
        return Note(self.text)

    def run(self, inputs: Note, ctx: StepContext) -> str:
        ctx.report(0.5, "halfway")
        if self.error:
            raise self.error
        return inputs.text

    def apply(self, state: ConversionState, output: str) -> ConversionState:
        return replace(state, notes=(*state.notes, output))

    def on_failure(self, state: ConversionState, reason: str) -> ConversionState:
        return replace(state, failures={**state.failures, self.text: reason})


def _state(tmp_path: Path) -> ConversionState:
    return ConversionState(ConversionRequest("m.onnx", "m", tmp_path), tmp_path)


class Ticks:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_run_steps_records_each_step_and_reports_progress_when_all_succeed(
        tmp_path: Path) -> None:
    events: list[ProgressEvent] = []
    state = run_steps([AddNote("a"), AddNote("b", skip="not needed")], _state(tmp_path),
                      events.append, clock=Ticks())
    assert state.notes == ("a",)
    assert [(r.label, r.state) for r in state.records] == [("note-a", "done"),
                                                          ("note-b", "skipped")]
    assert state.records[1].detail == "skipped: not needed"
    assert state.records[0].seconds > 0
    assert [(e.step, e.state, e.fraction) for e in events] == [
        ("note-a", "started", None), ("note-a", "running", 0.5), ("note-a", "done", 1.0),
        ("note-b", "started", None), ("note-b", "skipped", None)]
    assert events[0].index == 1 and events[0].total == 2


def test_run_steps_raises_naming_the_step_when_fatal_step_refuses(tmp_path: Path) -> None:
    steps = [AddNote("a"), AddNote("b", error=InvalidDataset("calibration set x is empty")),
             AddNote("c")]
    with pytest.raises(ConversionFailed, match="Add a note: calibration set x is empty") as info:
        run_steps(steps, _state(tmp_path))
    assert info.value.step == "note-b"
    assert isinstance(info.value.cause, InvalidDataset)
    assert [r.state for r in info.value.records] == ["done", "failed"]  # c never ran


def test_run_steps_continues_when_non_fatal_step_crashes(tmp_path: Path) -> None:
    steps = [AddNote("a", fatal=False, error=ZeroDivisionError("boom")), AddNote("b")]
    state = run_steps(steps, _state(tmp_path))
    assert state.failures == {"a": "ZeroDivisionError: boom"}
    assert state.notes == ("b",)
    assert state.records[0].state == "failed"


def test_run_steps_propagates_bugs_when_fatal_step_crashes(tmp_path: Path) -> None:
    with pytest.raises(ZeroDivisionError):
        run_steps([AddNote("a", error=ZeroDivisionError("bug"))], _state(tmp_path))


def test_build_pipeline_adds_per_variant_steps_when_int8_requested(tmp_path: Path) -> None:
    labels = [s.label for s in build_pipeline(
        ConversionRequest("m.onnx", "m", tmp_path, precisions=("fp16", "int8"),
                          calibration=tmp_path / "c", evaluation=tmp_path / "e"))]
    assert labels[:7] == ["validate", "source", "samples", "export", "check", "reference",
                          "prepare-int8"]
    assert labels[7:11] == ["build-fp32", "build-fp16", "build-int8", "build-int8-dynamic"]
    assert labels[11:] == ["verify", "repair-int8-dynamic", "repair-int8", "profile", "select",
                           "footprint", "tensorrt", "report", "publish"]
    assert labels[-1] == "publish"  # the repository is written last, or not at all


def test_build_pipeline_draws_synthetic_inputs_after_the_check_when_no_evaluation_set(
        tmp_path: Path) -> None:
    labels = [s.label for s in build_pipeline(
        ConversionRequest("m.onnx", "m", tmp_path, precisions=("fp32", "fp16")))]
    assert labels[:7] == ["validate", "source", "samples", "export", "check", "synthetic",
                          "reference"]


def test_every_step_takes_a_frozen_dataclass_when_pipeline_is_built(tmp_path: Path) -> None:
    import dataclasses

    steps = build_pipeline(ConversionRequest("m.onnx", "m", tmp_path,
                                             precisions=("fp32", "fp16", "int8")))
    for step in steps:
        base = next(b for b in type(step).__orig_bases__  # type: ignore[attr-defined]
                    if getattr(b, "__origin__", None) is Step)
        inputs = base.__args__[0]
        assert dataclasses.is_dataclass(inputs), step.label
        assert inputs.__dataclass_params__.frozen, step.label
        assert inputs is not ConversionState, f"{step.label} takes the whole state"


def test_require_returns_the_value_when_set_and_names_it_when_not(tmp_path: Path) -> None:
    state = _state(tmp_path)
    assert state.require(state.request, "request") is state.request
    with pytest.raises(RuntimeError, match="pipeline wiring: selection is not available yet"):
        state.require(state.selection, "selection")


def test_tensorrt_step_lives_in_its_own_module_when_imported() -> None:
    from converters.steps import tensorrt

    assert tensorrt.BuildEngines.__module__ == "converters.steps.tensorrt"
    assert tensorrt.BuildEngines.name == "tensorrt"


def test_failure_message_starts_with_what_to_do_when_a_fatal_step_refuses(
        tmp_path: Path) -> None:
    reason = "calibration set x is empty: " + "very long reason " * 30
    with pytest.raises(ConversionFailed) as info:
        run_steps([AddNote("a", error=InvalidDataset(reason))], _state(tmp_path))
    first, second = str(info.value).splitlines()
    assert first == "Fix the calibration or evaluation set."
    assert second == f"Add a note: {reason}"  # whole, never cut
    assert info.value.reason == reason and info.value.action == InvalidDataset.action
