"""Rate limits per API key: HAProxy's sliding window, as the Python plane counts it."""

from __future__ import annotations

import pytest

from gateway.errors import Overloaded
from gateway.policy.access import key_digest
from gateway.policy.rate import RateClass, RateLimiter, SlidingWindow


def _limiter(default: RateClass | None, per_key: dict[str, RateClass] | None = None,
             max_keys: int = 100) -> tuple[RateLimiter, list[float]]:
    now = [1000.0]
    return RateLimiter(default, per_key or {}, clock=lambda: now[0], max_keys=max_keys), now


def test_rate_class_renders_window_limit_and_retry_when_rate_and_burst_given() -> None:
    limit = RateClass(rate_per_s=0.5, burst=3)
    assert (limit.window_ms, limit.limit, limit.retry_after_s) == (6000, 3, 2)
    assert limit.message() == ("rate limit exceeded for this API key "
                               "(at most 3 requests per 6000 ms)")
    assert RateClass(100, 10).retry_after_s == 1  # never below one second


def test_window_admits_burst_then_refuses_and_counts_refused_when_key_keeps_sending() -> None:
    limiter, now = _limiter(RateClass(1, 2))
    limiter.check("alice")
    limiter.check("alice")
    with pytest.raises(Overloaded) as info:
        limiter.check("alice")
    assert info.value.retry_after_s == 1
    now[0] += 1.9  # inside the next period the previous one still weighs: refused
    with pytest.raises(Overloaded):
        limiter.check("alice")
    now[0] += 10  # a quiet window later: admitted again
    limiter.check("alice")
    limiter.check("bob")  # a window of its own


def test_window_estimates_as_haproxy_when_previous_period_partly_covers() -> None:
    window = SlidingWindow(period_ms=1000)
    for _ in range(10):
        window.add(5000)  # period [5000, 6000)
    assert window.read(5500) == 10
    window.add(6250)  # next period: previous weighs (1000 - 250) / 1000
    assert window.read(6250) == 1 + 10 * 750 // 1000
    assert window.read(7500) == 1 * 500 // 1000  # two periods on: only the last weighs
    assert window.read(9000) == 0


def test_limiter_keeps_no_key_string_when_keys_configured_and_presented() -> None:
    limiter, _ = _limiter(RateClass(1, 1), {"plain-secret": RateClass(5, 5)})
    limiter.check("plain-secret")
    limiter.check("other-secret")
    with pytest.raises(Overloaded) as info:
        limiter.check("other-secret")
    held = repr(vars(limiter))
    assert "plain-secret" not in held and "other-secret" not in held
    assert "secret" not in str(info.value)
    assert set(limiter.classes) == {key_digest("plain-secret")}


def test_limiter_applies_configured_class_when_key_named_by_digest() -> None:
    limiter, _ = _limiter(RateClass(1, 1),
                          {f"sha256:{key_digest('vip-key').upper()}": RateClass(100, 100)})
    for _ in range(50):
        limiter.check("vip-key")  # the configured burst, not the default's 1
    limiter.check("someone")
    with pytest.raises(Overloaded):
        limiter.check("someone")


@pytest.mark.parametrize("bad", ["sha256:", "sha256:abc", "sha256:" + "g" * 64,
                                 "sha256:" + "a" * 65])
def test_limiter_refuses_config_when_digest_malformed(bad: str) -> None:
    with pytest.raises(ValueError, match="64 hexadecimal"):
        RateLimiter(None, {bad: RateClass(1, 1)})


def test_limiter_bounds_table_and_keeps_recent_keys_when_random_keys_flood() -> None:
    limiter, _ = _limiter(RateClass(1, 1), max_keys=100)
    for i in range(5_000):
        limiter.check(f"random-{i}")
    assert len(limiter) == 100
    with pytest.raises(Overloaded):
        limiter.check("random-4999")  # kept: its window is full
    limiter.check("random-0")  # evicted: back with an empty window


def test_limiter_keeps_configured_window_when_random_keys_flood() -> None:
    limiter, _ = _limiter(RateClass(1, 1), {"limited": RateClass(1, 2)}, max_keys=10)
    limiter.check("limited")
    limiter.check("limited")
    for i in range(100):
        limiter.check(f"random-{i}")
    with pytest.raises(Overloaded):
        limiter.check("limited")  # its window was not evicted
    assert len(limiter) == 11


def test_limiter_keeps_no_window_when_no_default_and_key_unconfigured() -> None:
    limiter, _ = _limiter(None, {"limited": RateClass(1, 1)})
    for i in range(100):
        limiter.check(f"random-{i}")
        limiter.check(None)
    assert len(limiter) == 0


def test_limiter_shares_anonymous_window_when_key_absent_or_empty() -> None:
    limiter, _ = _limiter(RateClass(1, 1))
    limiter.check(None)
    with pytest.raises(Overloaded):
        limiter.check("")
