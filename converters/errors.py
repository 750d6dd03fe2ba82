"""One root for everything the converter refuses, each naming the problem it found.

Domain errors (bad model, bad data, bad request) are :class:`ConversionError`
subclasses: the CLI prints them and exits 2, the upload API maps them to 4xx. Anything
else escaping the pipeline is a bug and keeps its traceback.

Each error carries the whole reason (ONNX Runtime's, the checker's or the exporter's
text is never cut) and an ``action``: one line saying what the owner should do, which
:class:`~converters.pipeline.ConversionFailed` puts first.
"""

from __future__ import annotations

import textwrap


class ConversionError(Exception):
    """A conversion the converter refuses, with a message naming the problem."""

    action = "Fix the request"

    def __init__(self, message: str, *, action: str | None = None) -> None:
        super().__init__(message)
        if action is not None:
            self.action = action

    @property
    def reason(self) -> str:
        return str(self)


class InvalidRequest(ConversionError):
    """Options that contradict each other or name something unknown."""

    action = "Change the conversion options"


class InvalidSource(ConversionError):
    """The model file is missing, corrupt, or of an unknown kind."""

    action = "Fix or re-export the model file"


class UnsupportedOpset(InvalidSource):
    """The model's opset or IR version is newer than the serving runtime runs."""

    action = "Re-export the model with an older opset"


class UnsupportedOperator(ConversionError):
    """The graph uses an operator that ONNX or ONNX Runtime cannot execute."""

    action = "Replace the operator, or re-export the model without it"

    def __init__(self, message: str, operators: tuple[str, ...] = (), *,
                 action: str | None = None) -> None:
        super().__init__(message, action=action)
        self.operators = operators


class InputSpecMismatch(ConversionError):
    """The declared input spec (or a data set) does not match the model's inputs."""

    action = "Make --input-spec and the sample sets match the model's inputs"


class InvalidDataset(ConversionError):
    """A calibration or evaluation set that is missing, empty or unreadable."""

    action = "Fix the calibration or evaluation set"


class ExportMismatch(ConversionError):
    """The exported ONNX model does not compute what the source model computes."""

    action = "Export the model to ONNX yourself and convert the .onnx file"


class TargetUnavailable(ConversionError):
    """The chosen target needs something this host lacks (e.g. TensorRT engines)."""

    action = "Choose another target, or convert on a host that has what it needs"


class EngineMismatch(ConversionError):
    """A TensorRT engine built for another GPU architecture or TensorRT version."""

    action = "Rebuild the TensorRT engine on the GPU that serves it"


class StepSkipped(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Raised by a step that does not apply here; the message says why."""


def wrap_message(text: str, width: int, indent: str = "  ") -> str:
    """``text`` wrapped at ``width`` between words, never inside one: a long token (a path,
    a C++ signature) overflows its line rather than being cut. Lines after the first of
    each paragraph are indented."""
    lines = []
    for paragraph in text.splitlines() or [""]:
        lines.extend(textwrap.wrap(paragraph, width=max(20, width), subsequent_indent=indent,
                                   break_long_words=False, break_on_hyphens=False,
                                   replace_whitespace=False, drop_whitespace=True) or [""])
    return "\n".join(lines)
