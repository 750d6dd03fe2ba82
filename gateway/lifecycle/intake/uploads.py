"""Uploads: a multipart body streamed to disk under size limits, and sample archives
extracted safely.

The multipart body is parsed as it arrives (``python_multipart``'s push parser): each
file part is written straight to a file in the job's folder, under a name the gateway
chooses (never the client's file name), and the upload is refused with 413 the moment
a part or the whole body passes its limit. Nothing is buffered in memory beyond one
chunk.

Parts: ``model`` (file: .onnx, .pt2, .pt/.ts TorchScript), ``spec`` (JSON, a field or a
file), ``calibration`` and ``evaluation`` (optional files: .npz / .npy, or a .zip /
.tar / .tar.gz / .tgz archive of such files or of images).

Archives are extracted by :func:`safe_extract` in the conversion worker (not on the
event loop): regular files only (no links, devices), every path inside the target
folder (no zip-slip / tar-slip), bounded member count, extracted size and expansion
ratio, with sizes counted while writing (headers are not trusted).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tarfile
import zipfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import IO, Any

from python_multipart.multipart import MultipartParser, parse_options_header

from gateway.config.lifecycle import UploadLimits
from gateway.errors import InvalidInput, PayloadTooLarge

MODEL_SUFFIXES = {".onnx": "onnx", ".pt2": "pt2", ".pt": "torchscript", ".pth": "torchscript",
                  ".ts": "torchscript", ".torchscript": "torchscript"}
SAMPLE_SUFFIXES = (".npz", ".npy", ".zip", ".tar", ".tar.gz", ".tgz")
ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz")
FILE_PARTS = ("model", "calibration", "evaluation")
PARTS = (*FILE_PARTS, "spec")
MAX_FIELD_BYTES = 1024  # a text field a caller declares beside the parts (a form's)


@dataclass(frozen=True)
class UploadedFile:
    part: str
    path: Path
    size: int
    sha256: str
    filename: str  # as the client named it (display only)


@dataclass(frozen=True)
class ReceivedUpload:
    model: UploadedFile
    spec_text: str
    calibration: UploadedFile | None = None
    evaluation: UploadedFile | None = None
    fields: tuple[tuple[str, str], ...] = ()  # the declared text fields received

    def moved_to(self, folder: Path) -> ReceivedUpload:
        """The same upload once its folder was renamed to ``folder``."""
        def move(file: UploadedFile | None) -> UploadedFile | None:
            return None if file is None else replace(file, path=folder / file.path.name)

        model = move(self.model)
        assert model is not None
        return replace(self, model=model, calibration=move(self.calibration),
                       evaluation=move(self.evaluation))

    @property
    def model_format(self) -> str:
        return MODEL_SUFFIXES[_suffix(self.model.filename, tuple(MODEL_SUFFIXES))]


def _suffix(filename: str, allowed: tuple[str, ...]) -> str:
    lower = filename.lower()
    for suffix in sorted(allowed, key=len, reverse=True):
        if lower.endswith(suffix):
            return suffix
    return ""


@dataclass
class _Part:
    name: str = ""
    filename: str | None = None
    handle: IO[bytes] | None = None
    path: Path | None = None
    size: int = 0
    limit: int = 0
    digest: Any = None
    text: bytearray = field(default_factory=bytearray)
    empty_input: bool = False  # a browser's file input with no file chosen


class MultipartReceiver:
    """Feed body chunks in; files land in ``folder``. Raises InvalidInput/PayloadTooLarge."""

    def __init__(self, boundary: bytes, folder: Path, limits: UploadLimits,
                 fields: tuple[str, ...] = ()) -> None:
        self.folder, self.limits = folder, limits
        self.done: dict[str, UploadedFile] = {}
        self.spec_text: str | None = None
        self.declared_fields = fields
        self.fields: dict[str, str] = {}
        self.total = 0
        self._part = _Part()
        self._header_name = bytearray()
        self._header_value = bytearray()
        self._headers: dict[str, str] = {}
        self._error: Exception | None = None
        self._finished = False
        self._parser = MultipartParser(boundary, {
            "on_part_begin": self._on_part_begin,
            "on_header_field": lambda d, s, e: self._header_name.extend(d[s:e]),
            "on_header_value": lambda d, s, e: self._header_value.extend(d[s:e]),
            "on_header_end": self._on_header_end,
            "on_headers_finished": self._on_headers_finished,
            "on_part_data": self._on_part_data,
            "on_part_end": self._on_part_end,
            "on_end": self._on_end,
        })

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        if self.total > self.limits.max_request_bytes:
            raise PayloadTooLarge(
                f"upload exceeds {self.limits.max_request_bytes} bytes in total"
            )
        try:
            self._parser.write(chunk)
        except (InvalidInput, PayloadTooLarge):
            raise
        except Exception as exc:  # python_multipart's parse errors
            raise InvalidInput(f"malformed multipart body: {exc}") from None

    def finish(self) -> ReceivedUpload:
        self._parser.finalize()
        if not self._finished:
            raise InvalidInput("multipart body ended early (no closing boundary)")
        if "model" not in self.done:
            raise InvalidInput("the upload has no 'model' file part")
        if self.spec_text is None:
            raise InvalidInput("the upload has no 'spec' part (JSON)")
        return ReceivedUpload(self.done["model"], self.spec_text,
                              self.done.get("calibration"), self.done.get("evaluation"),
                              tuple(self.fields.items()))

    def close(self) -> None:
        if self._part.handle is not None:
            self._part.handle.close()

    # -- parser callbacks ----------------------------------------------------------------
    def _on_part_begin(self) -> None:
        self._part = _Part()
        self._headers = {}

    def _on_header_end(self) -> None:
        self._headers[self._header_name.decode("latin-1").lower()] = \
            self._header_value.decode("latin-1")
        self._header_name.clear()
        self._header_value.clear()

    def _on_headers_finished(self) -> None:
        _, options = parse_options_header(self._headers.get("content-disposition", ""))
        name = options.get(b"name", b"").decode("utf-8", "replace")
        filename = options.get(b"filename")
        part = self._part
        part.name, part.filename = name, filename.decode("utf-8", "replace") if filename else None
        if name not in PARTS and name not in self.declared_fields:
            raise InvalidInput(f"unexpected part {name!r}: parts are "
                               f"{', '.join((*PARTS, *self.declared_fields))}")
        if name in self.done or name in self.fields or (
                name == "spec" and self.spec_text is not None):
            raise InvalidInput(f"part {name!r} appears twice")
        if name in self.declared_fields:
            if part.filename is not None:
                raise InvalidInput(f"part {name!r} must be a text field, not a file")
            part.limit = MAX_FIELD_BYTES
            return
        if name == "spec":
            part.limit = self.limits.max_spec_bytes
            return
        if filename == b"" and name != "model":  # a form's optional file left unchosen
            part.empty_input = True
            return
        if not part.filename:
            raise InvalidInput(f"part {name!r} must be a file (with a filename)")
        allowed = tuple(MODEL_SUFFIXES) if name == "model" else SAMPLE_SUFFIXES
        suffix = _suffix(part.filename, allowed)
        if not suffix:
            raise InvalidInput(f"{name} file {part.filename!r}: expected one of "
                               f"{', '.join(allowed)}")
        part.limit = (self.limits.max_model_bytes if name == "model"
                      else self.limits.max_samples_bytes)
        part.path = self.folder / f"{name}{suffix}"
        part.handle = part.path.open("wb")
        part.digest = hashlib.sha256()

    def _on_part_data(self, data: bytes, start: int, end: int) -> None:
        part = self._part
        part.size += end - start
        if part.empty_input:
            if end > start:
                raise InvalidInput(f"part {part.name!r} has data but no filename")
            return
        if part.size > part.limit:
            raise PayloadTooLarge(f"part {part.name!r} exceeds its limit of {part.limit} bytes")
        if part.handle is None:
            part.text.extend(data[start:end])
        else:
            view = memoryview(data)[start:end]
            part.handle.write(view)
            part.digest.update(view)

    def _on_part_end(self) -> None:
        part = self._part
        if part.name == "spec":
            self.spec_text = part.text.decode("utf-8", "replace")
            return
        if part.name in self.declared_fields:
            self.fields[part.name] = part.text.decode("utf-8", "replace")
            return
        if part.empty_input:
            return
        assert part.handle is not None and part.path is not None
        part.handle.close()
        part.handle = None
        if part.size == 0:
            raise InvalidInput(f"{part.name} file {part.filename!r} is empty")
        self.done[part.name] = UploadedFile(part.name, part.path, part.size,
                                            part.digest.hexdigest(), part.filename or "")

    def _on_end(self) -> None:
        self._finished = True


def multipart_boundary(content_type: str | None) -> bytes:
    kind, options = parse_options_header(content_type or "")
    if kind != b"multipart/form-data" or not options.get(b"boundary"):
        raise InvalidInput("expected a multipart/form-data body (model, spec, calibration, "
                           "evaluation parts)")
    boundary: bytes = options[b"boundary"]
    if len(boundary) > 70:  # RFC 2046; python-multipart raises on its own limit
        raise InvalidInput(f"multipart boundary of {len(boundary)} characters (at most 70)")
    return boundary


async def receive_upload(chunks: AsyncIterator[bytes], content_type: str | None,
                         content_length: int | None, folder: Path,
                         limits: UploadLimits, fields: tuple[str, ...] = ()) -> ReceivedUpload:
    """Stream the body into ``folder``; on any error nothing of it is kept. ``fields``:
    text fields accepted beside the parts (at most 1 KiB each), in ``.fields``."""
    if content_length is not None and content_length > limits.max_request_bytes:
        raise PayloadTooLarge(f"upload of {content_length} bytes exceeds the limit of "
                              f"{limits.max_request_bytes} bytes")
    receiver = MultipartReceiver(multipart_boundary(content_type), folder, limits, fields)
    try:
        async for chunk in chunks:
            receiver.feed(chunk)
        return receiver.finish()
    except BaseException:
        receiver.close()
        shutil.rmtree(folder, ignore_errors=True)
        raise
    finally:
        receiver.close()


# -- samples ---------------------------------------------------------------------------
class UnsafeArchive(ValueError):
    """An archive member would escape the target, is a link/device, or is too big."""


def prepare_samples(upload: Path, folder: Path, limits: UploadLimits) -> Path:
    """A folder holding the samples: the .npz/.npy file itself, or an archive's files."""
    folder.mkdir(parents=True, exist_ok=True)
    suffix = _suffix(upload.name, ARCHIVE_SUFFIXES)
    if not suffix:
        shutil.move(upload, folder / upload.name)
        return folder
    safe_extract(upload, folder, limits)
    upload.unlink()
    if not any(p.is_file() for p in folder.rglob("*")):
        raise UnsafeArchive(f"{upload.name} holds no files")
    return folder


