"""PyTorch -> ONNX with dynamic batch/sequence axes, checked against PyTorch itself.

- ``nn.Module`` and TorchScript: the TorchScript-based exporter (``dynamo=False``) with
  ``dynamic_axes`` from the input spec; proven on EfficientNet-Lite0 and MiniLM.
- ``torch.export`` programs: the dynamo exporter, which keeps the program's own dynamic
  shapes (declared when the program was exported); opset >= 18 there.

After export, PyTorch and ONNX Runtime run the same real samples: an export that does not
compute what the source computes is refused (:class:`ExportMismatch`).
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from converters.errors import ExportMismatch, InvalidSource
from converters.metrics import compare_outputs
from converters.spec import InputSpec

MIN_OPSET = 17
DYNAMO_MIN_OPSET = 18


@dataclass(frozen=True)
class ExportedModel:
    path: Path
    opset: int
    exporter: str
    parity: Mapping[str, float]  # worst output: max_abs_err, min_cosine


def export_to_onnx(
    program: Any,
    kind: str,
    spec: InputSpec,
    example: Mapping[str, np.ndarray],
    output_names: Sequence[str],
    path: Path,
    opset: int = MIN_OPSET,
) -> ExportedModel:
    import torch

    opset = max(opset, MIN_OPSET)
    args = tuple(torch.from_numpy(np.ascontiguousarray(example[name])) for name in spec.names)
    with torch.no_grad():
        reference = _as_numpy_list(program.module()(*args) if kind == "pt2" else program(*args))
    names = list(output_names) or (
        ["output"] if len(reference) == 1 else [f"output_{i}" for i in range(len(reference))]
    )
    if len(names) != len(reference):
        raise InvalidSource(
            f"model returns {len(reference)} outputs but {len(names)} output names were given"
        )
    quiet = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(quiet):
            warnings.simplefilter("ignore")
            if kind == "pt2":
                opset = max(opset, DYNAMO_MIN_OPSET)
                torch.onnx.export(
                    program, (), str(path), dynamo=True, external_data=False,
                    opset_version=opset, input_names=list(spec.names), output_names=names,
                )
                exporter = "dynamo"
            else:
                axes = {t.name: t.dynamic_axes() for t in spec.inputs}
                batch_axis = {0: "batch"} if spec.batched else {}
                axes.update({name: dict(batch_axis) for name in names})
                torch.onnx.export(
                    program, args, str(path), dynamo=False, opset_version=opset,
                    input_names=list(spec.names), output_names=names, dynamic_axes=axes,
                )
                exporter = "torchscript"
    except Exception as exc:  # noqa: BLE001 - the exporters raise anything
        raise InvalidSource(f"export to ONNX failed: {type(exc).__name__}: {exc}") from None
    _name_dynamic_dims(path, spec)
    parity = _check_parity(path, example, reference, names)
    return ExportedModel(path, opset, exporter, parity)


def _as_numpy_list(result: Any) -> list[np.ndarray]:
    import torch

    if isinstance(result, torch.Tensor):
        return [result.detach().numpy()]
    if isinstance(result, Mapping):
        result = list(result.values())
    if isinstance(result, list | tuple):
        return [r.detach().numpy() for r in result if isinstance(r, torch.Tensor)]
    raise InvalidSource(f"model returned {type(result).__name__}, expected tensors")


def _name_dynamic_dims(path: Path, spec: InputSpec) -> None:
    """Give the exporter's symbols (``s77``) the spec's names (``batch``, ``sequence``)."""
    model = onnx.load(str(path))
    renames: dict[str, str] = {}
    for value in model.graph.input:
        if value.name not in spec.names:
            continue
        decl = spec[value.name]
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            wanted = decl.dynamic_axes().get(axis)
            if wanted and dim.dim_param and dim.dim_param != wanted:
                renames[dim.dim_param] = wanted
    if not renames:
        return
    for value in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in renames:
                dim.dim_param = renames[dim.dim_param]
    onnx.save(model, str(path))


def _check_parity(
    path: Path,
    example: Mapping[str, np.ndarray],
    reference: Sequence[np.ndarray],
    names: Sequence[str],
) -> dict[str, float]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}
    got = session.run(list(names), {k: v for k, v in example.items() if k in wanted})
    worst = {"max_abs_err": 0.0, "min_cosine": 1.0}
    for name, want, have in zip(names, reference, got, strict=True):
        stats = compare_outputs(want, have)
        scale = float(np.max(np.abs(want))) if want.size else 1.0
        if stats.min_cosine < 0.9999 or stats.max_abs_err > 1e-3 * (1.0 + scale):
            raise ExportMismatch(
                f"the exported ONNX output {name!r} differs from PyTorch on real samples: "
                f"max abs error {stats.max_abs_err:.3g}, min cosine {stats.min_cosine:.6f}"
            )
        worst["max_abs_err"] = max(worst["max_abs_err"], stats.max_abs_err)
        worst["min_cosine"] = min(worst["min_cosine"], stats.min_cosine)
    return worst
