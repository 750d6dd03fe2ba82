"""Admission gate and token buckets (no sockets)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.admission import AdmissionGate, RateLimit, RateLimiter, TokenBucket
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
    with pytest.raises(Overloaded, match="alic"):
        limiter.check("alice")
    limiter.check("bob")  # its own bucket
    for _ in range(50):
        limiter.check("vip")