def _member_target(folder: Path, name: str) -> Path:
    pure = PurePosixPath(name.replace("\\", "/"))
    if pure.is_absolute() or ".." in pure.parts or not pure.parts:
        raise UnsafeArchive(f"archive member {name!r} points outside the target folder")
    target = (folder / pure).resolve()
    if not target.is_relative_to(folder.resolve()):
        raise UnsafeArchive(f"archive member {name!r} points outside the target folder")
    return target


class _Budget:
    def __init__(self, archive_bytes: int, limits: UploadLimits) -> None:
        self.limits = limits
        self.written = 0
        self.max_total = min(limits.max_extracted_bytes,
                             int(max(archive_bytes, 1) * limits.max_compression_ratio))

    def copy(self, source: IO[bytes], target: Path, declared: int) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        written = 0
        with target.open("xb") as out:
            while chunk := source.read(1 << 20):
                written += len(chunk)
                self.written += len(chunk)
                if written > declared:
                    raise UnsafeArchive(f"{target.name}: more data than its header declares")
                if self.written > self.max_total:
                    raise UnsafeArchive(
                        f"archive expands past {self.max_total} bytes (limit "
                        f"{self.limits.max_extracted_bytes} bytes, ratio "
                        f"{self.limits.max_compression_ratio:g}x)"
                    )
                out.write(chunk)


