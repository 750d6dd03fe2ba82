"""Where a model comes from: an ONNX file, a ``torch.export`` program (.pt2), a
TorchScript archive (.pt), or an entry point ``package.module:factory``.

:func:`load_source` only identifies and opens the source (cheap checks, clear errors);
:mod:`converters.sources.export` turns a PyTorch source into ONNX.

A factory returns an ``nn.Module`` (the input spec then comes from ``--input-spec``) or
an :class:`EntryPointModel` carrying its own spec and output names.
"""

from __future__ import annotations

import hashlib
import importlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from converters.errors import InvalidSource
from converters.spec import InputSpec

SourceKind = Literal["onnx", "pt2", "torchscript", "entrypoint"]
ENTRY_POINT_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
TORCHSCRIPT_SUFFIXES = (".pt", ".pth", ".ts", ".torchscript")


@dataclass(frozen=True)
class EntryPointModel:
    """What a factory may return: the module, its inputs, and how to name its outputs."""

    module: Any  # torch.nn.Module
    input_spec: InputSpec
    output_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class LoadedSource:
    kind: SourceKind
    location: str
    sha256: str
    onnx_path: Path | None = None  # kind == "onnx"
    program: Any = field(default=None, repr=False)  # module / ScriptModule / ExportedProgram
    input_spec: InputSpec | None = None  # from the factory, when it declares one
    output_names: tuple[str, ...] = ()


def source_kind(location: str) -> SourceKind:
    path = Path(location)
    if path.suffix == ".onnx":
        return "onnx"
    if path.suffix == ".pt2":
        return "pt2"
    if path.suffix in TORCHSCRIPT_SUFFIXES:
        return "torchscript"
    if not path.exists() and ENTRY_POINT_RE.match(location):
        return "entrypoint"
    raise InvalidSource(
        f"cannot tell what {location!r} is: give an .onnx file, a torch.export .pt2 "
        "program, a TorchScript .pt archive, or an entry point package.module:factory"
    )


def load_source(location: str) -> LoadedSource:
    kind = source_kind(location)
    if kind == "entrypoint":
        return _load_entry_point(location)
    path = Path(location)
    if not path.is_file():
        raise InvalidSource(f"model file {path} does not exist")
    digest = sha256_of(path)
    if kind == "onnx":
        return LoadedSource(kind, str(path), digest, onnx_path=path)
    if kind == "pt2":
        return LoadedSource(kind, str(path), digest, program=_load_pt2(path))
    return LoadedSource(kind, str(path), digest, program=_load_torchscript(path))


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _load_pt2(path: Path) -> Any:
    import torch

    try:
        return torch.export.load(str(path))
    except Exception as exc:  # noqa: BLE001 - torch raises many types for a bad archive
        raise InvalidSource(
            f"{path} is not a torch.export program (torch.export.save): {type(exc).__name__}: "
            f"{exc}"
        ) from None


def _load_torchscript(path: Path) -> Any:
    import torch

    try:
        return torch.jit.load(str(path), map_location="cpu").eval()
    except Exception as exc:  # noqa: BLE001
        raise InvalidSource(
            f"{path} is not a TorchScript archive (torch.jit.save); a pickled state_dict "
            f"needs an entry point package.module:factory instead ({type(exc).__name__}: {exc})"
        ) from None


def _load_entry_point(location: str) -> LoadedSource:
    module_name, _, attr = location.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise InvalidSource(f"entry point {location!r} cannot be imported: {exc}") from None
    produced = factory()
    digest = hashlib.sha256(location.encode()).hexdigest()
    if isinstance(produced, EntryPointModel):
        return LoadedSource(
            "entrypoint", location, digest, program=produced.module.eval(),
            input_spec=produced.input_spec, output_names=produced.output_names,
        )
    if hasattr(produced, "eval") and hasattr(produced, "forward"):
        return LoadedSource("entrypoint", location, digest, program=produced.eval())
    raise InvalidSource(
        f"entry point {location!r} returned {type(produced).__name__}; expected a "
        "torch.nn.Module or converters.sources.EntryPointModel"
    )
