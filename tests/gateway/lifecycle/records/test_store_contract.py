"""The storage contract: what the lifecycle relies on from its records, checked against
SQLite and PostgreSQL alike (``backend``): one active job per model, records that
survive a restart, jobs interrupted by a dead gateway reported as failed, version
numbers never reused (also when two stores issue them at once), rollouts and their
verdicts kept, the residency's demand and the tenancy changed live kept whole."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from gateway.errors import Conflict, JobNotFound
from gateway.lifecycle.records.store import (
    ModelRecord,
    RecordStore,
    RolloutRecord,
    VersionRecord,
    with_step,
)
from tests.gateway.lifecycle.records.conftest import Backend


def test_store_refuses_second_job_when_model_has_active_job(store: RecordStore) -> None:
    store.create_job("job-1", "m", "ci")
    with pytest.raises(Conflict, match="already has job job-1 in progress"):
        store.create_job("job-2", "m", "ci")
    store.create_job("job-3", "other", "ci")  # another model is fine
    store.update_job("job-1", state="failed", error="boom")
    store.create_job("job-4", "m", "ci")  # finished jobs do not block
    assert [j.id for j in store.jobs("m")] == ["job-4", "job-1"]  # newest first
    assert {j.id for j in store.jobs()} == {"job-1", "job-3", "job-4"}
    assert [j.id for j in store.jobs(limit=1)] == ["job-4"]


def test_store_reports_jobs_truthfully_when_reopened_after_crash(backend: Backend) -> None:
    store = backend.open()
    for job_id in ("done", "broken", "running", "rolling"):
        store.create_job(job_id, job_id, "ci")
    done = store.update_job("done", state="succeeded", version=3, spec={"format": "onnx"})
    assert done.finished_at == done.updated_at  # a final state stamps its end
    store.update_job("broken", state="failed", error="INT8 missed the budget")
    store.update_job("running", state="converting", worker_pid=4242,
                     steps=with_step((), "convert", "running", fraction=0.25))
    store.update_job("rolling", state="rolling_out", steps=with_step((), "rollout", "running"))
    # no close(): the process died
    reopened = backend.open()
    assert sorted(reopened.fail_interrupted("worker died", {"rolling_out": "interrupted"})
                  ) == ["rolling", "running"]
    assert reopened.active_jobs() == []
    done = reopened.job("done")
    assert (done.state, done.version, done.spec) == ("succeeded", 3, {"format": "onnx"})
    assert reopened.job("broken").error == "INT8 missed the budget"
    for job_id, why in (("running", "worker died"), ("rolling", "interrupted")):
        job = reopened.job(job_id)
        assert (job.state, job.error, job.steps[0].state, job.steps[0].detail) == (
            "failed", why, "failed", why)
        assert job.finished_at is not None
    assert reopened.job("running").worker_pid == 4242
    assert reopened.job("running").steps[0].fraction == 0.25
    with pytest.raises(JobNotFound):
        reopened.job("nope")
    with pytest.raises(JobNotFound):
        reopened.update_job("nope", state="failed")


def test_store_keeps_versions_models_and_rollouts_when_reopened(backend: Backend) -> None:
    store = backend.open()
    store.put_version(VersionRecord("m", 2, "serving", "name: 'm'", 100.5, precision="int8",
                                    job_id="j", metadata={"top1": 0.75}, report="r.json"))
    store.put_model(ModelRecord("m", "serving", 0.0, serving_version=2, previous_version=1,
                                pools=("a", "b"), keep_warm={"interval_s": 5}))
    store.put_model(ModelRecord("gone", "unloaded", 0.0))
    store.delete_model("gone")
    first = store.put_rollout(_rollout("j1", started_at=10.0, state="rolled_back"))
    latest = store.put_rollout(_rollout("j2", started_at=20.0, step=1, percent=25,
                                        decisions=({"verdict": "go", "p99_ms": 12.5},)))
    store.close()
    reopened = backend.open()
    assert reopened.version("m", 2) == VersionRecord(
        "m", 2, "serving", "name: 'm'", 100.5, precision="int8", job_id="j",
        metadata={"top1": 0.75}, report="r.json")
    assert reopened.version("m", 9) is None
    model = reopened.model("m")
    assert model is not None and model.pools == ("a", "b") and model.previous_version == 1
    assert model.keep_warm == {"interval_s": 5} and model.updated_at > 0
    assert [m.name for m in reopened.models()] == ["m"] and reopened.model("gone") is None
    assert reopened.rollout("m") == latest and latest.updated_at > 0
    assert reopened.active_rollouts() == [latest]
    assert first.state == "rolled_back" and reopened.rollout("other") is None
    reopened.put_rollout(_rollout("j2", started_at=20.0, state="promoted"))  # replaced
    assert reopened.active_rollouts() == []


def test_version_numbers_never_reused_when_versions_end(store: RecordStore) -> None:
    assert (store.version_floor("m"), store.highest_version("m")) == (1, 0)
    for number, state in ((1, "serving"), (2, "available")):
        store.put_version(VersionRecord("m", number, state, "c", time.time(), job_id="j"))
    store.set_version_state("m", 2, "serving")
    store.set_version_state("m", 1, "available")
    store.end_version("m", 2, "failed", "did not go live")
    ended = store.version("m", 2)
    assert ended is not None and (ended.state, ended.reason, ended.job_id) == (
        "failed", "did not go live", "j")  # the rest of the record is kept
    assert ended.ended_at is not None and store.live_version("m", 2) is None
    store.delete_version("m", 1)
    store.end_version("m", 3, "rolled_back", "its job died before recording it")
    assert [(v.version, v.state) for v in store.versions("m")] == [
        (1, "deleted"), (2, "failed"), (3, "rolled_back")]
    assert store.versions("m", live=True) == []
    assert store.version_floor("m") == 4  # 1..3 never again
    assert store.issue_version("m") == 4
    assert store.issue_version("m", at_least=10) == 10  # above the versions on disk
    assert store.issue_version("m") == 11
    assert store.version_floor("other") == 1  # per model
    with pytest.raises(ValueError, match="not a final version state"):
        store.end_version("m", 1, "serving", "no")


def test_store_issues_distinct_numbers_when_two_stores_issue_at_once(backend: Backend) -> None:
    stores = [backend.open(), backend.open()]  # two replicas (or processes) on one place
    issued = _at_once([lambda s=s: [s.issue_version("m") for _ in range(25)]
                       for s in stores])
    numbers = [n for batch in issued for n in batch]
    assert sorted(numbers) == list(range(1, 51))  # none twice, none skipped
    assert stores[0].highest_version("m") == 50


def test_store_admits_one_active_job_when_two_stores_create_at_once(backend: Backend) -> None:
    stores = [backend.open() for _ in range(4)]

    def create(store: RecordStore, n: int) -> str:
        try:
            store.create_job(f"job-{n}", "m", "ci")
            return "created"
        except Conflict:
            return "refused"

    outcomes = _at_once([lambda s=s, n=n: create(s, n)
                         for n, s in enumerate(stores)])
    assert sorted(outcomes) == ["created", "refused", "refused", "refused"]
    assert len(stores[0].active_jobs()) == 1


def test_store_keeps_recorded_demand_whole_when_reopened(backend: Backend) -> None:
    store = backend.open()
    assert store.recorded_demand() is None  # never recorded
    before = time.time()
    saved = store.record_demand({"hot": 12.5, "warm": 0.125})
    assert before <= saved.saved_at <= time.time()
    reopened = backend.open()  # a restart, or the next leader
    assert reopened.recorded_demand() == saved
    reopened.record_demand({"warm": 3.0})  # written whole: hot is no longer recorded
    recorded = store.recorded_demand()
    assert recorded is not None and recorded.rates == {"warm": 3.0}
    store.record_demand({})
    recorded = backend.open().recorded_demand()
    assert recorded is not None and recorded.rates == {}


def test_store_keeps_tenancy_override_when_reopened(backend: Backend) -> None:
    store = backend.open()
    assert store.tenancy_override() is None  # the configuration file's applies
    document = {"default": {"priority": "standard"},
                "tenants": [{"name": "pay", "priority": "critical", "weight": 2.5,
                             "keys": ["sha256:" + "a" * 64], "max_in_flight": 3}]}
    put = store.set_tenancy_override(document)
    assert (put.document, put.deleted) == (document, False)
    reopened = backend.open()
    assert reopened.tenancy_override() == put
    deleted = reopened.set_tenancy_override(None)  # DELETE: tenancy off, not the file's
    assert deleted.deleted and deleted.changed_at >= put.changed_at
    assert backend.open().tenancy_override() == deleted


def test_export_then_import_reproduces_records_when_store_is_emptied(backend: Backend) -> None:
    store = backend.open()
    store.create_job("j", "m", "ci")
    store.update_job("j", state="succeeded", version=1,
                     steps=with_step((), "convert", "done", detail="ok"))
    store.put_version(VersionRecord("m", 1, "serving", "c", 1.25, metadata={"a": [1, 2.5]}))
    store.issue_version("m", at_least=7)  # a number issued without a record
    store.put_rollout(_rollout("j", started_at=3.0, decisions=({"x": None},)))
    store.put_model(ModelRecord("m", "serving", 0.0, serving_version=1))
    store.record_demand({"m": 1.5, "n": 0.25})
    store.set_tenancy_override({"tenants": [{"name": "t", "keys": ["k" * 20]}]})
    records = store.export_records()
    assert records.counts() == {"jobs": 1, "versions": 1, "version_numbers": 1,
                                "rollouts": 1, "models": 1, "demand_models": 2,
                                "tenancy_overrides": 1}
    store.import_records(type(records)())
    assert store.export_records().empty and store.version_floor("m") == 1
    assert store.recorded_demand() is None and store.tenancy_override() is None
    store.import_records(records)
    assert store.export_records() == records and store.version_floor("m") == 8


def _rollout(job_id: str, started_at: float, state: str = "running",
             **fields: Any) -> RolloutRecord:
    return RolloutRecord(job_id, "m", 1, 2, {"steps": [10, 50]}, state, started_at, 0.0,
                         **fields)


def _at_once(calls: list[Callable[[], Any]]) -> list[Any]:
    """Run the calls on threads of their own, released together; their results."""
    start = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            start.wait()
            results[i] = calls[i]()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    return results
