"""Uploads stream to disk under limits; sample archives extract only inside their folder."""

from __future__ import annotations

import asyncio
import io
import tarfile
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from gateway.config.lifecycle import UploadLimits
from gateway.errors import InvalidInput, PayloadTooLarge
from gateway.lifecycle.intake.uploads import (
    ReceivedUpload,
    UnsafeArchive,
    prepare_samples,
    receive_upload,
    safe_extract,
)

SPEC = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": ["batch", 16]}]}'


def _body(files: dict[str, Any], data: dict[str, str] | None = None) -> tuple[bytes, str]:
    request = httpx.Request("POST", "http://gw/", files=files, data=data)
    return request.read(), request.headers["content-type"]


async def _chunks(body: bytes, size: int = 7000) -> AsyncIterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start:start + size]


def _receive(tmp_path: Path, body: bytes, content_type: str,
             limits: UploadLimits | None = None) -> ReceivedUpload:
    folder = tmp_path / "job"
    folder.mkdir(exist_ok=True)
    return asyncio.run(receive_upload(_chunks(body), content_type, len(body), folder,
                                      limits or UploadLimits()))


def test_upload_lands_on_disk_under_gateway_names_when_well_formed(tmp_path: Path) -> None:
    model = bytes(range(256)) * 400
    body, ctype = _body({"model": ("../../etc/evil.onnx", model),
                         "evaluation": ("eval.npz", b"PK-not-really"),
                         "spec": ("spec.json", SPEC)})
    upload = _receive(tmp_path, body, ctype)
    assert upload.model.path == tmp_path / "job" / "model.onnx"
    assert upload.model.path.read_bytes() == model
    assert upload.model_format == "onnx"
    assert upload.evaluation is not None and upload.evaluation.path.name == "evaluation.npz"
    assert upload.calibration is None
    assert upload.spec_text.encode() == SPEC
    assert sorted(p.name for p in (tmp_path / "job").iterdir()) == ["evaluation.npz",
                                                                   "model.onnx"]


def test_upload_accepts_spec_as_form_field_when_not_a_file(tmp_path: Path) -> None:
    body, ctype = _body({"model": ("m.pt2", b"PK\x03\x04x")}, {"spec": SPEC.decode()})
    upload = _receive(tmp_path, body, ctype)
    assert upload.model_format == "pt2" and upload.spec_text.encode() == SPEC


def test_upload_refused_with_413_and_nothing_kept_when_part_too_large(tmp_path: Path) -> None:
    body, ctype = _body({"model": ("m.onnx", b"x" * 50_000), "spec": ("s.json", SPEC)})
    with pytest.raises(PayloadTooLarge, match="'model' exceeds"):
        _receive(tmp_path, body, ctype, UploadLimits(max_model_bytes=10_000))
    assert not (tmp_path / "job").exists()


def test_upload_refused_before_reading_when_declared_length_too_large(tmp_path: Path) -> None:
    async def never() -> AsyncIterator[bytes]:
        raise AssertionError("the body must not be read")
        yield b""

    with pytest.raises(PayloadTooLarge):
        asyncio.run(receive_upload(never(), "multipart/form-data; boundary=x", 10**12,
                                   tmp_path, UploadLimits()))


@pytest.mark.parametrize(("files", "data", "message"), [
    ({"spec": ("s.json", SPEC)}, None, "no 'model'"),
    ({"model": ("m.onnx", b"x")}, None, "no 'spec'"),
    ({"model": ("m.exe", b"x"), "spec": ("s.json", SPEC)}, None, "expected one of"),
    ({"model": ("m.onnx", b"x"), "spec": ("s.json", SPEC), "weights": ("w.bin", b"x")},
     None, "unexpected part 'weights'"),
    ({"model": ("m.onnx", b""), "spec": ("s.json", SPEC)}, None, "is empty"),
    ({"spec": ("s.json", SPEC)}, {"model": "not a file"}, "must be a file"),
])
def test_upload_refused_with_clear_error_when_parts_wrong(
    tmp_path: Path, files: dict[str, Any], data: dict[str, str] | None, message: str
) -> None:
    body, ctype = _body(files, data)
    with pytest.raises(InvalidInput, match=message):
        _receive(tmp_path, body, ctype)


