"""Readiness: a model that cannot take requests yet (first load, warm-up, preloading at
start-up) answers 503 / UNAVAILABLE with ``Retry-After`` instead of reaching Triton,
which would call it unknown. The lifecycle says why; both planes answer alike."""

from __future__ import annotations

NOT_READY = "model '{model}' is not ready yet: {reason}"
RETRY_AFTER_S = 2
# the reason of a model the gateway preloads at start-up: while one is, the gateway is not
# ready (a data-plane replica reads it off its snapshot: gateway/replica.py)
PRELOADING = "preloading at gateway start-up"


def not_ready_message(model: str, reason: str) -> str:
    return NOT_READY.format(model=model, reason=reason)
