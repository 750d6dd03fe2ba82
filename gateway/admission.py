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
import hashlib
import re
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.errors import DeadlineExceeded, Overloaded

DEFAULT_MAX_BUCKETS = 10_000
DIGEST_PREFIX = "sha256:"
ANONYMOUS = "anonymous"  # requests without a key share one bucket (never a hex digest)
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")


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
    """Token bucket per API key; keys without an explicit limit share the default.

    Buckets are keyed by the SHA-256 digest of the presented key, never the key itself,
    so neither this table nor an error message holds a credential. Configured limits
    name a key as ``sha256:<hex digest>`` (a config file need not hold the key) or as a
    plain key, hashed here and not kept. Buckets of unconfigured keys live in an LRU
    table of at most ``max_buckets``: a client sending random keys evicts the least
    recently seen bucket instead of growing the table (an evicted bucket comes back
    full, which gives nothing away: a fresh random key gets a full bucket anyway).
    Configured keys keep their buckets outside that table, so no flood of other keys
    can refill a limited key's bucket.
    """

    def __init__(self, default: RateLimit | None, per_key: dict[str, RateLimit],
                 clock: Callable[[], float] = time.monotonic, *,
                 max_buckets: int = DEFAULT_MAX_BUCKETS) -> None:
        if max_buckets < 1:
            raise ValueError(f"max_buckets must be >= 1, not {max_buckets}")
        self.default = default
        self.limits = {configured_key_digest(key): limit for key, limit in per_key.items()}
        self.clock = clock
        self.max_buckets = max_buckets
        self._configured: dict[str, TokenBucket] = {}
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()

    def __len__(self) -> int:
        """Buckets held (configured keys plus the LRU table)."""
        return len(self._configured) + len(self._buckets)

    def check(self, api_key: str | None) -> None:
        key = key_digest(api_key) if api_key else ANONYMOUS
        limit = self.limits.get(key)
        if limit is not None:
            bucket = self._configured.get(key)
            if bucket is None:
                bucket = self._configured[key] = self._bucket(limit)
        elif self.default is None:
            return
        else:
            bucket = self._lru_bucket(key, self.default)
        wait = bucket.take()
        if wait > 0:
            raise Overloaded(f"rate limit exceeded for API key {_label(key)}",
                             retry_after_s=wait)

    def _lru_bucket(self, key: str, limit: RateLimit) -> TokenBucket:
        bucket = self._buckets.get(key)
        if bucket is not None:
            self._buckets.move_to_end(key)
            return bucket
        while len(self._buckets) >= self.max_buckets:
            self._buckets.popitem(last=False)
        bucket = self._buckets[key] = self._bucket(limit)
        return bucket

    def _bucket(self, limit: RateLimit) -> TokenBucket:
        return TokenBucket(limit.rate_per_s, limit.burst, self.clock)


def key_digest(api_key: str) -> str:
    """What the limiter keys a bucket by: the hex SHA-256 of the key's UTF-8 bytes."""
    return hashlib.sha256(api_key.encode("utf-8", "surrogatepass")).hexdigest()


def configured_key_digest(configured: str) -> str:
    """A configured key, ``sha256:<64 hex digits>`` or a plain key, as its digest."""
    if configured.startswith(DIGEST_PREFIX):
        digest = configured[len(DIGEST_PREFIX):].lower()
        if not _HEX_DIGEST.fullmatch(digest):
            raise ValueError(f"rate limit key {configured[:12]}…: expected sha256: followed "
                             "by 64 hexadecimal digits")
        return digest
    return key_digest(configured)


def _label(key: str) -> str:
    return key if key == ANONYMOUS else f"{DIGEST_PREFIX}{key[:12]}…"