def test_upload_refused_when_not_multipart(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="multipart/form-data"):
        _receive(tmp_path, b"{}", "application/json")


def test_upload_refused_when_body_truncated(tmp_path: Path) -> None:
    body, ctype = _body({"model": ("m.onnx", b"x" * 1000), "spec": ("s.json", SPEC)})
    with pytest.raises(InvalidInput):
        _receive(tmp_path, body[:-100], ctype)


# -- archives ------------------------------------------------------------------------------
def _npz_bytes() -> bytes:
    out = io.BytesIO()
    np.savez(out, x=np.zeros((4, 16), np.float32))
    return out.getvalue()


def test_samples_extracted_when_archive_well_formed(tmp_path: Path) -> None:
    archive = tmp_path / "calibration.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        data = _npz_bytes()
        info = tarfile.TarInfo("set/a.npz")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    folder = prepare_samples(archive, tmp_path / "calibration", UploadLimits())
    assert (folder / "set" / "a.npz").read_bytes() == _npz_bytes()
    assert not archive.exists()


def test_samples_kept_as_file_when_npz(tmp_path: Path) -> None:
    path = tmp_path / "evaluation.npz"
    path.write_bytes(_npz_bytes())
    folder = prepare_samples(path, tmp_path / "evaluation", UploadLimits())
    assert [p.name for p in folder.iterdir()] == ["evaluation.npz"]


@pytest.mark.parametrize("name", ["../escape.npz", "/abs/escape.npz", "a/../../escape.npz"])
def test_zip_refused_when_member_escapes_folder(tmp_path: Path, name: str) -> None:
    archive = tmp_path / "s.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr(name, b"x")
    with pytest.raises(UnsafeArchive, match="outside"):
        safe_extract(archive, tmp_path / "out", UploadLimits())
    assert not (tmp_path / "escape.npz").exists()


@pytest.mark.parametrize("kind", [tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE])
def test_tar_refused_when_member_is_link_or_device(tmp_path: Path, kind: bytes) -> None:
    archive = tmp_path / "s.tar"
    with tarfile.open(archive, "w") as tf:
        info = tarfile.TarInfo("link.npz")
        info.type = kind
        info.linkname = "/etc/passwd"
        tf.addfile(info)
    with pytest.raises(UnsafeArchive, match="link or device"):
        safe_extract(archive, tmp_path / "out", UploadLimits())


def test_tar_refused_when_member_escapes_folder(tmp_path: Path) -> None:
    archive = tmp_path / "s.tar"
    with tarfile.open(archive, "w") as tf:
        info = tarfile.TarInfo("../../escape.npz")
        info.size = 1
        tf.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(UnsafeArchive, match="outside"):
        safe_extract(archive, tmp_path / "out", UploadLimits())


def test_zip_refused_when_it_expands_like_a_bomb(tmp_path: Path) -> None:
    archive = tmp_path / "bomb.zip"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("zeros.npy", b"\0" * 5_000_000)
    with pytest.raises(UnsafeArchive, match="expands"):
        safe_extract(archive, tmp_path / "out", UploadLimits(max_compression_ratio=50))


def test_tar_refused_when_extracted_size_over_limit(tmp_path: Path) -> None:
    archive = tmp_path / "big.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        for i in range(3):
            info = tarfile.TarInfo(f"f{i}.npy")
            info.size = 400_000
            tf.addfile(info, io.BytesIO(b"\0" * 400_000))
    with pytest.raises(UnsafeArchive, match="expands past"):
        safe_extract(archive, tmp_path / "out",
                     UploadLimits(max_extracted_bytes=1_000_000, max_compression_ratio=1e6))