def safe_extract(archive: Path, folder: Path, limits: UploadLimits) -> None:
    """Extract a .zip / .tar[.gz] into ``folder``; raise UnsafeArchive on anything odd."""
    budget = _Budget(archive.stat().st_size, limits)
    if zipfile.is_zipfile(archive):
        _extract_zip(archive, folder, limits, budget)
    elif tarfile.is_tarfile(archive):
        _extract_tar(archive, folder, limits, budget)
    else:
        raise UnsafeArchive(f"{archive.name} is neither a zip nor a tar archive")


def _extract_zip(archive: Path, folder: Path, limits: UploadLimits, budget: _Budget) -> None:
    with zipfile.ZipFile(archive) as zf:
        members = zf.infolist()
        if len(members) > limits.max_archive_members:
            raise UnsafeArchive(f"{len(members)} members > {limits.max_archive_members}")
        for info in members:
            target = _member_target(folder, info.filename)
            kind = stat.S_IFMT(info.external_attr >> 16)  # 0 when the tool set no type
            if info.is_dir():
                continue
            if kind and kind != stat.S_IFREG:
                raise UnsafeArchive(f"archive member {info.filename!r} is not a regular file")
            if info.file_size > max(info.compress_size, 1) * limits.max_compression_ratio:
                raise UnsafeArchive(f"archive member {info.filename!r} expands "
                                    f"{info.file_size / max(info.compress_size, 1):.0f}x")
            with zf.open(info) as source:
                budget.copy(source, target, info.file_size)


def _extract_tar(archive: Path, folder: Path, limits: UploadLimits, budget: _Budget) -> None:
    with tarfile.open(archive, "r:*") as tf:
        count = 0
        for member in tf:
            count += 1
            if count > limits.max_archive_members:
                raise UnsafeArchive(f"more than {limits.max_archive_members} members")
            target = _member_target(folder, member.name)
            if member.isdir():
                continue
            if not member.isfile():
                raise UnsafeArchive(f"archive member {member.name!r} is a link or device")
            source = tf.extractfile(member)
            assert source is not None
            with source:
                budget.copy(source, target, member.size)
                os.chmod(target, 0o644)
