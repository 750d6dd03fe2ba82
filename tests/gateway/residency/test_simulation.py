"""The whole residency (mechanism and policy) over bench_residency's shifting trace in
virtual time (:mod:`tests.gateway.residency.simulate`): no request lost where the
budgets hold half the models, at most 1 % where they hold a quarter, and the accounted
use never over a budget at any transition."""

from __future__ import annotations

import pytest

from tests.gateway.residency.simulate import run


def test_no_request_fails_and_the_budget_holds_when_budgets_hold_half_the_models() -> None:
    result = run(0.5, seed=1)
    assert result.failures == 0, result.failed
    assert result.over_budget == 0
    assert all(hits >= best - 0.1 for hits, best, _ in result.phases), result.phases


@pytest.mark.parametrize("seed", [1, 2])
def test_at_most_one_percent_fails_when_budgets_hold_a_quarter_of_the_models(seed: int
                                                                              ) -> None:
    result = run(0.25, seed=seed)
    assert result.over_budget == 0
    assert result.failures <= 0.01 * result.requests, result.failed
