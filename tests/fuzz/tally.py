"""What the fuzz suites count and check: every answer, by surface and data plane, and
whether it is a server fault for a client's mistake; the gateway's process tree (the
Python process and HAProxy) before and after, for memory and open files.

A server fault is HTTP 5xx or gRPC INTERNAL / UNKNOWN / DATA_LOSS / UNAVAILABLE /
DEADLINE_EXCEEDED (Triton is up and the gateway unloaded while fuzzing, so none is a
real upstream failure). The one 5xx that is the right answer: 501 / UNIMPLEMENTED for
what the gateway does not offer (registering shared memory; uploads on a gateway
without a ``lifecycle:`` section), with the error table's message.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import psutil

LONG = os.environ.get("INFERGATE_FUZZ_LONG") == "1"
GRPC_FAULTS = frozenset({"INTERNAL", "UNKNOWN", "DATA_LOSS", "UNAVAILABLE", "DEADLINE_EXCEEDED"})
UNSUPPORTED_MARKS = ("not supported through the gateway", "uploads are not enabled")


def cases(default: int) -> int:
    """The number of cases for a default run; ten times as many with
    ``INFERGATE_FUZZ_LONG=1``."""
    return default * 10 if LONG else default


def is_fault(answer: str, message: str = "") -> bool:
    """``answer``: an HTTP status ("400") or a gRPC code name ("INVALID_ARGUMENT")."""
    unsupported = any(mark in message for mark in UNSUPPORTED_MARKS)
    if answer.isdigit():
        status = int(answer)
        return status >= 500 and not (status == 501 and unsupported)
    if answer == "UNIMPLEMENTED":
        return not unsupported
    return answer in GRPC_FAULTS


@dataclass
class Tally:
    """Answers per surface (``surface/plane``); the first few faults kept whole."""

    answers: dict[str, Counter[str]] = field(default_factory=dict)
    faults: list[str] = field(default_factory=list)

    def record(self, surface: str, answer: str | int, message: str = "",
               request: object = None) -> None:
        answer = str(answer)
        self.answers.setdefault(surface, Counter())[answer] += 1
        if is_fault(answer, message) and len(self.faults) < 50:
            self.faults.append(f"{surface}: {answer} {message[:300]!r} for {request!r:.300}")

    def count(self, surface: str) -> int:
        return sum(self.answers.get(surface, Counter()).values())

    def surface_faults(self, surface: str) -> list[str]:
        return [f for f in self.faults if f.startswith(f"{surface}: ")]

    def report(self) -> dict[str, object]:
        return {
            "total": sum(sum(c.values()) for c in self.answers.values()),
            "surfaces": {s: {"cases": sum(c.values()), "answers": dict(sorted(c.items()))}
                         for s, c in sorted(self.answers.items())},
            "faults": self.faults,
        }

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.report(), indent=2))


@dataclass(frozen=True)
class Footprint:
    """Resident memory and open files of a process and all its descendants."""

    rss_bytes: int
    open_fds: int

    @classmethod
    def of(cls, pid: int) -> Footprint:
        root = psutil.Process(pid)
        rss = fds = 0
        for proc in [root, *root.children(recursive=True)]:
            try:
                rss += proc.memory_info().rss
                fds += proc.num_fds()
            except psutil.NoSuchProcess:
                continue
        return cls(rss, fds)

    def within(self, baseline: Footprint, rss_slack: float = 1.5,
               rss_extra: int = 96 << 20, fd_extra: int = 48) -> bool:
        return (self.rss_bytes <= baseline.rss_bytes * rss_slack + rss_extra
                and self.open_fds <= baseline.open_fds + fd_extra)
