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


COMPRESSED_SUFFIXES = (".gz", ".tgz", ".bz2", ".xz", ".zst", ".zip", ".tar", ".7z")
MAGIC = {b"\x1f\x8b": "gzip-compressed", b"PK\x03\x04": "a zip archive",
         b"BZh": "bzip2-compressed", b"\xfd7zXZ": "xz-compressed",
         b"\x28\xb5\x2f\xfd": "zstd-compressed"}


def sniff(path: Path) -> str | None:
    """What the file's first bytes say it is, when it is a known wrapper format."""
    try:
        with path.open("rb") as handle:
            head = handle.read(8)
    except OSError:
        return None
    return next((what for magic, what in MAGIC.items() if head.startswith(magic)), None)


def _refuse_wrapped(path: Path) -> None:
    """An ONNX model inside a compression/archive wrapper, or under a wrong extension, is
    refused with what it is and what to do; never guessed at."""
    wrapper = sniff(path) if path.is_file() else None
    compressed = path.suffix.lower() in COMPRESSED_SUFFIXES
    if path.suffix == ".onnx" and wrapper == "a zip archive":
        raise InvalidSource(
            f"{path.name} is named .onnx but is a zip archive (PyTorch and TorchScript files "
            "are zip archives), not an ONNX protobuf",
            action="Give the ONNX model itself, or a TorchScript archive named .pt")
    if path.suffix == ".onnx" and wrapper is not None or compressed:
        what = wrapper or f"a {path.suffix} file"
        raise InvalidSource(
            f"{path.name} is {what}, not an ONNX model: the converter reads uncompressed "
            ".onnx files (with any external weights files beside them)",
            action=f"Decompress {path.name} and give the .onnx file inside it")


def source_kind(location: str) -> SourceKind:
    path = Path(location)
    _refuse_wrapped(path)
    if path.suffix == ".onnx":
        return "onnx"
    if path.suffix == ".pt2":
        return "pt2"
    if path.suffix in TORCHSCRIPT_SUFFIXES:
        return "torchscript"
    if not path.exists() and ENTRY_POINT_RE.match(location):
        return "entrypoint"
    if path.is_file() and _parses_as_onnx(path):
        raise InvalidSource(
            f"{path.name} looks like an ONNX model but its extension is {path.suffix or 'none'}"
            ": the converter tells models apart by extension",
            action=f"Rename {path.name} to {path.stem}.onnx")
    raise InvalidSource(
        f"cannot tell what {location!r} is: give an .onnx file, a torch.export .pt2 "
        "program, a TorchScript .pt archive, or an entry point package.module:factory"
    )


def _parses_as_onnx(path: Path) -> bool:
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # noqa: BLE001 - anything unparsable is not ONNX
        return False
    return len(model.graph.node) > 0 and model.ir_version > 0


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
