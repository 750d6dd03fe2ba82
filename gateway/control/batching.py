"""Dynamic-batching policy: Triton ``dynamic_batching`` settings from a latency SLO and
measured per-batch latency. A pure function; the control plane feeds it measurements
and applies its result through Triton's repository load API (config override).

Reasoning, for a model with execution latency ``L(b)`` at batch size ``b`` and an SLO ``S``:

- A request that arrives while a batch executes waits for that batch, then for its own:
  worst case ``2 * L(b)`` plus the batcher's queue delay. The largest batch size ``b*``
  with ``2 * L(b*) <= S`` is the most throughput the SLO allows (Nexus' observation that
  capacity depends on the batch size the SLO permits).
- ``max_queue_delay`` is the slack left, ``S - 2 * L(b*)``, capped at ``L(b*)``: waiting
  longer than one execution to fill a batch never pays.
- ``max_queue_size``: what can be served within the SLO at ``b*``'s throughput,
  ``S * b* / L(b*)``; more queued requests would only time out.
- ``default_timeout`` = the SLO with action REJECT: a request that cannot make its SLO is
  rejected early instead of using capacity. Clients may override per request (Triton's
  ``timeout`` parameter), and may ask for priority 1 of 2 levels; with tenants the
  gateway gives critical requests level 1 and the others 2 in place of theirs
  (``gateway/policy/triton_priority.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BatchingDecision:
    batch_size: int  # the largest batch the SLO allows (b*)
    max_queue_delay_us: int
    max_queue_size: int
    default_timeout_us: int
    priority_levels: int
    expected_latency_ms: float  # 2 * L(b*) + queue delay: worst case within the SLO
    throughput_per_s: float  # b* / L(b*)
    reason: str

    def as_config(self) -> dict[str, Any]:
        """The ``dynamic_batching`` section, in Triton's JSON model-config form."""
        return {
            "max_queue_delay_microseconds": self.max_queue_delay_us,
            "priority_levels": self.priority_levels,
            "default_priority_level": self.priority_levels,
            "default_queue_policy": {
                "timeout_action": "REJECT",
                "default_timeout_microseconds": self.default_timeout_us,
                "allow_timeout_override": True,
                "max_queue_size": self.max_queue_size,
            },
        }


def interpolate(latency_ms: Mapping[int, float], batch_size: int) -> float:
    """Latency at ``batch_size``, linear between measured points, extrapolated past them."""
    points = sorted(latency_ms.items())
    if batch_size <= points[0][0]:
        return points[0][1]
    for (b0, l0), (b1, l1) in zip(points, points[1:], strict=False):
        if b0 <= batch_size <= b1:
            return l0 + (l1 - l0) * (batch_size - b0) / (b1 - b0)
    (b0, l0), (b1, l1) = (points[-2], points[-1]) if len(points) > 1 else (points[0], points[0])
    slope = (l1 - l0) / (b1 - b0) if b1 != b0 else l1 / max(1, b1)
    return l1 + slope * (batch_size - b1)


def derive_batching(
    latency_slo_ms: float,
    latency_ms: Mapping[int, float],
    max_batch_size: int,
    priority_levels: int = 2,
) -> BatchingDecision:
    """Settings for an SLO given measured execution latency per batch size (ms)."""
    if latency_slo_ms <= 0:
        raise ValueError("latency SLO must be positive")
    if not latency_ms:
        raise ValueError("need at least one measured batch latency")
    best = 1
    for b in range(1, max(1, max_batch_size) + 1):
        if 2 * interpolate(latency_ms, b) <= latency_slo_ms:
            best = b
    exec_ms = interpolate(latency_ms, best)
    slack_ms = max(0.0, latency_slo_ms - 2 * exec_ms)
    delay_ms = min(slack_ms, exec_ms)
    throughput = best / (exec_ms / 1e3) if exec_ms > 0 else float("inf")
    queue = max(best, int(latency_slo_ms / 1e3 * throughput))
    if 2 * exec_ms > latency_slo_ms:
        reason = (f"even batch 1 takes {exec_ms:.1f} ms: the {latency_slo_ms:.0f} ms SLO "
                  "cannot hold under load; batching off")
        delay_ms = 0.0
    else:
        reason = (f"batch {best} runs in {exec_ms:.1f} ms; 2x that plus "
                  f"{delay_ms:.1f} ms queue delay fits the {latency_slo_ms:.0f} ms SLO")
    return BatchingDecision(
        batch_size=best,
        max_queue_delay_us=int(delay_ms * 1e3),
        max_queue_size=queue,
        default_timeout_us=int(latency_slo_ms * 1e3),
        priority_levels=priority_levels,
        expected_latency_ms=2 * exec_ms + delay_ms,
        throughput_per_s=throughput,
        reason=reason,
    )


def batch_latency_from_stats(model_stats: Mapping[str, Any]) -> dict[int, float]:
    """Per-batch execution latency (ms) from Triton's model statistics (v2 JSON form)."""
    result = {}
    for entry in model_stats.get("batch_stats", []):
        infer = entry.get("compute_infer", {})
        count = int(infer.get("count", 0))
        if count:
            total_ns = sum(int(entry.get(k, {}).get("ns", 0)) for k in
                           ("compute_input", "compute_infer", "compute_output"))
            result[int(entry["batch_size"])] = total_ns / count / 1e6
    return result
