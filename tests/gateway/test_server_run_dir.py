"""Where ``gateway serve`` keeps HAProxy's files: a restart of the same command must find
the folder of the HAProxy a crash left serving, and no other user may have made it."""

from __future__ import annotations

import os
import stat
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from gateway.server import GatewaySettings, haproxy_run_dir

SETTINGS = GatewaySettings(http_port=18000, grpc_port=18001)


@pytest.fixture(autouse=True)
def temporary_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_run_dir_is_the_same_for_the_same_ports_when_none_given(
    temporary_folder: Path,
) -> None:
    first = haproxy_run_dir(SETTINGS)
    assert first == haproxy_run_dir(SETTINGS) and first.parent == temporary_folder
    assert stat.S_IMODE(first.stat().st_mode) == 0o700
    assert first != haproxy_run_dir(replace(SETTINGS, http_port=18002))


def test_run_dir_is_refused_when_others_can_write_the_default_folder() -> None:
    folder = haproxy_run_dir(SETTINGS)
    os.chmod(folder, 0o777)  # as if another user had made it first
    with pytest.raises(ValueError, match="not a private folder"):
        haproxy_run_dir(SETTINGS)


def test_run_dir_is_the_given_one_unless_its_socket_paths_are_too_long(
    temporary_folder: Path,
) -> None:
    given = temporary_folder / "run"
    assert haproxy_run_dir(replace(SETTINGS, haproxy_run_dir=given)) == given
    too_long = temporary_folder / ("x" * 100)
    assert haproxy_run_dir(replace(SETTINGS, haproxy_run_dir=too_long)) == \
        haproxy_run_dir(SETTINGS)
    with pytest.raises(ValueError, match="too long"):  # HAProxy elsewhere: no fallback
        haproxy_run_dir(replace(SETTINGS, haproxy_run_dir=too_long, haproxy_external=True))
