"""The lifecycle's edits to the model repository beyond publishing (which the converter
does atomically): pin ``config.pbtxt`` to the serving version, remove a version
(retention, delete, a failed deploy), and clear what a killed worker left in staging.

Removals rename first and delete after: Triton never sees half a version folder.
Triton keeps one ``config.pbtxt`` per model while each version was published with its
own, so the lifecycle stores every version's config text (SQLite) and writes the
serving one back, pinned with ``version_policy { specific { versions: [v] } }``: a
Triton that restarts and loads the model from disk serves exactly the serving version.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format

from converters.repository import existing_versions, validate_model_name
from converters.triton_config import parse_model_config
from gateway.files import write_atomically

__all__ = ["RepositorySnapshot", "clear_staging_leftovers", "existing_versions",
           "pinned_config_text", "remove_model", "remove_version", "restore", "snapshot",
           "warmup_files", "write_config"]


@dataclass(frozen=True)
class RepositorySnapshot:
    """What the repository held for a model before a job touched it."""

    versions: tuple[int, ...]
    config_text: str | None


def snapshot(repo: Path, model: str) -> RepositorySnapshot:
    config = repo / model / "config.pbtxt"
    return RepositorySnapshot(tuple(existing_versions(repo, model)),
                              config.read_text() if config.is_file() else None)


def restore(repo: Path, model: str, before: RepositorySnapshot,
            configs: Mapping[int, str]) -> list[int]:
    """Put the model's folder back as ``before`` found it (after a failed job): versions
    added since go, with their warm-up files, and ``config.pbtxt`` is restored. Also
    clears the job's staging leftovers. ``configs``: version -> config it was published
    with, where known. Returns the versions removed."""
    clear_staging_leftovers(repo, model)
    added = [v for v in existing_versions(repo, model) if v not in before.versions]
    if not added:
        return []
    if before.config_text is None and not before.versions:
        remove_model(repo, model)
        return added
    kept = [text for v, text in configs.items() if v not in added]
    if before.config_text is not None:
        kept.append(before.config_text)
    for version in added:
        remove_version(repo, model, version, configs.get(version), kept)
    if before.config_text is not None:
        write_config(repo, model, before.config_text)
    return added


def _trash(repo: Path) -> Path:
    # A sibling of the repository: same file system (rename is atomic), never indexed.
    root = repo.resolve().parent / f".{repo.resolve().name}.trash"
    root.mkdir(parents=True, exist_ok=True)
    return root


def _discard(repo: Path, path: Path) -> None:
    if not path.exists():
        return
    target = Path(tempfile.mkdtemp(prefix=f"{path.name}.", dir=_trash(repo)))
    os.rename(path, target / path.name)
    shutil.rmtree(target, ignore_errors=True)


def pinned_config_text(config_text: str, version: int) -> str:
    config = parse_model_config(config_text)
    config.version_policy.Clear()
    config.version_policy.specific.versions.append(version)
    return text_format.MessageToString(config)


def write_config(repo: Path, model: str, text: str) -> None:
    """Replace ``<repo>/<model>/config.pbtxt`` atomically."""
    write_atomically(repo / validate_model_name(model) / "config.pbtxt", text)


def warmup_files(config_text: str) -> set[str]:
    """Files under ``warmup/`` that a config's ``model_warmup`` reads."""
    config = parse_model_config(config_text)
    return {entry.input_data_file for warm in config.model_warmup
            for entry in warm.inputs.values() if entry.input_data_file}


def remove_version(repo: Path, model: str, version: int, config_text: str | None,
                   kept_configs: Iterable[str] = ()) -> None:
    """Remove a version folder and the warm-up files only it used."""
    folder = repo / validate_model_name(model)
    _discard(repo, folder / str(version))
    if config_text is None:
        return
    still_used: set[str] = set()
    for text in kept_configs:
        still_used |= warmup_files(text)
    for name in warmup_files(config_text) - still_used:
        path = (folder / "warmup" / name).resolve()
        if path.is_relative_to((folder / "warmup").resolve()):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def remove_model(repo: Path, model: str) -> None:
    _discard(repo, repo / validate_model_name(model))


def clear_staging_leftovers(repo: Path, model: str) -> list[Path]:
    """Staging folders of ``model`` left by a worker that was killed before it could
    clean up (the converter stages in ``.<repo>.staging/<model>.*``). Call only while no
    job for ``model`` runs."""
    root = repo.resolve().parent / f".{repo.resolve().name}.staging"
    if not root.is_dir():
        return []
    # tempfile.mkdtemp(prefix=f"{model}."): the prefix plus 8 random characters
    pattern = re.compile(re.escape(validate_model_name(model)) + r"\.[a-z0-9_]{8}")
    removed = []
    for path in root.iterdir():
        if pattern.fullmatch(path.name):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
