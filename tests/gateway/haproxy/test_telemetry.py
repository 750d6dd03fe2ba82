"""HAProxy's request-log lines counted (gateway/haproxy/telemetry.py): the lines as the
real HAProxy writes them."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from gateway.haproxy.telemetry import RequestLog, classify
from gateway.metrics import create_metrics


def _count(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return sum(s.value for f in registry.collect() for s in f.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def test_a_call_its_client_cancelled_before_any_answer_is_counted_cancelled_without_latency(
        ) -> None:
    registry = CollectorRegistry()
    log = RequestLog(create_metrics(registry))
    # a gRPC call cancelled while Triton held it (logged by HAProxy 2.6 on 2026-12-05)
    assert log.record("held p grpc -1 - 1000 - CD - - - - 0") == "cancelled"
    assert log.record("held p grpc -1 - 1000 - CD app critical - - 0") == "cancelled"
    assert _count(registry, "infergate_requests_total", model="held", protocol="grpc",
                  outcome="cancelled") == 2
    assert _count(registry, "infergate_tenant_requests_total", tenant="app",
                  outcome="cancelled") == 1
    # the client's patience is no latency of the gateway's (the Python plane has none)
    assert _count(registry, "infergate_request_duration_seconds_count") == 0
    assert _count(registry, "infergate_tenant_request_duration_seconds_count") == 0


def test_no_answer_without_the_clients_doing_is_unavailable_never_success() -> None:
    assert classify("grpc", -1, "-", "-", "KD") == "unavailable"
    assert classify("grpc", -1, "-", "-", "SD") == "unavailable"
    assert classify("http", -1, "-", "-", "CH") == "cancelled"
    assert classify("http", 200, "-", "-", "--") == "success"


def test_a_call_its_client_ended_at_its_deadline_is_a_deadline_without_latency() -> None:
    """A gRPC client ends a call at its deadline itself: HAProxy logs the client's
    cancellation (CD) after about the deadline it logged last (``txn.dl``)."""
    registry = CollectorRegistry()
    log = RequestLog(create_metrics(registry))
    assert log.record("held p grpc -1 - 498 - CD - - - - 0 500") == "deadline"
    assert log.record("held p grpc -1 - 20 - CD - - - - 0 500") == "cancelled"  # before it
    assert log.record("held p grpc -1 - 1000 - CD - - - - 0 -") == "cancelled"  # none
    assert _count(registry, "infergate_requests_total", model="held", outcome="deadline") == 1
    assert _count(registry, "infergate_request_duration_seconds_count") == 0


def test_a_grpc_status_that_reached_the_client_counts_whatever_ended_the_stream_after() -> None:
    # Triton at a call's deadline (its grpc-timeout): the status, then a reset (2026-12-05)
    assert classify("grpc", 200, "4", "-", "SD") == "deadline"
    assert classify("grpc", 200, "14", "-", "SD") == "unavailable"
    assert classify("grpc", 200, "0", "-", "CD") == "success"
    assert classify("grpc", 200, "-", "-", "SD") == "unavailable"  # no status: cut short
