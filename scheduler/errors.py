"""The scheduler's one error hierarchy and its one mapping to HTTP statuses and exit codes.

The service and the CLI both use :func:`http_status` / :func:`exit_code`; neither keeps
its own table. Only these errors are answered on purpose; anything else is a bug and
becomes a 500 (service) or a traceback (CLI).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class InputProblem:
    """One thing wrong with an input, at ``loc`` (path of keys and list indexes)."""

    loc: tuple[str | int, ...]
    msg: str

    @property
    def where(self) -> str:
        out = ""
        for part in self.loc:
            out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
        return out or "<root>"


class SchedulerError(Exception):
    """Root of every error the scheduler raises on purpose."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidPlanningInput(SchedulerError):
    """The fleet, the pools or the options are malformed or contradict each other."""

    def __init__(self, problems: Sequence[InputProblem]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(f"{p.where}: {p.msg}" for p in self.problems[:5]))


class PlanNotFound(SchedulerError):
    """No plan with this id is stored."""


class PlanRejected(SchedulerError):
    """The validator found a violation in a plan the planner produced (a planner bug)."""


class ApplyFailed(SchedulerError):
    """The cluster refused an object, or writing the manifests failed."""


class UnsupportedCluster(SchedulerError):
    """The cluster is set up in a way the scheduler cannot plan for (e.g. the device
    plugin's single MIG strategy)."""


_TABLE: dict[type[SchedulerError], tuple[int, int]] = {
    InvalidPlanningInput: (422, 2),
    PlanNotFound: (404, 3),
    ApplyFailed: (502, 4),
    PlanRejected: (500, 5),
    UnsupportedCluster: (409, 6),
    SchedulerError: (500, 1),
}


def _row(error: SchedulerError) -> tuple[int, int]:
    for cls in type(error).__mro__:
        if cls in _TABLE:
            return _TABLE[cls]
    return _TABLE[SchedulerError]


def http_status(error: SchedulerError) -> int:
    return _row(error)[0]


def exit_code(error: SchedulerError) -> int:
    return _row(error)[1]
