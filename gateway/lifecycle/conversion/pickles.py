"""Uploaded PyTorch files that would run code when loaded, found without loading them.

A pickle is a program: its ``GLOBAL``/``STACK_GLOBAL`` opcodes import any callable and
``REDUCE`` calls it, so ``torch.load(weights_only=False)`` of a hostile file runs what it
likes. The converter opens ``.pt`` with ``torch.jit.load`` (TorchScript's C++ unpickler,
which resolves only TorchScript classes and tensors) and ``.pt2`` with
``torch.export.load``, which in torch 2.13 does call Python's unpickler on parts of the
archive (weights and constants stored as pickles, opaque objects, and sample inputs,
where it falls back to ``weights_only=False``). So every pickle inside an upload is read
here as opcodes (``pickletools``, nothing executed) and the upload refused when one
imports anything beyond what plain tensors need: collections.OrderedDict, torch's
storage and tensor rebuild functions, dtypes, devices, sizes, and (in a TorchScript
archive) the archive's own ``__torch__`` classes. A deployment that trusts its uploaders
may turn the check off (``lifecycle.allow_pickled_code``); the worker's sandbox still
holds whatever then runs.

Parts torch never unpickles are skipped: tensor storages (``<archive>/data/<n>`` of
``torch.save`` / TorchScript archives) and the raw weight and constant payloads a
``.pt2`` lists in its ``*_config.json`` with ``use_pickle: false``. Anything else is read
as a pickle from its first byte: raw bytes that happen to decode as a forbidden import
are refused too (a false refusal, never a missed one).
"""

from __future__ import annotations

import contextlib
import json
import pickletools
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import IO

MAX_NESTING = 2  # a .pt2 holds torch.save archives (sample inputs); those hold pickles
MAX_REASONS = 4

_STRING_OPS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "STRING",
               "BINSTRING", "SHORT_BINSTRING"}
_GET_OPS = {"GET", "BINGET", "LONG_BINGET"}
_PUT_OPS = {"PUT", "BINPUT", "LONG_BINPUT"}
_EXTENSION_OPS = {"EXT1", "EXT2", "EXT4"}  # copyreg's registry: any callable by number
_FRAMING_OPS = {"PROTO", "FRAME"}  # no stack effect (a frame may split module and name)
# never unpickled: torch reads these as text, TorchScript compiles code/*.py itself
_TEXT_MEMBERS = re.compile(r"^[^/]+/(version|byteorder|archive_format|archive_version|"
                           r"\.data/version|\.data/serialization_id|\.format_version|"
                           r"\.storage_alignment|code/.+\.py)$")
_STORAGE = re.compile(r"^[^/]+/data/\d+$")  # torch.save / jit.save tensor storages

SAFE_GLOBALS = frozenset({
    "collections OrderedDict", "builtins set", "builtins frozenset", "builtins bytearray",
    "builtins slice", "builtins complex", "__builtin__ set", "__builtin__ frozenset",
    "_codecs encode",  # protocol 2's spelling of bytes
    "torch Size", "torch device", "torch Tensor", "torch.nn.parameter Parameter",
    "torch.serialization _get_layout", "torch._tensor _rebuild_from_type_v2",
    *(f"torch._utils {name}" for name in (
        "_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_tensor_v3", "_rebuild_parameter",
        "_rebuild_parameter_with_state", "_rebuild_qtensor", "_rebuild_sparse_tensor",
        "_rebuild_meta_tensor_no_storage", "_rebuild_nested_tensor")),
    *(f"torch.jit._pickle {name}" for name in (
        "build_intlist", "build_tensorlist", "build_doublelist", "build_boollist",
        "build_tensor_from_id", "restore_type_tag")),
    *(f"torch {dtype}" for dtype in (
        "float64", "float32", "float16", "bfloat16", "complex128", "complex64", "complex32",
        "int64", "int32", "int16", "int8", "uint8", "uint16", "uint32", "uint64", "bool",
        "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "qint8",
        "quint8", "qint32", "strided", "sparse_coo", "sparse_csr", "per_tensor_affine",
        "per_channel_affine", "contiguous_format", "channels_last")),
})


class PickledCode(ValueError):
    """The upload holds a pickle that would import (and so may run) arbitrary code."""


def refuse_pickled_code(path: Path, display_name: str) -> None:
    """Raise :class:`PickledCode` naming what an uploaded PyTorch file would import."""
    with path.open("rb") as handle:
        reasons = list(_file_reasons(handle, depth=0))
    if reasons:
        shown = "; ".join(reasons[:MAX_REASONS]) + ("; ..." if len(reasons) > MAX_REASONS
                                                    else "")
        raise PickledCode(
            f"{display_name} would run pickled code when loaded ({shown}). Upload a "
            "TorchScript archive (torch.jit.save) or a torch.export program "
            "(torch.export.save) holding tensors only; a deployment that trusts its "
            "uploaders can set lifecycle.allow_pickled_code")


