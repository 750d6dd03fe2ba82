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
