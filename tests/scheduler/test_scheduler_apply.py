from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from unittest.mock import create_autospec

import pytest
import yaml
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from scheduler.apply import FIELD_MANAGER, ClusterApplier, apply_plan, write_directory
from scheduler.errors import ApplyFailed
from scheduler.plan import PlanRecord


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def node_with(state: str | None) -> SimpleNamespace:
    labels = {} if state is None else {"nvidia.com/mig.config.state": state}
    return SimpleNamespace(metadata=SimpleNamespace(labels=labels))


def dynamic_client() -> DynamicClient:
    client = create_autospec(DynamicClient, instance=True)
    client.resources = SimpleNamespace(get=lambda api_version, kind: f"{api_version}/{kind}")
    return client


def test_write_directory_writes_manifests_and_record_when_no_cluster(
    example_record: PlanRecord, tmp_path: Path
) -> None:
    done = write_directory(example_record, tmp_path / "out")
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert files == [
        "00-priorityclasses.yaml", "10-mig-parted-configmap.yaml", "20-node-labels.yaml",
        "30-pools.yaml", "layout.svg", "mig-parted-config.yaml", "plan.json",
    ]  # fmt: skip
    pools = list(yaml.safe_load_all((tmp_path / "out" / "30-pools.yaml").read_text()))
    assert {o["kind"] for o in pools} == {"Service", "Deployment"}
    assert len(done) == sum(
        len(list(yaml.safe_load_all(p.read_text()))) for p in (tmp_path / "out").glob("*0-*.yaml")
    )
    again = PlanRecord.model_validate_json((tmp_path / "out" / "plan.json").read_text())
    assert again == example_record


def test_write_directory_raises_apply_failed_when_path_is_a_file(
    example_record: PlanRecord, tmp_path: Path
) -> None:
    blocker = tmp_path / "taken"
    blocker.write_text("x")
    with pytest.raises(ApplyFailed, match="cannot write"):
        write_directory(example_record, blocker / "out")


def test_cluster_applier_server_side_applies_each_object_when_called(
    example_record: PlanRecord,
) -> None:
    client = dynamic_client()
    clock = FakeClock()
    client.get.return_value = node_with("success")
    applier = ClusterApplier(client, clock=clock, sleep=clock.sleep)
    done = apply_plan(example_record, applier, wait_timeout_s=60)
    calls = client.server_side_apply.call_args_list
    assert len(calls) == len(done) > 0
    assert all(c.kwargs["field_manager"] == FIELD_MANAGER and c.kwargs["force_conflicts"]
               for c in calls)  # fmt: skip
    kinds = [c.kwargs["body"]["kind"] for c in calls]
    assert kinds.index("Node") < kinds.index("Deployment")
    client.get.assert_called()  # waited for MIG Manager on the relabelled node


def test_cluster_applier_raises_apply_failed_when_api_refuses() -> None:
    client = dynamic_client()
    client.server_side_apply.side_effect = ApiException(status=409, reason="Conflict")
    applier = ClusterApplier(client)
    body = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": "x"}}
    with pytest.raises(ApplyFailed, match="Service/s: the API server answered 409"):
        applier.apply([body])


def test_wait_for_mig_returns_when_state_turns_success() -> None:
    client = dynamic_client()
    client.get.side_effect = [node_with("pending"), node_with("rebooting"), node_with("success")]
    clock = FakeClock()
    ClusterApplier(client, clock=clock, sleep=clock.sleep).wait_for_mig(["n"], 100, poll_s=5)
    assert clock.now == 10


def test_wait_for_mig_raises_when_manager_reports_failure() -> None:
    client = dynamic_client()
    client.get.return_value = node_with("failed")
    clock = FakeClock()
    with pytest.raises(ApplyFailed, match="failed to repartition node n"):
        ClusterApplier(client, clock=clock, sleep=clock.sleep).wait_for_mig(["n"], 100)


def test_wait_for_mig_times_out_when_state_never_settles() -> None:
    client = dynamic_client()
    client.get.return_value = node_with("pending")
    clock = FakeClock()
    with pytest.raises(ApplyFailed, match="not done in 30s"):
        ClusterApplier(client, clock=clock, sleep=clock.sleep).wait_for_mig(["n"], 30, poll_s=10)
