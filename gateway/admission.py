"""Admission control: per-model concurrency + queue limits, and per-API-key token buckets.

A model admits ``max_concurrency`` requests to Triton at once; up to ``max_queue`` more
wait in the gateway (FIFO, each bounded by its deadline). Anything beyond is shed at once
with :class:`Overloaded` (HTTP 429 + Retry-After / RESOURCE_EXHAUSTED), so latency of
admitted requests stays bounded and memory does not grow with offered load.

Limits come from measured capacity: the pools' ``capacity_per_member`` (set from the
converter's profile or a load test) unless a model policy overrides them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.errors import DeadlineExceeded, Overloaded


class AdmissionGate:
    """A FIFO semaphore with a bounded wait queue. Single event loop; no locks needed."""

    def __init__(self, max_concurrency: int, max_queue: int) -> None:
        self.max_concurrency = max_concurrency
        self.max_queue = max_queue
        self.active = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def queued(self) -> int:
        return len(self._waiters)

    def try_acquire(self) -> bool:
        if self.active < self.max_concurrency and not self._waiters:
            self.active += 1
            return True
        return False

    async def acquire(self, timeout_s: float | None, retry_after_s: float) -> None:
        if self.try_acquire():
            return
        if len(self._waiters) >= self.max_queue:
            raise Overloaded(
                f"overloaded: {self.active} in flight and {len(self._waiters)} queued "
                f"(limits {self.max_concurrency}/{self.max_queue})",
                retry_after_s=retry_after_s,
            )
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout_s)
        except (TimeoutError, asyncio.CancelledError) as exc:
            if waiter.done() and not waiter.cancelled():
                self.release()  # the slot arrived just as we gave up: hand it on
            else:
                waiter.cancel()
                self._remove(waiter)
            if isinstance(exc, TimeoutError):
                raise DeadlineExceeded("deadline exceeded while queued in the gateway") from None
            raise

    def release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes straight to the next waiter
                return
        self.active -= 1

    def _remove(self, waiter: asyncio.Future[None]) -> None:
        with contextlib.suppress(ValueError):
            self._waiters.remove(waiter)


@dataclass
class TokenBucket:
    rate_per_s: float
    burst: float
    clock: Callable[[], float] = time.monotonic
    tokens: float = field(init=False)
    updated: float = field(init=False)

    def __post_init__(self) -> None:
        self.tokens = self.burst
        self.updated = self.clock()

    def take(self) -> float:
        """Take one token; return 0 on success, else seconds until one is available."""
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate_per_s)
        self.updated = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate_per_s


@dataclass(frozen=True)
class RateLimit:
    rate_per_s: float
    burst: float


class RateLimiter:
    """Token bucket per API key; keys without an explicit limit share the default."""

    def __init__(self, default: RateLimit | None, per_key: dict[str, RateLimit],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.default = default
        self.per_key = per_key
        self.clock = clock
        self._buckets: dict[str, TokenBucket] = {}

    def check(self, api_key: str | None) -> None:
        key = api_key or "anonymous"
        limit = self.per_key.get(key, self.default)
        if limit is None:
            return
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = TokenBucket(limit.rate_per_s, limit.burst, self.clock)
        wait = bucket.take()
        if wait > 0:
            raise Overloaded(f"rate limit exceeded for API key {_redact(key)}",
                             retry_after_s=wait)


def _redact(key: str) -> str:
    return key if key == "anonymous" else f"{key[:4]}…"
