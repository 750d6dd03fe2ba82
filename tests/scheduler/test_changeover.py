"""The apply sequence as a state machine over observed snapshots (issue 12, points 2, 3).

Everything here runs against :class:`ScriptedCluster` (tests/scheduler/fake_cluster.py)
or hand-written snapshots: no Kubernetes API server is involved."""

from __future__ import annotations

import pytest

from scheduler.apply import ChangeoverResult, apply_plan, run_changeover
from scheduler.changeover import (
    Apply,
    Changeover,
    ChangeoverSettings,
    ChangeoverState,
    ClusterSnapshot,
    Cordon,
    Delete,
    DeploymentView,
    Evict,
    PodView,
    Relabel,
    SetRotation,
    build_changeover,
    pending_count,
    step,
)
from scheduler.errors import ApplyFailed
from scheduler.migparted import MIG_CONFIG_LABEL, MIG_CONFIG_STATE_LABEL
from scheduler.plan import PlanRecord
from scheduler.planner import plan_placement
from tests.scheduler.builders import gpu, node, pool, request
from tests.scheduler.fake_cluster import ScriptedCluster, mig_manager_script

SETTINGS = ChangeoverSettings(rotation_settle_s=10, drain_grace_s=30, evict_timeout_s=60,
                           mig_timeout_s=120, ready_timeout_s=60)  # fmt: skip


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(scope="module")
def record() -> PlanRecord:
    """busy/1 is rebuilt for b's 3g (c's 1g there is destroyed, c moves to busy/0's idle
    1g); spare/0 gets MIG enabled for d (nothing runs there)."""
    nodes = [
        node("busy", [gpu(0, layout=[(9, 0, "a"), (14, 4, None), (19, 6, None)]),
                      gpu(1, layout=[(19, 0, "c")])], labels={"zone": "z1"}),
        node("spare", [gpu(0, enabled=False)], labels={"zone": "z2"}),
    ]  # fmt: skip
    pools = [
        pool("a", {9: 100}),
        pool("b", {9: 100}, constraints={"node_selector": {"zone": "z1"}}),
        pool("c"),
        pool("d", {0: 100}, target=50, constraints={"node_selector": {"zone": "z2"}}),
    ]
    req = request(nodes, pools)
    plan = plan_placement(req)
    assert [g.key for g in plan.gpus if g.repartition] == ["busy/1", "spare/0"]
    return PlanRecord(request=req, plan=plan)


@pytest.fixture(scope="module")
def changeover(record: PlanRecord) -> Changeover:
    return build_changeover(record)


def pod(name: str, node: str, resource: str, pool_name: str, **extra: object) -> PodView:
    return PodView(name, "infergate", node, (resource,), pool_name, in_flight=0, **extra)  # type: ignore[arg-type]


def cluster(**extra: object) -> ScriptedCluster:
    labels = {
        "busy": {MIG_CONFIG_LABEL: "all-balanced", MIG_CONFIG_STATE_LABEL: "success"},
        "spare": {MIG_CONFIG_LABEL: "all-disabled", MIG_CONFIG_STATE_LABEL: "success"},
    }
    pods = {
        "a-0": pod("a-0", "busy", "nvidia.com/mig-3g.40gb", "a"),
        "c-0": pod("c-0", "busy", "nvidia.com/mig-1g.10gb", "c"),
    }
    old = DeploymentView("triton-c-old", "infergate", "busy", 1, 1)
    return ScriptedCluster(node_labels=labels, pods=pods, deployments={old.name: old},
                           **extra)  # type: ignore[arg-type]  # fmt: skip


def run(changeover: Changeover, c: ScriptedCluster) -> ChangeoverResult:
    clock = Clock()
    return run_changeover(changeover, c, SETTINGS, clock=clock, sleep=clock.sleep, poll_s=5)