def test_archive_refused_when_too_many_members(tmp_path: Path) -> None:
    archive = tmp_path / "many.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for i in range(20):
            zf.writestr(f"f{i}.npy", b"x")
    with pytest.raises(UnsafeArchive, match="members"):
        safe_extract(archive, tmp_path / "out", UploadLimits(max_archive_members=10))


def test_zip_refused_when_member_is_symlink(tmp_path: Path) -> None:
    archive = tmp_path / "link.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        info = zipfile.ZipInfo("link.npy")
        info.external_attr = (0o120777 << 16)  # S_IFLNK, as `zip -y` stores it
        zf.writestr(info, "/etc/passwd")
    with pytest.raises(UnsafeArchive, match="not a regular file"):
        safe_extract(archive, tmp_path / "out", UploadLimits())


def test_upload_refused_with_invalid_input_when_boundary_too_long(tmp_path: Path) -> None:
    body, _ = _body({"model": ("m.onnx", b"x"), "spec": ("s.json", SPEC)})
    with pytest.raises(InvalidInput, match="boundary of 300 characters"):
        _receive(tmp_path, body, "multipart/form-data; boundary=" + "x" * 300)


def _browser_form(parts: list[tuple[str, str | None, bytes]]) -> tuple[bytes, str]:
    """A multipart body as a browser sends a form: a file input left empty is a part
    with ``filename=""`` and no data."""
    out = b""
    for name, filename, data in parts:
        disposition = f'form-data; name="{name}"' + (
            f'; filename="{filename}"' if filename is not None else "")
        kind = "\r\nContent-Type: application/octet-stream" if filename is not None else ""
        out += f"--B\r\nContent-Disposition: {disposition}{kind}\r\n\r\n".encode() + data + b"\r\n"
    return out + b"--B--\r\n", "multipart/form-data; boundary=B"


def test_form_fields_kept_beside_parts_and_empty_file_inputs_ignored(tmp_path: Path) -> None:
    body, ctype = _browser_form([("csrf", None, b"tok"), ("name", None, b"tiny"),
                                 ("model", "m.onnx", b"onnx"), ("spec", None, SPEC),
                                 ("evaluation", "", b""), ("calibration", "", b"")])
    folder = tmp_path / "job"
    folder.mkdir()
    upload = asyncio.run(receive_upload(_chunks(body), ctype, len(body), folder,
                                        UploadLimits(), ("csrf", "name")))
    assert dict(upload.fields) == {"csrf": "tok", "name": "tiny"}
    assert upload.evaluation is None and upload.calibration is None
    assert sorted(p.name for p in folder.iterdir()) == ["model.onnx"]
    moved = upload.moved_to(tmp_path / "elsewhere")
    assert moved.model.path == tmp_path / "elsewhere" / "model.onnx"


@pytest.mark.parametrize(("parts", "message"), [
    ([("csrf", None, b"t"), ("model", "m.onnx", b"x"), ("spec", None, SPEC)], "unexpected part"),
    ([("model", "", b"")], "model' must be a file"),
    ([("model", "m.onnx", b"x"), ("evaluation", "", b"data")], "has data but no filename"),
    ([("name", "n.txt", b"x")], "must be a text field"),
    ([("name", None, b"a"), ("name", None, b"b")], "appears twice"),
    ([("name", None, b"x" * 2000)], "exceeds its limit"),
])
def test_form_parts_refused_when_wrong(tmp_path: Path, parts: list[tuple[str, str | None, bytes]],
                                       message: str) -> None:
    body, ctype = _browser_form(parts)
    folder = tmp_path / "job"
    folder.mkdir()
    fields = () if parts[0][0] == "csrf" else ("name",)
    with pytest.raises((InvalidInput, PayloadTooLarge), match=message):
        asyncio.run(receive_upload(_chunks(body), ctype, len(body), folder, UploadLimits(),
                                   fields))
