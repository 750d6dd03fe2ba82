"""CPU ticks of a process tree, read from /proc."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from loadtests import proc_cpu as pc


def stat_line(pid: int, comm: str, ppid: int, utime: int, stime: int, cutime: int = 0,
              cstime: int = 0) -> str:
    return (f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194560 100 0 0 0 "
            f"{utime} {stime} {cutime} {cstime} 20 0 3 0 12345 1000 200\n")



def test_parse_proc_stat_sums_four_tick_fields_when_the_name_has_parentheses() -> None:
    s = pc.parse_proc_stat(stat_line(42, "haproxy (worker) x", 7, 10, 5, 3, 1))
    assert (s.pid, s.ppid, s.name, s.ticks) == (42, 7, "haproxy (worker) x", 19)


def test_parse_proc_stat_reads_this_process_when_given_the_real_file() -> None:
    s = pc.parse_proc_stat(Path(f"/proc/{os.getpid()}/stat").read_text())
    assert s.pid == os.getpid() and s.ppid == os.getppid() and s.ticks >= 0


def test_tree_ticks_counts_live_descendants_but_not_other_processes() -> None:
    stats = [pc.ProcStat(12, 11, "haproxy", 300),  # worker: a grandchild, listed first
             pc.ProcStat(10, 1, "python", 100),    # the gateway
             pc.ProcStat(11, 10, "haproxy", 20),   # master
             pc.ProcStat(20, 1, "tritonserver", 999),  # not the gateway's
             pc.ProcStat(21, 20, "stub", 50)]
    assert [s.pid for s in pc.process_tree(10, stats)] == [10, 11, 12]
    assert pc.tree_ticks(10, stats) == 420
    assert pc.ticks_by_name(10, stats) == {"python": 100, "haproxy": 320}
    assert pc.tree_ticks(99, stats) == 0


def test_tree_ticks_difference_keeps_a_reaped_child_once_when_it_exited_between_reads() -> None:
    before = [pc.ProcStat(10, 1, "gw", 100), pc.ProcStat(11, 10, "m", 40),
              pc.ProcStat(12, 11, "w", 30)]
    # worker 12 burnt 5 more ticks, exited and was reaped: its 35 land in 11's cutime
    after = [pc.ProcStat(10, 1, "gw", 110), pc.ProcStat(11, 10, "m", 40 + 2 + 35),
             pc.ProcStat(13, 11, "w", 7)]  # its replacement
    assert pc.tree_ticks(10, after) - pc.tree_ticks(10, before) == 10 + 2 + 5 + 7


def test_tree_ticks_sees_a_live_child_burning_cpu_when_read_from_proc() -> None:
    clock = os.sysconf("SC_CLK_TCK")
    before = pc.tree_ticks(os.getpid(), pc.read_proc_stats())
    burn = ("import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
            "print('burnt', flush=True)\ntime.sleep(30)\n")
    child = subprocess.Popen([sys.executable, "-c", burn], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "burnt"
        after = pc.tree_ticks(os.getpid(), pc.read_proc_stats())
    finally:
        child.kill()
        child.wait(timeout=10)
    assert after - before >= 0.25 * clock  # alive: in no cutime, only in its own stat


def test_cpu_us_per_request_divides_ticks_by_requests_when_clock_is_100hz() -> None:
    assert pc.cpu_us_per_request(150, 30_000, 100) == pytest.approx(50.0)
    assert pc.cpu_us_per_request(1, 0, 100) != pc.cpu_us_per_request(1, 0, 100)  # nan


def test_component_ticks_splits_a_gateway_its_members_and_the_load_generator() -> None:
    stats = [pc.ProcStat(10, 1, "python", 100),     # the gateway (control plane)
             pc.ProcStat(11, 10, "python", 40),     # its data-plane replica
             pc.ProcStat(12, 10, "haproxy", 5),     # HAProxy's master
             pc.ProcStat(13, 12, "haproxy", 300),   # its worker
             pc.ProcStat(20, 1, "tritonserver", 70),  # a member (its reaped stubs in here)
             pc.ProcStat(21, 20, "triton_python_b", 500),  # a stub
             pc.ProcStat(30, 1, "tritonserver", 9),   # another member
             pc.ProcStat(40, 1, "python", 60),      # the benchmark
             pc.ProcStat(50, 1, "python", 1000)]    # nothing of theirs
    assert pc.component_ticks(stats, 10, [20, 30], 40) == {
        "members": 579, "control_plane": 100, "replica": 40, "haproxy": 305,
        "load_generator": 60}
