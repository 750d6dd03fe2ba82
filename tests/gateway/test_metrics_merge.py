"""The control plane's ``/metrics`` with a local replica's merged in
(gateway/metrics_merge.py): counters and histograms add up, load gauges add up, the
control plane's other gauges stand, families only one side has are kept."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from gateway.metrics import create_metrics
from gateway.metrics_merge import merge_exposition


def _values(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples
            if not s.name.endswith("_created")}


def test_counters_histograms_and_load_gauges_add_up_other_gauges_are_the_control_planes(
) -> None:
    control, replica = create_metrics(), create_metrics()
    for metrics, count, healthy, flight in ((control, 3, 1, 2), (replica, 4, 0, 5)):
        metrics.requests.labels("m", "p", "grpc", "success", "user").inc(count)
        metrics.member_healthy.labels("p", "a").set(healthy)
        metrics.in_flight.labels("m", "p").set(flight)
    replica.latency.labels("m", "p", "grpc", "user").observe(0.01)
    merged = _values(merge_exposition(control.render().decode(),
                                      replica.render().decode()).decode())
    by_name: dict[str, list[float]] = {}
    for (name, _), value in merged.items():
        by_name.setdefault(name, []).append(value)
    assert by_name["infergate_requests_total"] == [7.0]
    assert by_name["infergate_member_healthy"] == [1.0]  # the control plane's view
    assert by_name["infergate_in_flight_requests"] == [7.0]
    assert by_name["infergate_request_duration_seconds_count"] == [1.0]  # one side's


def test_a_family_only_the_replica_has_is_kept() -> None:
    control, replica = create_metrics(), create_metrics()
    replica.rejected.labels("m", "overloaded").inc(2)
    merged = _values(merge_exposition(control.render().decode(),
                                      replica.render().decode()).decode())
    assert merged[("infergate_rejected_requests_total",
                   (("model", "m"), ("reason", "overloaded")))] == 2.0
