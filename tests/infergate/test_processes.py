"""The harness's gateway (infergate/processes.py): its HAProxy folder beside its log,
or, where that path is too long for HAProxy's unix sockets, a short folder linked from
there (a deep pytest folder once made the gateway use its default folder, and tests
reading the one beside the log found nothing); started again on other ports when one
of its free ports was taken before it bound it (a real gateway process)."""

from __future__ import annotations

import socket
import tempfile
from pathlib import Path

import httpx
import pytest

from gateway.haproxy.snapshot import sockets_fit
from gateway.netaddr import free_ports
from infergate import processes
from infergate.processes import haproxy_beside
from infergate.triton.local import TritonEndpoints


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


def test_a_gateway_whose_free_port_was_taken_before_it_bound_starts_on_other_ones(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process may take a port between ``free_ports()`` and the gateway's bind:
    the gateway exits saying so, and is started again on other ports (any other failure
    is raised at once)."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    picks = iter([[taken.getsockname()[1], free_ports(1)[0]]])
    monkeypatch.setattr(processes, "free_ports",
                        lambda count: next(picks, None) or free_ports(count))
    member = TritonEndpoints("127.0.0.1", *free_ports(3))  # nothing there: live, not ready
    pools = processes.pools_yaml(tmp_path / "pools.yaml", {"p": [member]})
    with taken, processes.run_gateway(pools, tmp_path, data_plane="python",
                                      until="live") as gw:
        assert gw.http_port != taken.getsockname()[1]
        logs = sorted(tmp_path.glob("gateway-*.log"))
        assert len(logs) == 2  # the first start's words, then this one's
        assert any(processes.port_taken(log.read_text()) for log in logs)
        assert httpx.get(f"http://{gw.http_url}/v2/health/live").status_code == 200


def test_a_gateway_that_fails_to_start_for_another_reason_is_not_started_again(
        tmp_path: Path) -> None:
    (tmp_path / "pools.yaml").write_text("pools: [{name: p\n")  # not YAML: refused
    with pytest.raises(processes.GatewayNotStarted), \
            processes.run_gateway(tmp_path / "pools.yaml", tmp_path, data_plane="python",
                                  until="live"):
        pass
    assert len(list(tmp_path.glob("gateway-*.log"))) == 1
