"""CPU time of a process tree from ``/proc``: what a gateway (its Python process and
every descendant, HAProxy included) spent, split by process name."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ProcStat:
    pid: int
    ppid: int
    name: str
    ticks: int  # utime + stime + cutime + cstime


def parse_proc_stat(text: str) -> ProcStat:
    """One /proc/<pid>/stat line; the command name may hold spaces and parentheses."""
    head, _, rest = text.rpartition(")")
    pid, _, name = head.partition("(")
    fields = rest.split()  # fields[0] is field 3 (state) of proc(5)
    utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
    return ProcStat(int(pid), int(fields[1]), name, utime + stime + cutime + cstime)


def process_tree(root: int, stats: Sequence[ProcStat]) -> list[ProcStat]:
    """``root`` and all its descendants (by parent pid), root first."""
    children: dict[int, list[ProcStat]] = {}
    for s in stats:
        children.setdefault(s.ppid, []).append(s)
    found = [s for s in stats if s.pid == root][:1]
    for s in found:  # grows while iterating: breadth first
        found.extend(c for c in children.get(s.pid, ()) if c not in found)
    return found


def tree_ticks(root: int, stats: Sequence[ProcStat]) -> int:
    """CPU ticks of ``root`` and all its descendants. Children that ended and were reaped
    are in their parent's cutime/cstime, so a difference of two readings counts each
    tick once, also across a child that exited between them (e.g. an old HAProxy worker
    after a reload)."""
    return sum(s.ticks for s in process_tree(root, stats))


def ticks_by_name(root: int, stats: Sequence[ProcStat]) -> Counter[str]:
    """:func:`tree_ticks` split by process name (a reaped child's ticks are its parent's)."""
    totals: Counter[str] = Counter()
    for s in process_tree(root, stats):
        totals[s.name] += s.ticks
    return totals


def read_proc_stats() -> list[ProcStat]:
    stats = []
    for path in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):  # it may just have ended
            stats.append(parse_proc_stat(path.read_text()))
    return stats


def cpu_us_per_request(ticks: int, requests: int, clock_ticks_per_s: int) -> float:
    return ticks * 1e6 / clock_ticks_per_s / requests if requests else float("nan")


def component_ticks(stats: Sequence[ProcStat], gateway: int, members: Sequence[int],
                    own: int) -> dict[str, int]:
    """CPU ticks of a gateway's parts and its members, from one reading: the control
    plane (the gateway's own process), its data-plane replica (its Python children),
    HAProxy (every ``haproxy`` process in its tree), the members (each Triton's tree:
    its Python-backend stubs, reaped ones included) and ``own`` (the load generator's
    process). A difference of two readings is what each spent between them."""
    tree = process_tree(gateway, stats)
    return {
        "members": sum(tree_ticks(pid, stats) for pid in members),
        "control_plane": sum(s.ticks for s in tree if s.pid == gateway),
        "replica": sum(s.ticks for s in tree if s.pid != gateway and s.name.startswith("python")),
        "haproxy": sum(s.ticks for s in tree if s.name == "haproxy"),
        "load_generator": sum(s.ticks for s in stats if s.pid == own),
    }

