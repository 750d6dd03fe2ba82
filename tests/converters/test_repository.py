"""Two writers publishing the same version at once (two ``infergate up`` exporting the
sample into one repository): the same files are success for both, other files a clear
conflict; nothing half-written either way. The race is laid out in order, without
threads: both stage before either publishes."""

from __future__ import annotations

from pathlib import Path

import pytest

from converters.repository import (
    StagedVersion,
    VersionConflict,
    existing_versions,
    next_version,
    stage_version,
)
from tests.converters.conftest import tree


def _fill(staged: StagedVersion, model: bytes, config: str = 'name: "m"\n') -> None:
    (staged.version_dir / "model.onnx").write_bytes(model)
    (staged.model_dir / "config.pbtxt").write_text(config)


@pytest.mark.parametrize("existing_model", [False, True])
def test_second_writer_of_the_same_version_succeeds_when_its_files_are_the_same(
        tmp_path: Path, existing_model: bool) -> None:
    repo = tmp_path / "repo"
    if existing_model:  # both race for version 2 of a model that has a version 1
        with stage_version(repo, "m") as first:
            _fill(first, b"v1")
    with stage_version(repo, "m") as a, stage_version(repo, "m") as b:
        assert a.version == b.version
        _fill(a, b"same")
        _fill(b, b"same")
    # b published first (the inner block exits first), then a found it: success
    assert existing_versions(repo, "m") == ([1, 2] if existing_model else [1])
    assert (repo / "m" / str(a.version) / "model.onnx").read_bytes() == b"same"


def test_second_writer_gets_a_one_line_conflict_when_its_files_differ(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    with (pytest.raises(VersionConflict) as info,  # noqa: PT012 - the race is the block
          stage_version(repo, "m") as a, stage_version(repo, "m") as b):
        _fill(a, b"mine")
        _fill(b, b"theirs", 'name: "m"\nmax_batch_size: 8\n')
    message = str(info.value)
    assert "\n" not in message and "version 1 of m" in message
    assert "config.pbtxt, 1 differ" in message
    assert isinstance(info.value, FileExistsError)
    published = tree(repo)
    assert existing_versions(repo, "m") == [1]
    assert (repo / "m" / "1" / "model.onnx").read_bytes() == b"theirs"  # b's, first
    assert not any(p.name.startswith(".") for p in (repo / "m").iterdir())
    assert tree(repo) == published


def test_next_version_is_at_least_the_floor_and_above_the_versions_on_disk(
        tmp_path: Path) -> None:
    """The lifecycle passes one above every number it issued (a removed version 3 is
    not published again); without a floor (``infergate convert``) today's rule holds."""
    repo = tmp_path / "repo"
    assert next_version(repo, "m") == 1
    for _ in range(2):
        with stage_version(repo, "m") as staged:
            _fill(staged, b"v")
    assert next_version(repo, "m") == 3  # no floor: one above the disk
    assert next_version(repo, "m", min_version=4) == 4  # 3 was issued, then removed
    assert next_version(repo, "m", min_version=2) == 3  # the disk wins when higher
    with stage_version(repo, "m", min_version=5) as staged:
        assert staged.version == 5
        _fill(staged, b"v5")
    assert existing_versions(repo, "m") == [1, 2, 5]
    assert next_version(repo, "m") == 6
