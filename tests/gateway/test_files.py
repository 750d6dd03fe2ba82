"""Files written whole or not at all (gateway/files.py)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gateway import files
from gateway.files import write_atomically


def test_two_writers_of_one_file_at_the_same_moment_both_succeed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The other writer finishes while this one is between its write and its move (the
    data-plane replica's follower and its leases' watch saving one snapshot): with one
    temporary file for both, the first move took the second's file away."""
    target = tmp_path / "snapshot.json"
    real_replace, nested = os.replace, list[bool]()

    def replace_after_another(src: str, dst: str) -> None:
        if not nested:
            nested.append(True)
            write_atomically(target, "second")  # all of it, in between
        real_replace(src, dst)

    monkeypatch.setattr(files.os, "replace", replace_after_another)
    write_atomically(target, "first")
    assert target.read_text() == "first"  # the last to finish wins
    assert sorted(p.name for p in tmp_path.iterdir()) == ["snapshot.json"]  # no leftovers


def test_the_mode_is_the_files_from_its_first_byte(tmp_path: Path) -> None:
    secret, plain = tmp_path / "layout.json", tmp_path / "haproxy.cfg"
    write_atomically(secret, "{}", mode=0o600)
    write_atomically(plain, "global")
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert stat.S_IMODE(plain.stat().st_mode) == 0o644


def test_a_failed_write_leaves_the_file_before_and_no_temporary(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "agents.json"
    write_atomically(target, "before")

    def full_disk(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "replace", full_disk)
    with pytest.raises(OSError):
        write_atomically(target, "after")
    assert target.read_text() == "before"
    assert [p.name for p in tmp_path.iterdir()] == ["agents.json"]
