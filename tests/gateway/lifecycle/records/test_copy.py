"""``infergate records copy``: a SQLite file's records into PostgreSQL, exactly (the
highest version number ever issued, the residency's demand and the tenancy changed live
included); again, nothing changes; a target that
holds other records refused unless --replace."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gateway.lifecycle.records.jobs import LifecycleStore
from gateway.lifecycle.records.postgres import PostgresStore
from gateway.lifecycle.records.store import ModelRecord, RolloutRecord, VersionRecord, with_step
from infergate.records_cli import app

pytestmark = pytest.mark.integration  # a real PostgreSQL: make test installs it

runner = CliRunner()


def sqlite_records(path: Path) -> LifecycleStore:
    store = LifecycleStore(path)
    store.create_job("j1", "m", "ci")
    store.update_job("j1", state="succeeded", version=2,
                     steps=with_step((), "convert", "done", detail="fp16"))
    store.create_job("j2", "m", "ci")  # active: the gateway died during it
    store.put_version(VersionRecord("m", 1, "available", "c1", 1.5, precision="fp32"))
    store.put_version(VersionRecord("m", 2, "serving", "c2", 2.5, metadata={"top1": 0.8}))
    store.end_version("m", 3, "failed", "refused by the rollout")
    store.put_rollout(RolloutRecord("j1", "m", 1, 2, {"steps": [10]}, "promoted", 3.0, 0.0,
                                    decisions=({"verdict": "promote", "share": 0.1},)))
    store.put_model(ModelRecord("m", "serving", 0.0, serving_version=2, previous_version=1,
                                pools=("cpu",), keep_warm={"interval_s": 5.0}))
    store.record_demand({"m": 12.5, "other": 0.5})
    store.set_tenancy_override({"tenants": [{"name": "t", "keys": ["sha256:" + "b" * 64]}]})
    return store


def copy(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["copy", *args])
    return result.exit_code, result.output


def test_copy_moves_every_record_when_target_is_empty(tmp_path: Path, pg_url: str) -> None:
    source = sqlite_records(tmp_path / "lifecycle.db")
    code, out = copy(str(tmp_path / "lifecycle.db"), pg_url)
    assert code == 0, out
    assert ("records copied: 2 jobs, 3 versions, 1 version_numbers, 1 rollouts, 1 models, "
            "2 demand_models, 1 tenancy_overrides") in out
    target = PostgresStore(pg_url)
    assert target.export_records() == source.export_records()
    assert target.recorded_demand() == source.recorded_demand() is not None
    assert target.tenancy_override() == source.tenancy_override() is not None
    assert target.version_floor("m") == 4  # 3 failed, but was issued: never again
    assert [j.id for j in target.active_jobs()] == ["j2"]  # recovered by the new leader
    code, out = copy(str(tmp_path / "lifecycle.db"), pg_url)  # again
    assert code == 0 and "already there, nothing changed" in out, out
    target.close()
    source.close()


def test_copy_refuses_when_target_holds_other_records(tmp_path: Path, pg_url: str) -> None:
    source = sqlite_records(tmp_path / "lifecycle.db")
    target = PostgresStore(pg_url)
    target.put_model(ModelRecord("other", "serving", 0.0))
    code, out = copy(str(tmp_path / "lifecycle.db"), pg_url)
    assert code == 1 and "holds other records (1 models)" in out and "--replace" in out, out
    assert [m.name for m in target.models()] == ["other"]  # untouched
    code, out = copy(str(tmp_path / "lifecycle.db"), pg_url, "--replace")
    assert code == 0 and "records copied" in out, out
    assert target.export_records() == source.export_records()
    target.close()
    source.close()


def test_copy_refuses_when_source_or_target_is_not_what_it_must_be(tmp_path: Path,
                                                                 pg_url: str) -> None:
    code, out = copy(str(tmp_path / "missing.db"), pg_url)
    assert code == 2 and "no SQLite file" in out, out
    assert not (tmp_path / "missing.db").exists()  # not created by looking
    LifecycleStore(tmp_path / "lifecycle.db").close()
    code, out = copy(str(tmp_path / "lifecycle.db"), str(tmp_path / "other.db"))
    assert code == 2 and "postgresql:// URL" in out, out