def test_build_changeover_orders_idle_nodes_first_and_drains_only_rebuilt_profiles(
    changeover: Changeover,
) -> None:
    assert [(n.node, n.disrupted) for n in changeover.nodes] == [("spare", 0), ("busy", 1)]
    busy = changeover.nodes[1]
    # Only busy/1 is rebuilt and it holds a 1g: pods asking for a 3g cannot be on it.
    assert busy.drain_resources == {"nvidia.com/mig-1g.10gb"}
    assert {o["kind"] for o in changeover.prepare} == {
        "PriorityClass", "ConfigMap", "Service", "PodDisruptionBudget"}  # fmt: skip


def test_changeover_drains_relabels_waits_brings_up_and_restores_when_mig_manager_succeeds(
    changeover: Changeover,
) -> None:
    c = cluster(scripts={"busy": mig_manager_script("applies"),
                         "spare": mig_manager_script("reboots")})  # fmt: skip
    result = run(changeover, c)
    assert result.state.phase == "done", result.state.reason
    assert result.state.completed == ("spare", "busy")
    busy = [a for a in c.actions if getattr(a, "node", None) == "busy"
            or getattr(a, "pod", None) == "c-0"]  # fmt: skip
    assert busy == [
        Cordon("busy"),
        SetRotation("c-0", "infergate", False),
        Evict("c-0", "infergate"),
        Relabel("busy", changeover.nodes[1].config),
        Cordon("busy", False),
    ]
    order = [type(a).__name__ for a in c.actions]
    relabel_busy = c.actions.index(Relabel("busy", changeover.nodes[1].config))
    bring_up = next(i for i, a in enumerate(c.actions) if isinstance(a, Apply)
                    and a.objects == changeover.nodes[1].deployments)  # fmt: skip
    assert relabel_busy < bring_up < c.actions.index(Cordon("busy", False))
    assert Delete("Deployment", "triton-c-old", "infergate") in c.actions  # stale, pruned
    assert "a-0" in c.pods and c.pods["a-0"].in_rotation  # a's 3g was never at risk
    assert order[0] == "Apply"  # PriorityClasses, ConfigMap, Services, PDBs first
    assert c.node_labels["busy"][MIG_CONFIG_LABEL] == changeover.nodes[1].config


def test_changeover_does_not_take_the_previous_success_for_this_change() -> None:
    # Await-mig on busy; the read still shows the old config with its success (the API
    # read lagged the relabel, or another writer): that is not this change's state.
    changeover = Changeover(prepare=(), nodes=(), other_deployments=(), namespace="infergate")
    from scheduler.changeover import NodeChange

    change = NodeChange("busy", "infergate-new", frozenset(), (), 0)
    changeover = Changeover((), (change,), (), "infergate")
    waiting = ChangeoverState(phase="await-mig", deadline=100.0)

    def seen(config: str, state: str | None) -> ClusterSnapshot:
        labels = {MIG_CONFIG_LABEL: config} | ({} if state is None else
                                               {MIG_CONFIG_STATE_LABEL: state})  # fmt: skip
        return ClusterSnapshot(at=10.0, node_labels={"busy": labels})

    assert step(changeover, waiting, seen("all-balanced", "success"))[0].phase == "await-mig"
    assert step(changeover, waiting, seen("infergate-new", None))[0].phase == "await-mig"
    assert step(changeover, waiting, seen("infergate-new", "pending"))[0].phase == "await-mig"
    assert step(changeover, waiting, seen("infergate-new", "success"))[0].phase == "bring-up"


def test_changeover_waits_out_a_lagging_read_of_the_old_labels_when_relabelled(
    changeover: Changeover,
) -> None:
    # Reads show busy's old labels (all-balanced, success) for 3 observations after the
    # relabel: the pools must not come up until the MIG manager really is done.
    c = cluster(lag={"busy": 3}, scripts={"busy": mig_manager_script("applies")})
    result = run(changeover, c)
    assert result.state.phase == "done", result.state.reason
    bring_up = next(i for i, a in enumerate(c.actions) if isinstance(a, Apply)
                    and a.objects == changeover.nodes[1].deployments)  # fmt: skip
    assert c.states_at_action[bring_up]["busy"] == "success"
    relabel = c.actions.index(Relabel("busy", changeover.nodes[1].config))
    assert c.observations_between(relabel, bring_up) >= 4  # 3 stale reads + the script


