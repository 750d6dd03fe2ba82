from __future__ import annotations

import pytest

from scheduler.errors import (
    ApplyFailed,
    InputProblem,
    InvalidPlanningInput,
    PlanNotFound,
    PlanRejected,
    SchedulerError,
    UnsupportedCluster,
    exit_code,
    http_status,
)

ERRORS = [
    (InvalidPlanningInput([InputProblem(("pools", 0), "bad")]), 422, 2),
    (PlanNotFound("x"), 404, 3),
    (ApplyFailed("x"), 502, 4),
    (PlanRejected("x"), 500, 5),
    (UnsupportedCluster("single strategy"), 409, 6),
    (SchedulerError("x"), 500, 1),
]


def test_error_table_covers_every_subclass_when_listed() -> None:
    assert {type(e) for e, _, _ in ERRORS} == {SchedulerError, *SchedulerError.__subclasses__()}


@pytest.mark.parametrize(("error", "status", "code"), ERRORS, ids=lambda v: type(v).__name__)
def test_http_status_and_exit_code_come_from_one_table_when_mapped(
    error: SchedulerError, status: int, code: int
) -> None:
    assert (http_status(error), exit_code(error)) == (status, code)
