"""X-Request-Timeout-Ms: one rule, read by both planes; and the rule that sheds a request
its pool cannot answer within its deadline."""

from __future__ import annotations

import re

import pytest

from gateway.errors import InvalidInput
from gateway.policy.deadline import (
    HOPELESS,
    HTTP_TIMEOUT_PATTERN,
    STREAM_GRACE_MS,
    expected_ms,
    given_up_at_deadline,
    grace_s,
    hopeless,
    http_deadline_s,
    service_quantum,
)


@pytest.mark.parametrize(("value", "seconds"), [
    (None, None), ("1", 0.001), ("250", 0.25), ("999999999", 999999.999)])
def test_deadline_read_when_whole_positive_milliseconds(value: str | None,
                                                        seconds: float | None) -> None:
    assert http_deadline_s(value) == seconds


@pytest.mark.parametrize("value", ["", "0", "-1", "1.5", "1e3", "nan", "inf", " 5", "05",
                                   "1000000000", "soon", "٣"])
def test_deadline_refused_when_not_whole_positive_milliseconds(value: str) -> None:
    with pytest.raises(InvalidInput, match="X-Request-Timeout-Ms must be a whole number"):
        http_deadline_s(value)
    # HAProxy matches the same pattern (PCRE: \d is not used, so no other digits)
    assert not re.fullmatch(HTTP_TIMEOUT_PATTERN, value)


# service us, load (without the request), capacity, drain us a request -> expected ms
EXPECTED = [
    (20_000, 0, 1, 20_000, 20),  # alone: its own service time
    (20_000, 1, 1, 20_000, 40),  # one ahead in a pool that executes one at a time
    (20_000, 3, 4, 5_000, 20),  # the pool takes 4 at once: no wait
    (20_000, 4, 4, 5_000, 25),  # the fifth waits for one request's worth of throughput
    (20_000, 11, 4, 5_000, 60),  # eight ahead beyond the four at work
    (40_000, 11, 4, 1_000, 48),  # batches: 1,000 answers/s drain eight in 8 ms
    (900, 0, 8, 100, 0),  # under a millisecond: HAProxy's resolution
    (20_000, 5, 0, 20_000, 120),  # a capacity of 0 counts as 1
]


@pytest.mark.parametrize(("service_us", "load", "capacity", "drain_us", "ms"), EXPECTED)
def test_expected_time_is_the_service_time_plus_the_wait_beyond_capacity(
        service_us: int, load: int, capacity: int, drain_us: int, ms: int) -> None:
    assert expected_ms(service_us, load, capacity, drain_us) == ms


def test_hopeless_only_when_expected_beyond_nine_tenths_of_the_deadline() -> None:
    # beyond 9/10 of the deadline: the rest is for what the estimate leaves out
    assert hopeless(20, 20) and hopeless(22, 20) and not hopeless(23, 20)
    assert not hopeless(1000, 0) and not hopeless(10, 9) and hopeless(9, 9)
    message = HOPELESS.format(deadline=5, model="m", expected=20, pool="p", load=0, capacity=1)
    # gRPC's and Triton's own words first (clients and Triton's QA look for them)
    assert message == ("Deadline Exceeded: deadline of 5 ms cannot be met: model 'm' is "
                       "expected to take 20 ms in pool 'p' (load 0 for capacity 1), more than "
                       "9/10 of it; refused before Triton does the work")


@pytest.mark.parametrize(("us", "kept"), [(0.2, 1), (7.4, 7), (17_431.0, 17_000),
                                          (17_551.0, 18_000), (99.6, 100), (123_456, 120_000)])
def test_service_time_is_kept_to_two_significant_digits(us: float, kept: int) -> None:
    assert service_quantum(us) == kept


@pytest.mark.parametrize(("elapsed_ms", "deadline_ms", "at_deadline"), [
    (500, 500, True), (460, 500, True), (449, 500, False),  # 50 ms before: the deadline's
    (95, 100, True), (89, 100, False),  # a tenth of a short deadline
    (10_000, None, False), (0, 0, True)])
def test_a_cancellation_counts_as_the_deadlines_when_it_comes_at_it(
        elapsed_ms: float, deadline_ms: float | None, at_deadline: bool) -> None:
    assert given_up_at_deadline(elapsed_ms, deadline_ms) is at_deadline


@pytest.mark.parametrize(("value", "seconds"), [
    (None, 0.0), (str(STREAM_GRACE_MS), STREAM_GRACE_MS / 1e3), ("250", 0.25), ("-5", 0.0),
    ("1.5", 0.0), (str(STREAM_GRACE_MS + 1), 0.0)])  # never more than HAProxy gives
def test_grace_read_from_haproxys_header_only_when_within_the_streams(
        value: str | None, seconds: float) -> None:
    assert grace_s(value) == seconds
