"""Admission: how many requests of one model the gateway holds at once.

One semantic on both planes: a model may have ``in_system`` requests in the gateway at
once (in flight to its members, which queue and batch them); the next one is refused at
once with 429 / RESOURCE_EXHAUSTED and ``Retry-After``, so latency of admitted requests
stays bounded and memory does not grow with offered load. Nothing waits in the gateway:
Triton's own queue (and its dynamic batcher) is where requests wait, and a request
HAProxy held back would hold back the HTTP/2 window of every request sharing its client
connection.

The limit comes from measured capacity: ``concurrency`` is the model policy's
``max_concurrency``, else the capacity of its pools (``capacity_per_member`` times
members, from the converter's profile or a load test); ``queue`` is the policy's
``max_queue``, else ``queue_factor`` times ``concurrency``.
"""

from __future__ import annotations

from dataclasses import dataclass

OVERLOADED = ("overloaded: model '{model}' has {count} requests in the gateway "
              "(limit {limit})")
RETRY_AFTER_S = 1


@dataclass(frozen=True)
class AdmissionLimits:
    concurrency: int
    queue: int

    @property
    def in_system(self) -> int:
        """Requests of the model the gateway holds at once; beyond: refused."""
        return max(1, self.concurrency + self.queue)


def admission_limits(capacity: int, queue_factor: float, max_concurrency: int | None = None,
                     max_queue: int | None = None) -> AdmissionLimits:
    """From the model policy's fields when set, else from its pools' ``capacity``."""
    concurrency = max_concurrency or capacity
    queue = max_queue if max_queue is not None else int(concurrency * queue_factor)
    return AdmissionLimits(concurrency, queue)


def overloaded_message(model: str, count: int, limit: int) -> str:
    """``count``: the model's requests in the gateway, the refused one included."""
    return OVERLOADED.format(model=model, count=count, limit=limit)
