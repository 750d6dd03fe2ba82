"""The SQLite store: one active job per model, records that survive a restart, jobs
interrupted by a dead gateway reported as failed, a database of user_version 1 given the
tables of demand and live tenancy."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gateway.errors import Conflict, JobNotFound
from gateway.lifecycle.records.jobs import (
    SCHEMA_VERSION,
    LifecycleStore,
    ModelRecord,
    VersionRecord,
    with_step,
)


def test_store_refuses_second_job_when_model_has_active_job(tmp_path: Path) -> None:
    store = LifecycleStore(tmp_path / "db.sqlite")
    store.create_job("job-1", "m", "ci")
    with pytest.raises(Conflict, match="already has job job-1 in progress"):
        store.create_job("job-2", "m", "ci")
    store.create_job("job-3", "other", "ci")  # another model is fine
    store.update_job("job-1", state="failed", error="boom")
    store.create_job("job-4", "m", "ci")  # finished jobs do not block


def test_store_reports_jobs_truthfully_when_reopened_after_crash(tmp_path: Path) -> None:
    store = LifecycleStore(tmp_path / "db.sqlite")
    for job_id in ("done", "broken", "running"):
        store.create_job(job_id, job_id, "ci")
    store.update_job("done", state="succeeded", version=3)
    store.update_job("broken", state="failed", error="INT8 missed the budget")
    steps = with_step((), "convert", "running")
    store.update_job("running", state="converting", steps=steps)
    # no close(): the process died
    reopened = LifecycleStore(tmp_path / "db.sqlite")
    assert reopened.fail_interrupted("gateway restarted") == ["running"]
    assert reopened.job("done").state == "succeeded" and reopened.job("done").version == 3
    assert reopened.job("broken").error == "INT8 missed the budget"
    running = reopened.job("running")
    assert running.state == "failed" and running.error == "gateway restarted"
    assert running.steps[0].state == "failed" and running.finished_at is not None
    with pytest.raises(JobNotFound):
        reopened.job("nope")

def test_interrupted_jobs_get_their_states_reason_when_one_is_given(tmp_path: Path) -> None:
    store = LifecycleStore(tmp_path / "db.sqlite")
    store.create_job("convert", "a", "ci")
    store.update_job("convert", state="converting", steps=with_step((), "convert", "running"))
    store.create_job("roll", "b", "ci")
    store.update_job("roll", state="rolling_out", steps=with_step((), "rollout", "running"))
    reopened = LifecycleStore(tmp_path / "db.sqlite")
    failed = reopened.fail_interrupted("worker died", {"rolling_out": "interrupted"})
    assert sorted(failed) == ["convert", "roll"]
    for job_id, why in (("convert", "worker died"), ("roll", "interrupted")):
        job = reopened.job(job_id)
        assert (job.state, job.error, job.steps[0].state, job.steps[0].detail) == (
            "failed", why, "failed", why)



def test_store_keeps_versions_and_models_when_reopened(tmp_path: Path) -> None:
    store = LifecycleStore(tmp_path / "db.sqlite")
    store.put_version(VersionRecord("m", 2, "serving", "name: 'm'", time.time(),
                                    precision="int8", report="report.json"))
    store.put_model(ModelRecord("m", "serving", 0.0, serving_version=2, previous_version=1,
                                pools=("a",), keep_warm={"interval_s": 5}))
    store.close()
    reopened = LifecycleStore(tmp_path / "db.sqlite")
    assert reopened.version("m", 2).precision == "int8"  # type: ignore[union-attr]
    model = reopened.model("m")
    assert model is not None and model.pools == ("a",) and model.previous_version == 1
    assert model.keep_warm == {"interval_s": 5}


def test_steps_record_start_and_end_when_pipeline_moves_on() -> None:
    steps = with_step((), "unpack", "running", now=1.0)
    steps = with_step(steps, "export", "running", now=2.0)  # finishes "unpack"
    steps = with_step(steps, "export", "running", fraction=0.5, now=2.5)
    steps = with_step(steps, "export", "failed", "corrupt", now=3.0)
    assert [(s.name, s.state, s.started_at, s.finished_at) for s in steps] == [
        ("unpack", "done", 1.0, 2.0), ("export", "failed", 2.0, 3.0)]
    assert steps[1].detail == "corrupt" and steps[1].fraction == 0.5


def test_version_1_database_gains_demand_and_tenancy_when_opened(tmp_path: Path) -> None:
    store = LifecycleStore(tmp_path / "db.sqlite")
    store.put_model(ModelRecord("m", "serving", 0.0))
    store._db.executescript("DROP TABLE recorded_demand; DROP TABLE tenancy_override; "
                            "PRAGMA user_version = 1;")  # as a gateway before them left it
    store.close()
    reopened = LifecycleStore(tmp_path / "db.sqlite")
    assert reopened._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 2
    assert reopened.model("m") is not None  # kept
    assert reopened.recorded_demand() is None and reopened.tenancy_override() is None
    reopened.record_demand({"m": 1.0})
    assert reopened.recorded_demand().rates == {"m": 1.0}  # type: ignore[union-attr]
