"""Atomic writes into a Triton model repository.

Layout written (Triton's, plus our metadata)::

    model_repo/<name>/config.pbtxt
    model_repo/<name>/warmup/<files>            # model_warmup input_data_file targets
    model_repo/<name>/<version>/model.onnx      # or model.plan / model.py
    model_repo/<name>/<version>/metadata.json   # provenance, precision, accuracy

A version is staged completely in a sibling folder on the same file system and published
with ``rename``: a new model is one rename; a new version of an existing model is the
version folder's rename followed by replacing ``config.pbtxt`` (rolled back if the second
step fails). Any failure before publishing leaves the repository exactly as it was.
Existing versions are never overwritten: each publish takes the next integer above those
on disk, and at least ``min_version`` (the gateway's lifecycle passes one above every
number it ever issued for the model, so a number whose version was removed is never
published again; ``infergate convert`` alone passes 1). Two writers
that staged the same version at once (two ``infergate up`` exporting the sample): the
second finds the first's version there; the same files are its own success, other files
a :class:`VersionConflict`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from converters.errors import ConversionError

MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class VersionConflict(ConversionError, FileExistsError):
    """Another writer published the same version number with other contents."""


class InvalidModelName(ConversionError, ValueError):
    """A model name that is not a safe single path component."""


def validate_model_name(name: str) -> str:
    if not MODEL_NAME_RE.fullmatch(name) or name in {".", ".."}:
        raise InvalidModelName(
            f"invalid model name {name!r}: use 1-64 characters from A-Z a-z 0-9 _ . - "
            "starting with a letter or digit (no path separators)"
        )
    return name


@dataclass(frozen=True)
class StagedVersion:
    """A version being assembled: write files into ``version_dir`` and ``model_dir``."""

    name: str
    version: int
    model_dir: Path  # staged <name>/ folder (config.pbtxt, warmup/)
    version_dir: Path  # staged <name>/<version>/ folder


def existing_versions(repo: Path, name: str) -> list[int]:
    model_dir = repo / name
    if not model_dir.is_dir():
        return []
    return sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit())


def next_version(repo: Path, name: str, min_version: int = 1) -> int:
    """One above the versions of ``name`` on disk, and at least ``min_version``."""
    versions = existing_versions(repo, name)
    return max((versions[-1] + 1) if versions else 1, min_version)


def _staging_root(repo: Path) -> Path:
    # A sibling of the repository (same file system, so rename is atomic) that Triton's
    # repository index never lists.
    root = repo.resolve().parent / f".{repo.resolve().name}.staging"
    root.mkdir(parents=True, exist_ok=True)
    return root


@contextlib.contextmanager
def stage_version(repo: Path, name: str, min_version: int = 1) -> Iterator[StagedVersion]:
    """Yield a staging area for the next version of ``name`` (:func:`next_version`);
    publish it on clean exit.

    An exception inside the ``with`` block discards the staging area and re-raises.
    """
    validate_model_name(name)
    repo.mkdir(parents=True, exist_ok=True)
    version = next_version(repo, name, min_version)
    tmp = Path(tempfile.mkdtemp(prefix=f"{name}.", dir=_staging_root(repo)))
    try:
        staged = StagedVersion(name, version, tmp / name, tmp / name / str(version))
        staged.version_dir.mkdir(parents=True)
        current = repo / name
        if (current / "warmup").is_dir():
            shutil.copytree(current / "warmup", staged.model_dir / "warmup")
        yield staged
        _publish(repo, staged)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _publish(repo: Path, staged: StagedVersion) -> None:
    target = repo / staged.name
    if not (staged.model_dir / "config.pbtxt").is_file():
        raise FileNotFoundError("staged model has no config.pbtxt")
    if not target.exists():
        try:
            os.rename(staged.model_dir, target)
            return
        except OSError:
            if not target.is_dir():  # not another writer's model appearing meanwhile
                raise
    final_version_dir = target / str(staged.version)
    if final_version_dir.exists():
        _same_or_conflict(staged, target)
        return
    os.rename(staged.version_dir, final_version_dir)
    try:
        _replace_tree(staged.model_dir / "warmup", target / "warmup")
        os.replace(staged.model_dir / "config.pbtxt", target / "config.pbtxt")
    except BaseException:
        shutil.rmtree(final_version_dir, ignore_errors=True)
        raise


def _same_or_conflict(staged: StagedVersion, target: Path) -> None:
    """Another writer published ``staged.version`` first: the same files are success."""
    differs = [name for name in ("config.pbtxt", "warmup", str(staged.version))
               if _tree_bytes(staged.model_dir / name) != _tree_bytes(target / name)]
    if differs:
        raise VersionConflict(
            f"version {staged.version} of {staged.name} was published meanwhile by another "
            f"writer, with other contents ({', '.join(differs)} differ); ask again for the "
            "next version")


def _tree_bytes(path: Path) -> dict[str, bytes]:
    """Every file below ``path`` (or ``path`` itself) by relative name, with its bytes."""
    if path.is_file():
        return {"": path.read_bytes()}
    if not path.is_dir():
        return {}
    return {str(f.relative_to(path)): f.read_bytes() for f in sorted(path.rglob("*"))
            if f.is_file()}


def _replace_tree(source: Path, target: Path) -> None:
    if not source.is_dir():
        return
    old = target.with_name(f".{target.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        os.rename(target, old)
    os.rename(source, target)
    shutil.rmtree(old, ignore_errors=True)


def write_metadata(version_dir: Path, metadata: dict[str, Any]) -> None:
    (version_dir / "metadata.json").write_text(json.dumps(metadata, indent=2, sort_keys=True))
