"""Demand: requests per second per model from the counter both data planes feed,
smoothed, recorded for the next start: in the lifecycle's records where there are some
(starting from the file an older gateway wrote while they hold none), else a file."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from unittest.mock import create_autospec

import pytest

from gateway.lifecycle.records.jobs import LifecycleStore
from gateway.lifecycle.records.store import RecordStore, StaleTerm
from gateway.metrics import GatewayMetrics, create_metrics
from gateway.residency.demand import DemandMeter


def count(metrics: GatewayMetrics, model: str, n: int, traffic: str = "user") -> None:
    metrics.requests.labels(model, "p", "http", "success", traffic).inc(n)


def test_the_rate_follows_user_requests_only_and_smooths() -> None:
    metrics = create_metrics()
    meter = DemandMeter(metrics, half_life_s=10.0)
    count(metrics, "a", 500)  # before the first read: not a burst now
    meter.read(0.0)
    assert meter.rate("a") == 0.0
    for second in range(1, 61):  # a steady 20 rps for a minute, warm-up traffic beside it
        count(metrics, "a", 20)
        count(metrics, "a", 1000, traffic="warmup")
        meter.read(float(second))
    assert meter.rate("a") == pytest.approx(20.0, rel=0.02)
    for second in range(61, 71):  # silence for one half-life
        meter.read(float(second))
    assert meter.rate("a") == pytest.approx(10.0, rel=0.02)
    assert meter.rate("never") == 0.0


def test_recorded_demand_is_what_the_next_start_begins_with(tmp_path: Path) -> None:
    path = tmp_path / "state" / "demand.json"
    metrics = create_metrics()
    meter = DemandMeter(metrics, half_life_s=1.0, path=path)
    meter.read(0.0)
    count(metrics, "hot", 40)
    count(metrics, "warm", 4)
    meter.read(2.0)
    meter.record()
    saved = json.loads(path.read_text())["models"]
    assert saved["hot"] > saved["warm"] > 0

    again = DemandMeter(create_metrics(), half_life_s=1.0, path=path)
    assert again.recorded() == pytest.approx(saved)
    again.read(100.0)
    assert again.rate("hot") == pytest.approx(saved["hot"])  # until requests say otherwise


def test_recorded_demand_goes_to_the_records_when_the_gateway_has_them(tmp_path: Path) -> None:
    path = tmp_path / "state" / "residency-demand.json"
    metrics = create_metrics()
    meter = DemandMeter(metrics, 1.0, path, LifecycleStore(tmp_path / "state" / "l.db"))
    meter.read(0.0)
    count(metrics, "hot", 40)
    count(metrics, "warm", 4)
    meter.read(2.0)
    meter.record()
    assert not path.exists()  # the records hold it, not the file
    again = DemandMeter(create_metrics(), 1.0, path, LifecycleStore(tmp_path / "state" / "l.db"))
    saved = again.recorded()
    assert saved["hot"] > saved["warm"] > 0 and saved == pytest.approx(meter.rates())
    again.read(100.0)
    assert again.rate("hot") == pytest.approx(saved["hot"])  # until requests say otherwise


def test_records_start_from_the_older_file_when_they_hold_no_demand(tmp_path: Path) -> None:
    path = tmp_path / "residency-demand.json"
    path.write_text(json.dumps({"saved_at": 1.0, "models": {"a": 5.0}}))
    store = LifecycleStore(tmp_path / "lifecycle.db")
    meter = DemandMeter(create_metrics(), 1.0, path, store)
    assert meter.recorded() == {"a": 5.0}  # what the gateway before the records measured
    meter.read(0.0)
    meter.record()
    path.write_text(json.dumps({"saved_at": 2.0, "models": {"b": 1.0}}))
    assert DemandMeter(create_metrics(), 1.0, path, store).recorded() == {"a": 5.0}


def test_a_refused_record_is_logged_and_the_meter_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    store = create_autospec(RecordStore, instance=True)
    store.recorded_demand.return_value = None
    store.record_demand.side_effect = StaleTerm("write refused: leadership term 1")
    metrics = create_metrics()
    meter = DemandMeter(metrics, 0.0, None, store)
    meter.read(0.0)
    count(metrics, "m", 3)
    meter.read(1.0)
    with caplog.at_level(logging.WARNING):
        meter.record()  # a replica that lost leadership: not the residency's failure
    assert "recording demand failed: write refused" in caplog.text
    store.record_demand.assert_called_once_with({"m": 3.0})


def test_an_unreadable_record_starts_empty(tmp_path: Path) -> None:
    path = tmp_path / "demand.json"
    path.write_text("{not json")
    assert DemandMeter(create_metrics(), 1.0, path).recorded() == {}


def test_the_rate_counts_what_the_replicas_report_they_served() -> None:
    metrics = create_metrics()
    meter = DemandMeter(metrics, half_life_s=0.0)
    meter.read(0.0)
    count(metrics, "a", 5)  # served here
    metrics.replica_requests.labels("a").inc(15)  # served by the data-plane replicas
    meter.read(1.0)
    assert meter.rate("a") == pytest.approx(20.0)


def test_requests_count_as_they_arrive_in_the_waiting_room_and_once() -> None:
    """A new favourite's first requests wait for its load: they count as they enter the
    room, not seconds later as they end, and not twice (the replica's report of their
    answers can come a read after the room let them go)."""
    metrics = create_metrics()
    meter = DemandMeter(metrics, half_life_s=0.0)  # each read's own rate
    meter.read(0.0, {})
    meter.read(1.0, {"new": 8})  # eight arrived, all waiting: hot already
    assert meter.rate("new") == pytest.approx(8.0)
    meter.read(2.0, {"new": 10})  # two more
    assert meter.rate("new") == pytest.approx(2.0)
    meter.read(3.0, {})  # loaded: the room let ten go, their answers not reported yet
    assert meter.rate("new") == 0.0
    metrics.replica_requests.labels("new").inc(10 + 4)  # the ten, and four hits since
    meter.read(4.0, {})
    assert meter.rate("new") == pytest.approx(4.0)  # the ten counted once, as they arrived
    count(metrics, "new", 3)
    meter.read(5.0, {})
    assert meter.rate("new") == pytest.approx(3.0)


def test_an_answer_never_counted_is_forgotten_after_a_few_reads() -> None:
    metrics = create_metrics()
    meter = DemandMeter(metrics, half_life_s=0.0)
    meter.read(0.0, {"m": 5})
    meter.read(1.0, {})  # five left the room; their replica died before reporting
    for second in range(2, 6):
        count(metrics, "m", 2)
        meter.read(float(second), {})
    assert meter.rate("m") == pytest.approx(2.0)  # the five no longer taken off
