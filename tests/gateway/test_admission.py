"""Admission gate and token buckets (no sockets)."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from gateway.admission import AdmissionGate, RateLimit, RateLimiter, TokenBucket, key_digest
from gateway.errors import DeadlineExceeded, Overloaded


def test_admission_gate_sheds_at_once_when_queue_full() -> None:
    async def run() -> None:
        gate = AdmissionGate(max_concurrency=1, max_queue=1)
        assert gate.try_acquire()
        waiter = asyncio.create_task(gate.acquire(None, retry_after_s=2))
        await asyncio.sleep(0)
        assert gate.queued == 1
        with pytest.raises(Overloaded) as info:
            await gate.acquire(None, retry_after_s=2)
        assert info.value.retry_after_s == 2
        gate.release()  # the slot passes to the waiter, FIFO
        await waiter
        assert gate.active == 1 and gate.queued == 0
        gate.release()
        assert gate.active == 0

    asyncio.run(run())


def test_admission_gate_raises_deadline_when_queued_too_long() -> None:
    async def run() -> None:
        gate = AdmissionGate(max_concurrency=1, max_queue=4)
        assert gate.try_acquire()
        with pytest.raises(DeadlineExceeded):
            await gate.acquire(0.05, retry_after_s=1)
        assert gate.queued == 0
        gate.release()
        assert gate.active == 0 and gate.try_acquire()

    asyncio.run(run())


def test_admission_gate_keeps_fifo_order_when_many_wait() -> None:
    async def run() -> None:
        gate = AdmissionGate(max_concurrency=1, max_queue=10)
        assert gate.try_acquire()
        order: list[int] = []

        async def waiter(i: int) -> None:
            await gate.acquire(None, retry_after_s=1)
            order.append(i)
            gate.release()

        tasks = [asyncio.create_task(waiter(i)) for i in range(5)]
        await asyncio.sleep(0)
        gate.release()
        await asyncio.gather(*tasks)
        assert order == [0, 1, 2, 3, 4]
        assert gate.active == 0

    asyncio.run(run())


def test_token_bucket_refills_at_rate_when_clock_advances() -> None:
    now = [0.0]
    bucket = TokenBucket(rate_per_s=2.0, burst=2.0, clock=lambda: now[0])
    assert bucket.take() == 0 and bucket.take() == 0
    assert bucket.take() == pytest.approx(0.5)
    now[0] = 0.5
    assert bucket.take() == 0


def test_rate_limiter_limits_each_key_separately() -> None:
    now = [0.0]
    limiter = RateLimiter(RateLimit(1, 1), {"vip": RateLimit(100, 100)}, clock=lambda: now[0])
    limiter.check("alice")
    with pytest.raises(Overloaded, match="sha256:" + key_digest("alice")[:12]):
        limiter.check("alice")
    limiter.check("bob")  # its own bucket
    for _ in range(50):
        limiter.check("vip")


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def test_rate_limiter_keeps_no_key_string_when_keys_configured_and_presented() -> None:
    limiter = RateLimiter(RateLimit(1, 1), {"plain-secret": RateLimit(5, 5)},
                          clock=lambda: 0.0)
    limiter.check("plain-secret")
    limiter.check("other-secret")
    with pytest.raises(Overloaded) as info:
        limiter.check("other-secret")
    held = repr(vars(limiter)) + repr(limiter._buckets) + repr(limiter._configured)
    assert "plain-secret" not in held and "other-secret" not in held
    assert "secret" not in str(info.value)
    assert set(limiter.limits) == {_digest("plain-secret")}


def test_rate_limiter_applies_digest_limit_when_configured_as_sha256() -> None:
    digest = _digest("vip-key")
    limiter = RateLimiter(RateLimit(1, 1), {f"sha256:{digest.upper()}": RateLimit(100, 100)},
                          clock=lambda: 0.0)
    for _ in range(50):
        limiter.check("vip-key")  # the configured burst, not the default's 1
    limiter.check("someone")
    with pytest.raises(Overloaded):
        limiter.check("someone")


@pytest.mark.parametrize("bad", ["sha256:", "sha256:abc", "sha256:" + "g" * 64,
                                 "sha256:" + "a" * 65])
def test_rate_limiter_refuses_config_when_digest_malformed(bad: str) -> None:
    with pytest.raises(ValueError, match="64 hexadecimal"):
        RateLimiter(None, {bad: RateLimit(1, 1)})


def test_rate_limiter_bounds_table_when_random_keys_flood() -> None:
    limiter = RateLimiter(RateLimit(1, 1), {}, clock=lambda: 0.0, max_buckets=100)
    for i in range(5_000):
        limiter.check(f"random-{i}")
    assert len(limiter) == 100
    # the most recent keys kept their (empty) buckets; the oldest were evicted
    with pytest.raises(Overloaded):
        limiter.check("random-4999")
    limiter.check("random-0")


def test_rate_limiter_keeps_recently_used_bucket_when_table_full() -> None:
    limiter = RateLimiter(RateLimit(1, 1), {}, clock=lambda: 0.0, max_buckets=2)
    limiter.check("a")
    limiter.check("b")
    with pytest.raises(Overloaded):
        limiter.check("a")  # a is now the most recently used
    limiter.check("c")  # evicts b, not a
    with pytest.raises(Overloaded):
        limiter.check("a")
    limiter.check("b")  # came back with a full bucket
    assert len(limiter) == 2


def test_rate_limiter_keeps_configured_bucket_when_random_keys_flood() -> None:
    limiter = RateLimiter(RateLimit(1, 1), {"limited": RateLimit(1, 2)}, clock=lambda: 0.0,
                          max_buckets=10)
    limiter.check("limited")
    limiter.check("limited")
    for i in range(100):
        limiter.check(f"random-{i}")
    with pytest.raises(Overloaded):
        limiter.check("limited")  # its bucket was not evicted back to full
    assert len(limiter) == 11


def test_rate_limiter_keeps_no_bucket_when_no_default_and_key_unconfigured() -> None:
    limiter = RateLimiter(None, {"limited": RateLimit(1, 1)}, clock=lambda: 0.0)
    for i in range(100):
        limiter.check(f"random-{i}")
        limiter.check(None)
    assert len(limiter) == 0


def test_rate_limiter_shares_anonymous_bucket_when_no_key() -> None:
    limiter = RateLimiter(RateLimit(1, 1), {}, clock=lambda: 0.0)
    limiter.check(None)
    with pytest.raises(Overloaded, match="anonymous"):
        limiter.check("")