def _file_reasons(handle: IO[bytes], depth: int) -> Iterator[str]:
    if zipfile.is_zipfile(handle):
        handle.seek(0)
        yield from _archive_reasons(handle, depth)
    elif depth == 0:
        # TorchScript and torch.export files are zip archives; what else torch opens is
        # a legacy torch.save file: several pickles back to back, then raw storages
        yield ("not a zip archive, as TorchScript and torch.export files are: a legacy "
               "torch.save pickle?")
    else:
        handle.seek(0)
        yield from (f"pickle: {r}" for r in pickle_imports(handle, torchscript=False))


def _archive_reasons(handle: IO[bytes], depth: int) -> Iterator[str]:
    try:
        archive = zipfile.ZipFile(handle)
    except (zipfile.BadZipFile, OSError) as exc:
        yield f"unreadable zip archive ({exc})"
        return
    with archive:
        names = archive.namelist()
        torchscript = any(n.endswith("/constants.pkl") for n in names) and any(
            "/code/" in n for n in names)
        raw = _raw_payloads(archive, names)
        for info in archive.infolist():
            name = info.filename
            if info.is_dir() or name in raw or _STORAGE.match(name) or \
                    _TEXT_MEMBERS.match(name):
                continue
            with archive.open(info) as member:
                head = member.read(4)
            if head.startswith(b"PK\x03\x04"):
                if depth >= MAX_NESTING:
                    yield f"{name}: archives nested too deep"
                    continue
                with archive.open(info) as member:
                    yield from (f"{name}/{r}" for r in _file_reasons(member, depth + 1))
                continue
            with archive.open(info) as member:
                yield from (f"{name}: {r}" for r in pickle_imports(member, torchscript))


def _raw_payloads(archive: zipfile.ZipFile, names: list[str]) -> set[str]:
    """Members a ``.pt2`` declares as raw tensor bytes (``use_pickle: false``) and no
    entry declares as a pickle (two entries may name one file)."""
    raw: set[str] = set()
    pickled: set[str] = set()
    for name in names:
        if not name.endswith("_config.json") or "/data/" not in f"/{name}":
            continue
        with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):
            config = json.loads(archive.read(name))
            folder = PurePosixPath(name).parent
            for entry in config["config"].values():
                path = str(folder / str(entry.get("path_name")))
                (raw if entry.get("use_pickle") is False else pickled).add(path)
    return raw - pickled


def pickle_imports(stream: IO[bytes], torchscript: bool) -> list[str]:
    """What the pickles in ``stream`` import beyond plain tensors, read as opcodes,
    nothing executed. Pickles back to back (as torch's legacy format writes them) are
    read one after the other."""
    found: list[str] = []
    peek = getattr(stream, "peek", None)
    while _one_pickle(stream, torchscript, found) and peek is not None and peek(1):
        pass
    return list(dict.fromkeys(found))


def _one_pickle(stream: IO[bytes], torchscript: bool, found: list[str]) -> bool:
    """Judge one pickle; False where it is malformed (the unpickler stops there too,
    having run the opcodes before, so those are judged as well).

    A ``STACK_GLOBAL`` whose module and name are not the two strings pushed just before
    it cannot be named statically, and is refused as such."""
    memo: dict[int, object] = {}
    recent: list[object] = []  # values pushed by the latest opcodes (None: not a string)
    try:
        for opcode, arg, _ in pickletools.genops(stream):
            name = opcode.name
            if name in _FRAMING_OPS:
                continue
            if name in _STRING_OPS:
                recent.append(arg if isinstance(arg, str) else
                              arg.decode("latin-1") if isinstance(arg, bytes) else None)
                del recent[:-3]
                continue
            if name == "MEMOIZE" or name in _PUT_OPS:
                memo[len(memo) if name == "MEMOIZE" else _index(arg)] = \
                    recent[-1] if recent else None
                continue
            if name in _GET_OPS:
                recent.append(memo.get(_index(arg)))
                continue
            recent.append(None)
            if name in ("GLOBAL", "INST"):
                _judge(str(arg), torchscript, found)
            elif name == "STACK_GLOBAL":
                module, attr = recent[-3:-1] if len(recent) >= 3 else (None, None)
                if isinstance(module, str) and isinstance(attr, str):
                    _judge(f"{module} {attr}", torchscript, found)
                else:
                    found.append("an import it computes at load time (STACK_GLOBAL)")
            elif name in _EXTENSION_OPS:
                found.append(f"a callable from copyreg's extension registry ({name})")
            del recent[:-3]
    except ValueError:
        return False
    return True


def _index(arg: object) -> int:
    return arg if isinstance(arg, int) else -1


def _judge(qualified: str, torchscript: bool, found: list[str]) -> None:
    module, _, attr = qualified.partition(" ")
    if qualified in SAFE_GLOBALS:
        return
    if module == "torch" and attr.endswith("Storage") and attr.isidentifier():
        return
    if torchscript and (module == "__torch__" or module.startswith("__torch__.")):
        return  # resolved by torch.jit.load against the archive's compiled code
    found.append(f"imports {module}.{attr}")
