"""The harness's HAProxy folder for a gateway (infergate/processes.py): beside its log,
or, where that path is too long for HAProxy's unix sockets, a short folder linked from
there (a deep pytest folder once made the gateway use its default folder, and tests
reading the one beside the log found nothing)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from gateway.haproxy.snapshot import sockets_fit
from infergate import processes
from infergate.processes import haproxy_beside


def test_a_short_log_folder_holds_haproxys_files_itself() -> None:
    log_dir = Path(tempfile.gettempdir())  # (a pytest tmp_path may itself be too deep)
    run_dir = haproxy_beside(log_dir, 1)
    assert run_dir == log_dir.resolve() / "haproxy-1" and not run_dir.is_symlink()


def test_a_deep_log_folder_links_to_a_short_one_kept_for_a_restart(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 80)
    deep.mkdir()
    assert not sockets_fit(deep / "haproxy-8000")
    run_dir = haproxy_beside(deep, 8000)
    assert run_dir == deep / "haproxy-8000" and run_dir.is_symlink()
    real = run_dir.resolve()
    assert sockets_fit(real) and real.is_dir() and real in processes._SHORT_RUN_DIRS
    (run_dir / "haproxy.cfg").write_text("global\n")  # read through the link
    assert (real / "haproxy.cfg").read_text() == "global\n"
    # a gateway started again on the same ports finds the same folder, files and all
    assert haproxy_beside(deep, 8000) == run_dir and run_dir.resolve() == real
    processes._remove_short_run_dirs()  # (what the process's exit does)
    assert not real.exists()