def test_changeover_accepts_success_at_once_when_the_config_was_already_applied(
    changeover: Changeover,
) -> None:
    c = cluster(scripts={"busy": mig_manager_script("already-applied"),
                         "spare": mig_manager_script("already-applied")})  # fmt: skip
    assert run(changeover, c).state.phase == "done"


def test_changeover_fails_and_keeps_the_node_cordoned_when_mig_manager_reports_failed(
    changeover: Changeover,
) -> None:
    c = cluster(scripts={"busy": mig_manager_script("fails")})
    result = run(changeover, c)
    assert result.state.phase == "failed"
    assert "reported failed" in result.state.reason and "busy" in result.state.reason
    assert c.unschedulable["busy"] is True  # a person must look at the GPUs
    assert not any(isinstance(a, Apply) and a.objects == changeover.nodes[1].deployments
                   for a in c.actions)  # fmt: skip


def test_changeover_fails_after_the_timeout_when_the_state_never_arrives(
        changeover: Changeover) -> None:
    c = cluster(scripts={"spare": mig_manager_script("hangs")})
    result = run(changeover, c)
    assert result.state.phase == "failed"
    assert "did not report success" in result.state.reason and "120s" in result.state.reason
    assert result.state.completed == ()
    assert not any(isinstance(a, Relabel) and a.node == "busy" for a in c.actions)


def test_changeover_fails_naming_the_pod_when_its_disruption_budget_never_lets_it_go(
    changeover: Changeover,
) -> None:
    c = cluster(refuse={"c-0": 10_000})
    result = run(changeover, c)
    assert result.state.phase == "failed"
    assert "c-0 will not leave node busy" in result.state.reason
    assert "disruption budget" in result.state.reason
    assert c.pods["c-0"].in_rotation and c.unschedulable["busy"] is False  # rolled back
    assert not any(isinstance(a, Relabel) and a.node == "busy" for a in c.actions)


def test_changeover_retries_the_eviction_when_the_budget_allows_it_later(
        changeover: Changeover) -> None:
    c = cluster(refuse={"c-0": 2})
    assert run(changeover, c).state.phase == "done"
    assert c.actions.count(Evict("c-0", "infergate")) == 3


def test_changeover_evicts_only_after_in_flight_requests_finish_when_a_pod_is_busy(
    changeover: Changeover,
) -> None:
    c = cluster(in_flight={"c-0": [4, 3, 1, 0]})
    c.pods["c-0"] = PodView("c-0", "infergate", "busy", ("nvidia.com/mig-1g.10gb",), "c",
                            in_flight=5)  # fmt: skip
    seen: list[int | None] = []
    real_execute = c.execute

    def execute(action):  # type: ignore[no-untyped-def]
        if isinstance(action, Evict):
            seen.append(c.pods[action.pod].in_flight)
        return real_execute(action)

    c.execute = execute  # type: ignore[method-assign]
    assert run(changeover, c).state.phase == "done"
    assert seen == [0]


def test_changeover_recreates_a_priority_class_when_its_value_changes(
        changeover: Changeover) -> None:
    (cls,) = [o for o in changeover.prepare if o["kind"] == "PriorityClass"]
    name = cls["metadata"]["name"]
    c = cluster(priority_classes={name: cls["value"] + 1})
    assert run(changeover, c).state.phase == "done"
    assert c.actions.index(Delete("PriorityClass", name)) < next(
        i for i, a in enumerate(c.actions) if isinstance(a, Apply)
    )
    assert c.priority_classes[name] == cls["value"]


