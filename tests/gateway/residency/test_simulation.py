"""The whole residency (mechanism and policy) over bench_residency's shifting trace in
virtual time (:mod:`tests.gateway.residency.simulate`): no request lost where the
budgets hold half the models, at most 1 % where they hold a quarter (1.5 % on a host
whose loads share its cores and whose evicted models take a second to exit), and the
accounted use never over a budget at any transition. Where they hold a quarter, a cold
miss no longer evicts the hot: every phase's hit ratio stays within 0.2 of the best
fixed placement's (it fell 0.3 short when misses took the coldest main models)."""

from __future__ import annotations

import pytest

from tests.gateway.residency.simulate import MEASURED, run


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
    assert all(hits >= best - 0.2 for hits, best, _ in result.phases), result.phases


def test_few_fail_when_a_quarter_budget_meets_slow_loads_and_exits() -> None:
    """At most 1.5 %: the simulator now has a miss's waiters reach the member 0.3 s after
    its load (the real gateway settles the snapshot on every replica first), and fails
    them when their model was evicted meanwhile. The residency before :data:`WAITERS_S`
    failed 19 % of requests there (seeds 1-3, 0.8 cores), 7.5 % with 2 cores."""
    result = run(0.25, seed=1, cores=1.5, release_s=1.0)
    assert result.over_budget == 0
    assert result.failures <= 0.015 * result.requests, result.failed
    assert "evicted before its waiters reached it" not in result.failed


def test_no_load_is_evicted_before_its_waiters_when_loads_take_what_they_took_here() -> None:
    """Loads and exits as this host's members took them in the benchmark (about three
    times the plain model's): no model leaves before the waiters of its load reach it,
    the budget holds, and failures stay near what this code does there (0.5 % at seed 1,
    0.2 % at seed 2 since room goes to the misses waiting before a new one; 2.7 % at
    seed 1 with the room of 64 it had before, when the benchmark itself failed 1.9 % and
    2.2 % in two runs).
    A first version of the room a placed miss's victims free being that miss's failed
    the first: it counted the victims' bytes twice, the member read over its budget, and
    the round evicted models the instant they became resident."""
    result = run(0.25, seed=1, host=MEASURED)
    assert result.over_budget == 0
    assert "evicted before its waiters reached it" not in result.failed, result.failed
    assert result.failures <= 0.04 * result.requests, result.failed
