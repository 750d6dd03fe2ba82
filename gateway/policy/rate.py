"""Rate limits per API key: one semantic, HAProxy's sliding window, on both planes.

A limit of ``rate_per_s`` with ``burst`` is a window of ``burst / rate_per_s`` seconds
that admits at most ``burst`` requests (so the long-run rate is ``rate_per_s``). Every
request counts, refused ones included: a client that keeps sending faster than its
limit stays refused until it slows down. The count is HAProxy's estimate
(``http_req_rate`` of a stick table, its ``freq_ctr``): the requests of the current
period plus those of the previous period weighted by the share of the window that still
covers it. :class:`SlidingWindow` computes the same in the Python plane; HAProxy renders
one stick table per :class:`RateClass` (``gateway/haproxy/admission_rules.py``).

Why not a token bucket: HAProxy has no bucket, and a stick table's rate is exact enough
to be the contract. Keys are digests (:mod:`gateway.policy.access`); a table holds at
most :data:`MAX_KEYS` of them, the least recently seen going first (an evicted key comes
back with an empty window, which gives nothing away: a fresh random key has one too).
Configured keys are never evicted by a flood of other keys.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import InitVar, dataclass, field

from gateway.config import RateLimits
from gateway.config.access import RateLimitSpec
from gateway.errors import Overloaded
from gateway.policy.access import ANONYMOUS, configured_digest, key_digest

MAX_KEYS = 100_000  # per limit class: HAProxy's stick-table size, the Python LRU's bound
EXCEEDED = "rate limit exceeded for {who} (at most {limit} requests per {window_ms} ms)"
THIS_KEY = "this API key"


@dataclass(frozen=True)
class RateClass:
    """One limit: at most ``limit`` requests per ``window_ms``."""

    rate_per_s: float
    burst: float

    @classmethod
    def of(cls, spec: RateLimitSpec) -> RateClass:
        return cls(spec.rate_per_s, spec.burst)

    @property
    def window_ms(self) -> int:
        return max(1, round(1000 * self.burst / self.rate_per_s))

    @property
    def limit(self) -> int:
        return max(1, int(self.burst))

    @property
    def retry_after_s(self) -> int:
        """Retry-After of a refusal: the time one request's share of the window takes."""
        return max(1, math.ceil(self.window_ms / self.limit / 1000))

    def message(self, who: str = THIS_KEY) -> str:
        return EXCEEDED.format(who=who, limit=self.limit, window_ms=self.window_ms)


def configured_classes(limits: RateLimits) -> tuple[RateClass | None, dict[str, RateClass]]:
    """The configuration's ``rate_limits`` as classes: (the default, configured key ->
    class), keys as configured (plain or ``sha256:<hex>``). Both planes start here."""
    default = limits.default
    return (RateClass.of(default) if default else None,
            {k: RateClass.of(v) for k, v in limits.keys.items()})


@dataclass
class SlidingWindow:
    """HAProxy's ``freq_ctr`` over one period (the window): periods are aligned to the
    clock in whole multiples of the window, as HAProxy aligns its counters."""

    period_ms: int
    curr_tick: int = 0
    curr: int = 0
    prev: int = 0

    def add(self, now_ms: int) -> None:
        if now_ms - self.curr_tick >= self.period_ms:
            elapsed = (now_ms - self.curr_tick) // self.period_ms
            self.prev = self.curr if elapsed == 1 else 0
            self.curr = 0
            self.curr_tick += elapsed * self.period_ms
        self.curr += 1

    def read(self, now_ms: int) -> int:
        remain = self.curr_tick + self.period_ms - now_ms
        curr, past = self.curr, self.prev
        if remain < 0:  # the current period is over: it is now the previous one
            remain += self.period_ms
            past, curr = curr, 0
            if remain < 0:
                return 0
        return curr + (past * remain) // self.period_ms


@dataclass
class RateLimiter:
    """A window per key digest; keys without a configured class share ``default``."""

    default: RateClass | None
    # configured key (plain or sha256:<hex>) -> class: kept only as digests
    per_key: InitVar[Mapping[str, RateClass]]
    clock: Callable[[], float] = time.monotonic
    max_keys: int = MAX_KEYS
    classes: dict[str, RateClass] = field(init=False)
    _configured: dict[str, SlidingWindow] = field(init=False, default_factory=dict)
    _windows: OrderedDict[str, SlidingWindow] = field(init=False, default_factory=OrderedDict)
    # (tenant, its window): a tenant's limit counts all its keys together
    _tenants: dict[tuple[str, int], SlidingWindow] = field(init=False, default_factory=dict)

    def __post_init__(self, per_key: Mapping[str, RateClass]) -> None:
        if self.max_keys < 1:
            raise ValueError(f"max_keys must be >= 1, not {self.max_keys}")
        self.classes = {configured_digest(k): c for k, c in per_key.items()}

    def __len__(self) -> int:
        """Windows held (configured keys plus the LRU table)."""
        return len(self._configured) + len(self._windows)

    def check(self, api_key: str | None) -> None:
        """Count this request against its key's window; Overloaded beyond the limit."""
        digest = key_digest(api_key or ANONYMOUS)  # an empty key is no key
        rate = self.classes.get(digest)
        if rate is not None:
            window = self._configured.get(digest)
            if window is None:
                window = self._configured[digest] = SlidingWindow(rate.window_ms)
        elif self.default is not None:
            rate = self.default
            window = self._lru_window(digest, rate)
        else:
            return
        self._count(window, rate, rate.message())

    def check_tenant(self, tenant: str, rate: RateClass, message: str) -> None:
        """Count this request against a tenant's own limit (HAProxy: the same tables,
        keyed ``t:<tenant>``); Overloaded beyond it."""
        key = (tenant, rate.window_ms)
        window = self._tenants.get(key)
        if window is None:
            window = self._tenants[key] = SlidingWindow(rate.window_ms)
        self._count(window, rate, message)

    def _count(self, window: SlidingWindow, rate: RateClass, message: str) -> None:
        now_ms = int(self.clock() * 1000)
        window.add(now_ms)
        if window.read(now_ms) > rate.limit:
            raise Overloaded(message, retry_after_s=rate.retry_after_s, reason="rate")

    def _lru_window(self, digest: str, rate: RateClass) -> SlidingWindow:
        window = self._windows.get(digest)
        if window is not None:
            self._windows.move_to_end(digest)
            return window
        while len(self._windows) >= self.max_keys:
            self._windows.popitem(last=False)
        window = self._windows[digest] = SlidingWindow(rate.window_ms)
        return window