def test_changeover_waits_while_an_earlier_change_is_still_pending(changeover: Changeover) -> None:
    c = cluster(scripts={"spare": mig_manager_script("applies")})
    c.node_labels["spare"][MIG_CONFIG_STATE_LABEL] = "pending"  # nothing will finish it
    result = run(changeover, c)
    assert result.state.phase == "failed" and "stayed pending" in result.state.reason
    assert not any(isinstance(a, Relabel) for a in c.actions)


def test_apply_plan_raises_apply_failed_with_the_reason_when_the_rollout_fails(
    record: PlanRecord,
) -> None:
    clock = Clock()
    c = cluster(scripts={"busy": mig_manager_script("fails")})
    with pytest.raises(ApplyFailed, match="reported failed"):
        apply_plan(record, c, changeover_settings=SETTINGS, clock=clock, sleep=clock.sleep)


def test_pending_count_sums_triton_pending_requests_when_metrics_are_scraped() -> None:
    text = (
        "# HELP nv_inference_pending_request_count Instantaneous number of pending requests\n"
        'nv_inference_pending_request_count{model="a",version="1"} 2\n'
        'nv_inference_pending_request_count{model="b",version="1"} 1\n'
        'nv_inference_count{model="a",version="1"} 90\n'
    )
    assert pending_count(text) == 3
    assert pending_count("nv_inference_count 1\n") is None


def test_changeover_keeps_a_pod_out_of_rotation_for_the_settle_time_when_it_is_idle_at_once(
    changeover: Changeover,
) -> None:
    # in-flight is 0 from the start; the gateway may still hold the pod until it
    # re-resolves the Service, so the eviction waits rotation_settle_s (10 s here).
    c = cluster()
    clock = Clock()
    out_at: list[float] = []
    evict_at: list[float] = []
    real_execute = c.execute

    def execute(action):  # type: ignore[no-untyped-def]
        if action == SetRotation("c-0", "infergate", False):
            out_at.append(clock.now)
        if action == Evict("c-0", "infergate"):
            evict_at.append(clock.now)
        return real_execute(action)

    c.execute = execute  # type: ignore[method-assign]
    result = run_changeover(changeover, c, SETTINGS, clock=clock, sleep=clock.sleep, poll_s=5)
    assert result.state.phase == "done"
    assert evict_at[0] - out_at[0] >= 10


def test_build_changeover_drains_every_gpu_pod_of_a_node_when_a_gpus_mig_mode_changes() -> None:
    # GPU 0 keeps x's 1g; GPU 1 has MIG off and gets y's 7g: enabling MIG may reset the
    # GPUs or reboot the node, so x's pod leaves too (its Deployment comes back after).
    nodes = [node("n", [gpu(0, layout=[(19, 0, "x")]), gpu(1, enabled=False)])]
    req = request(nodes, [pool("x"), pool("y", {0: 100}, target=50)])
    plan = plan_placement(req)
    assert [g.repartition for g in plan.gpus] == [False, True]
    (change,) = build_changeover(PlanRecord(request=req, plan=plan)).nodes
    assert change.mode_change and change.disrupted == 0
    c = ScriptedCluster(node_labels={"n": {}},
                        pods={"x-0": pod("x-0", "n", "nvidia.com/mig-1g.10gb", "x")})  # fmt: skip
    assert run(build_changeover(PlanRecord(request=req, plan=plan)), c).state.phase == "done"
    assert Evict("x-0", "infergate") in c.actions


def test_changeover_labels_pool_pods_from_before_the_rotation_label_ahead_of_the_services(
    changeover: Changeover,
) -> None:
    c = cluster()
    c.pods["old-0"] = PodView("old-0", "infergate", "elsewhere", ("nvidia.com/mig-3g.40gb",),
                              "a", rotation_labelled=False)  # fmt: skip
    assert run(changeover, c).state.phase == "done"
    first_apply = next(i for i, a in enumerate(c.actions) if isinstance(a, Apply))
    assert c.actions.index(SetRotation("old-0", "infergate", True)) < first_apply
