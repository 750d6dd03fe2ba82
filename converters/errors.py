"""One root for everything the converter refuses, each naming the problem it found.

Domain errors (bad model, bad data, bad request) are :class:`ConversionError`
subclasses: the CLI prints them and exits 2, the upload API maps them to 4xx. Anything
else escaping the pipeline is a bug and keeps its traceback.
"""

from __future__ import annotations


class ConversionError(Exception):
    """A conversion the converter refuses, with a message naming the problem."""


class InvalidRequest(ConversionError):
    """Options that contradict each other or name something unknown."""


class InvalidSource(ConversionError):
    """The model file is missing, corrupt, or of an unknown kind."""


class UnsupportedOperator(ConversionError):
    """The graph uses an operator that ONNX or ONNX Runtime cannot execute."""

    def __init__(self, message: str, operators: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.operators = operators


class InputSpecMismatch(ConversionError):
    """The declared input spec (or a data set) does not match the model's inputs."""


class InvalidDataset(ConversionError):
    """A calibration or evaluation set that is missing, empty or unreadable."""


class ExportMismatch(ConversionError):
    """The exported ONNX model does not compute what the source model computes."""


class TargetUnavailable(ConversionError):
    """The chosen target needs something this host lacks (e.g. TensorRT engines)."""


class EngineMismatch(ConversionError):
    """A TensorRT engine built for another GPU architecture or TensorRT version."""


class StepSkipped(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Raised by a step that does not apply here; the message says why."""
