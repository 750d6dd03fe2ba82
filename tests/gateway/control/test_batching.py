"""Dynamic-batching policy: settings derived from an SLO and measured batch latency."""

from __future__ import annotations

import pytest

from gateway.control.batching import batch_latency_from_stats, derive_batching, interpolate

# roughly EfficientNet-Lite0 on this CPU: ms per batch
LATENCY = {1: 8.0, 2: 12.0, 4: 20.0, 8: 36.0, 16: 70.0, 32: 140.0}


def test_derive_batching_picks_largest_batch_within_slo() -> None:
    decision = derive_batching(100.0, LATENCY, max_batch_size=32)
    assert 2 * interpolate(LATENCY, decision.batch_size) <= 100.0
    assert 2 * interpolate(LATENCY, decision.batch_size + 1) > 100.0
    assert decision.expected_latency_ms <= 100.0
    assert decision.default_timeout_us == 100_000
    assert decision.max_queue_size >= decision.batch_size


def test_derive_batching_grows_batch_when_slo_loosens() -> None:
    sizes = [derive_batching(slo, LATENCY, 32).batch_size for slo in (20, 50, 100, 300)]
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1]
    assert derive_batching(300, LATENCY, 32).batch_size == 32  # capped by max_batch_size


def test_derive_batching_turns_delay_off_when_slo_below_batch1() -> None:
    decision = derive_batching(10.0, LATENCY, 32)
    assert decision.batch_size == 1 and decision.max_queue_delay_us == 0
    assert "cannot hold" in decision.reason


def test_derive_batching_config_has_triton_field_names() -> None:
    config = derive_batching(100.0, LATENCY, 32).as_config()
    assert set(config) == {"max_queue_delay_microseconds", "priority_levels",
                           "default_priority_level", "default_queue_policy"}
    assert config["default_queue_policy"]["timeout_action"] == "REJECT"


def test_derive_batching_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        derive_batching(0, LATENCY, 8)
    with pytest.raises(ValueError):
        derive_batching(10, {}, 8)


def test_batch_latency_from_stats_reads_triton_statistics() -> None:
    stats = {"batch_stats": [
        {"batch_size": 1, "compute_input": {"count": 2, "ns": 2_000_000},
         "compute_infer": {"count": 2, "ns": 14_000_000},
         "compute_output": {"count": 2, "ns": 0}},
        {"batch_size": 4, "compute_infer": {"count": 0, "ns": 0}},
    ]}
    assert batch_latency_from_stats(stats) == {1: 8.0}
