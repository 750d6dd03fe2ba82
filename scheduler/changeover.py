"""Carrying a plan out on a live cluster, as a pure state machine over observed snapshots.

mig-parted cannot rebuild a GPU that a process still uses (destroying a busy instance
fails with ``IN_USE``) and the MIG manager does not evict anyone's pods, so every node
whose GPUs the plan rebuilds goes through, one node at a time:

1. **cordon** it, so that no new pod lands on it;
2. **rotate out** the pods that may hold a GPU being rebuilt (those requesting a MIG
   resource present on one: Kubernetes does not say which GPU a pod got; every GPU pod
   of the node when a GPU's MIG mode changes, since the MIG manager may then reset the
   GPUs or reboot the node) by relabelling them ``infergate.io/rotation=out``; the pool's
   Service stops selecting them, so the gateway stops sending them requests;
3. **quiesce**: wait ``rotation_settle_s`` (the gateway re-resolves the Service in its
   probe loop), then until their in-flight requests reach 0 (or ``drain_grace_s``);
4. **evict** them through the Eviction API, which respects the pool's
   PodDisruptionBudget while the rest of the pool serves; a refusal is retried until
   ``evict_timeout_s``, then the changeover fails naming the pod that will not leave;
5. **relabel** the node with its ``nvidia.com/mig.config`` and, in the same patch, clear
   ``nvidia.com/mig.config.state``: a ``success`` left from the previous change can then
   never be taken for this one's;
6. **await** this change's state: the label must show the new config, then ``pending`` /
   ``rebooting`` while it applies, then ``success`` (done) or ``failed`` (the changeover
   fails, the node stays cordoned for a person to look at); ``mig_timeout_s`` bounds it;
7. **bring up**: delete the node's Deployments the plan no longer has, apply the plan's
   Deployments for the node, uncordon;
8. **restore routing**: wait until the node's planned pods are ready, putting any pod
   still out of rotation back in.

Before the nodes: pool pods that predate the rotation label get ``rotation=in`` (the
Services select it), then PriorityClasses (one whose value changes is deleted and
recreated: the API server refuses to update ``value``), the mig-parted ConfigMap, Services,
PodDisruptionBudgets, and Deployments on untouched nodes that grow (capacity first).
After them: the remaining Deployments, and managed Deployments no longer in the plan are
deleted. Nodes that disrupt no pool instance go first (like nos and HAMi, idle capacity
is rebuilt before busy capacity), and each node changes once, all its GPUs together.

:func:`step` is pure: (changeover, state, snapshot) -> (state, actions). The code that
reads snapshots and performs actions (:mod:`scheduler.apply`) is thin. Snapshots must
be read from the API server (GETs), not from a lagging cache.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from scheduler.manifests import (
    MANAGED_BY,
    NODE_LABEL,
    ManifestSettings,
    build_manifests,
)
from scheduler.migparted import MIG_CONFIG_LABEL, MIG_CONFIG_STATE_LABEL, node_configs
from scheduler.plan import PlanRecord
from scheduler.profiles import GPU_TYPES

Obj = dict[str, Any]


# -- what is observed ---------------------------------------------------------------


@dataclass(frozen=True)
class PodView:
    name: str
    namespace: str
    node: str
    resources: tuple[str, ...]
    """NVIDIA resources its containers request (``nvidia.com/mig-3g.40gb``)."""
    pool: str | None = None
    ready: bool = True
    in_rotation: bool = True
    rotation_labelled: bool = True
    """False for a pool pod without ``infergate.io/rotation`` (made before the label was)."""
    terminating: bool = False
    in_flight: int | None = None
    """Requests the server is working on (Triton's pending count); None: not known."""


@dataclass(frozen=True)
class DeploymentView:
    name: str
    namespace: str
    node: str | None
    replicas: int
    ready_replicas: int
    managed: bool = True


@dataclass(frozen=True)
class ClusterSnapshot:
    at: float
    """Monotonic seconds when it was read."""
    node_labels: Mapping[str, Mapping[str, str]]
    unschedulable: Mapping[str, bool] = field(default_factory=dict)
    pods: tuple[PodView, ...] = ()
    deployments: tuple[DeploymentView, ...] = ()
    priority_classes: Mapping[str, int] = field(default_factory=dict)
    refusals: Mapping[str, str] = field(default_factory=dict)
    """Pod name -> why its last eviction was refused (e.g. a PodDisruptionBudget)."""


# -- what is done -------------------------------------------------------------------


@dataclass(frozen=True)
class Apply:
    objects: tuple[Obj, ...]


@dataclass(frozen=True)
class Delete:
    kind: str
    name: str
    namespace: str | None = None


@dataclass(frozen=True)
class Cordon:
    node: str
    unschedulable: bool = True


@dataclass(frozen=True)
class SetRotation:
    pod: str
    namespace: str
    in_rotation: bool


@dataclass(frozen=True)
class Evict:
    pod: str
    namespace: str


@dataclass(frozen=True)
class Relabel:
    """Set ``nvidia.com/mig.config`` and remove ``nvidia.com/mig.config.state``."""

    node: str
    config: str


Action = Apply | Delete | Cordon | SetRotation | Evict | Relabel


# -- the changeover ----------------------------------------------------------------------


@dataclass(frozen=True)
class ChangeoverSettings:
    rotation_settle_s: float = 15.0
    """Out of rotation at least this long before an eviction: the gateway re-resolves a
    pool's Service in its probe loop, so it may still send a request or two meanwhile."""
    drain_grace_s: float = 60.0
    evict_timeout_s: float = 300.0
    mig_timeout_s: float = 900.0
    ready_timeout_s: float = 900.0
    poll_s: float = 5.0
    """How often a waiting phase reads the cluster again."""


@dataclass(frozen=True)
class NodeChange:
    node: str
    config: str
    drain_resources: frozenset[str]
    """Pods requesting any of these may hold an instance on a GPU being rebuilt."""
    deployments: tuple[Obj, ...]
    disrupted: int
    """Pool instances on the node's rebuilt GPUs (0: only idle capacity changes)."""
    mode_change: bool = False
    """A GPU's MIG mode changes: the MIG manager may reset or reboot (``rebooting``), so
    every GPU pod of the node is drained, not only those of the rebuilt GPUs."""


@dataclass(frozen=True)
class Changeover:
    prepare: tuple[Obj, ...]
    """PriorityClasses, ConfigMap, Services, PodDisruptionBudgets."""
    nodes: tuple[NodeChange, ...]
    other_deployments: tuple[Obj, ...]
    """Deployments on nodes that are not rebuilt."""
    namespace: str

    @property
    def planned_deployments(self) -> frozenset[str]:
        names = [d["metadata"]["name"] for d in self.other_deployments]
        names += [d["metadata"]["name"] for n in self.nodes for d in n.deployments]
        return frozenset(names)


def build_changeover(record: PlanRecord, settings: ManifestSettings | None = None) -> Changeover:
    settings = settings or ManifestSettings()
    objects = build_manifests(record.plan, record.request.pools, settings)
    configs = node_configs(record.plan)
    current = {(n.name, g.index): g for n in record.request.fleet.nodes for g in n.gpus}
    drains: dict[str, set[str]] = {}
    disrupted: dict[str, int] = {}
    mode_changes: set[str] = set()
    for gpu in record.plan.gpus:
        if not gpu.repartition:
            continue
        spec, kind = current[(gpu.node, gpu.index)], GPU_TYPES[gpu.gpu_type]
        resources = drains.setdefault(gpu.node, set())
        disrupted.setdefault(gpu.node, 0)
        if spec.mig is None or not spec.mig.enabled:
            resources.add("nvidia.com/gpu")  # a whole GPU in use while MIG was off
            mode_changes.add(gpu.node)
            continue
        for inst in spec.mig.instances:
            resources.add(kind.resource_name(kind.resolve_profile(inst.profile) or 0))
            disrupted[gpu.node] += inst.pool is not None
    deployments = [o for o in objects if o["kind"] == "Deployment"]

    def on(node: str) -> tuple[Obj, ...]:
        return tuple(d for d in deployments if d["metadata"]["labels"].get(NODE_LABEL) == node)

    changes = sorted(
        (
            NodeChange(n, configs[n], frozenset(r), on(n), disrupted[n], n in mode_changes)
            for n, r in drains.items()
        ),
        key=lambda c: (c.disrupted, c.node),
    )
    rebuilt = set(drains)
    return Changeover(
        prepare=tuple(o for o in objects if o["kind"] not in ("Node", "Deployment")),
        nodes=tuple(changes),
        other_deployments=tuple(
            d for d in deployments if d["metadata"]["labels"].get(NODE_LABEL) not in rebuilt
        ),
        namespace=settings.namespace,
    )


# -- the state machine ----------------------------------------------------------------


@dataclass(frozen=True)
class ChangeoverState:
    phase: str = "prepare"
    node: int = 0
    """Index into ``Changeover.nodes`` of the node being changed."""
    deadline: float = 0.0
    targets: tuple[str, ...] = ()
    """Pods being drained off the node."""
    settle_until: float = 0.0
    reason: str = ""
    completed: tuple[str, ...] = ()

    @property
    def finished(self) -> bool:
        return self.phase in ("done", "failed")


Step = tuple[ChangeoverState, list[Action]]


def _grown_first(changeover: Changeover, snap: ClusterSnapshot) -> tuple[Obj, ...]:
    have = {d.name: d.replicas for d in snap.deployments}
    return tuple(
        d
        for d in changeover.other_deployments
        if d["spec"]["replicas"] >= have.get(d["metadata"]["name"], 0)
    )


def _prepare(changeover: Changeover, snap: ClusterSnapshot) -> list[Action]:
    # Pool pods from before the rotation label: label them first, or the Services applied
    # next (which select infergate.io/rotation=in) would drop them from every pool.
    actions: list[Action] = [
        SetRotation(p.name, p.namespace, True)
        for p in snap.pods
        if p.pool is not None and not p.rotation_labelled and not p.terminating
    ]
    for obj in changeover.prepare:
        name = obj["metadata"]["name"]
        if obj["kind"] != "PriorityClass":
            continue
        if snap.priority_classes.get(name, obj["value"]) != obj["value"]:
            actions.append(Delete("PriorityClass", name))  # value is immutable
    actions.append(Apply(changeover.prepare + _grown_first(changeover, snap)))
    return actions


def _stale(changeover: Changeover, snap: ClusterSnapshot, node: str | None) -> list[Action]:
    planned = changeover.planned_deployments
    return [
        Delete("Deployment", d.name, d.namespace)
        for d in snap.deployments
        if d.managed
        and d.namespace == changeover.namespace
        and d.name not in planned
        and (node is None or d.node == node)
    ]


def _fail(state: ChangeoverState, reason: str, actions: list[Action]) -> Step:
    return replace(state, phase="failed", reason=reason), actions


def _drain_targets(change: NodeChange, snap: ClusterSnapshot) -> tuple[str, ...]:
    return tuple(
        sorted(
            p.name
            for p in snap.pods
            if p.node == change.node
            and (
                change.drain_resources.intersection(p.resources)
                or (change.mode_change and any(r.startswith("nvidia.com/") for r in p.resources))
            )
        )
    )


def _rollback(change: NodeChange, state: ChangeoverState, snap: ClusterSnapshot) -> list[Action]:
    """Before the relabel nothing changed on the GPUs: put the pods back, uncordon."""
    out: list[Action] = [
        SetRotation(p.name, p.namespace, True)
        for p in snap.pods
        if p.name in state.targets and not p.in_rotation and not p.terminating
    ]
    return [*out, Cordon(change.node, False)]


def _drain(
    changeover: Changeover, state: ChangeoverState, snap: ClusterSnapshot, s: ChangeoverSettings
) -> Step:
    change = changeover.nodes[state.node]
    pods = {p.name: p for p in snap.pods if p.name in state.targets and p.node == change.node}
    if state.phase == "cordon":
        if not snap.unschedulable.get(change.node, False):
            return state, [Cordon(change.node)]
        targets = _drain_targets(change, snap)
        return replace(state, phase="rotate-out", targets=targets), []
    if state.phase == "rotate-out":
        waiting = [p for p in pods.values() if p.in_rotation]
        if waiting:
            return state, [SetRotation(p.name, p.namespace, False) for p in waiting]
        settle = snap.at + s.rotation_settle_s
        quiesce = replace(state, phase="quiesce", deadline=settle + s.drain_grace_s)
        return replace(quiesce, settle_until=settle), []
    if state.phase == "quiesce":
        busy = [p for p in pods.values() if p.in_flight != 0 and not p.terminating]
        if snap.at < state.settle_until or (busy and snap.at < state.deadline):
            return state, []
        return replace(state, phase="evict", deadline=snap.at + s.evict_timeout_s), []
    # evict
    if not pods:
        return replace(state, phase="relabel", deadline=snap.at + s.mig_timeout_s), []
    if snap.at >= state.deadline:
        stuck = sorted(pods)
        why = "; ".join(snap.refusals.get(n, "still terminating") for n in stuck)
        return _fail(
            state,
            f"pod(s) {', '.join(stuck)} will not leave node {change.node} within "
            f"{s.evict_timeout_s:g}s ({why}); the node was uncordoned and the pods put back "
            f"in rotation",
            _rollback(change, state, snap),
        )
    return state, [Evict(p.name, p.namespace) for p in pods.values() if not p.terminating]


def _mig(changeover: Changeover, state: ChangeoverState, snap: ClusterSnapshot,
         s: ChangeoverSettings) -> Step:
    change = changeover.nodes[state.node]
    labels = snap.node_labels.get(change.node, {})
    config, mig_state = labels.get(MIG_CONFIG_LABEL), labels.get(MIG_CONFIG_STATE_LABEL)
    if state.phase == "relabel":
        if mig_state in ("pending", "rebooting"):  # an earlier change is still applying
            if snap.at >= state.deadline:
                return _fail(state, f"node {change.node} stayed {mig_state} from an earlier "
                             "change; not relabelled", [])  # fmt: skip
            return state, []
        if config == change.config:
            return _fail(
                state,
                f"node {change.node} already carries {MIG_CONFIG_LABEL}={config} (state "
                f"{mig_state}) though its GPUs need rebuilding: the MIG manager only acts "
                f"when the label changes; relabel it by hand to re-run",
                _rollback(change, state, snap),
            )
        return replace(state, phase="await-mig"), [Relabel(change.node, change.config)]
    # await-mig: only a state seen beside our config, after our patch removed the old
    # state, belongs to this change.
    if config == change.config and mig_state == "success":
        return replace(state, phase="bring-up"), []
    if config == change.config and mig_state == "failed":
        return _fail(
            state,
            f"MIG manager reported failed for {MIG_CONFIG_LABEL}={change.config} on node "
            f"{change.node}; the node stays cordoned",
            [],
        )
    if snap.at >= state.deadline:
        seen = f"{MIG_CONFIG_LABEL}={config}, state {mig_state or '(none)'}"
        return _fail(
            state,
            f"node {change.node} did not report success for {change.config} within "
            f"{s.mig_timeout_s:g}s (last seen {seen}); the node stays cordoned",
            [],
        )
    return state, []


def _bring_up(
    changeover: Changeover, state: ChangeoverState, snap: ClusterSnapshot, s: ChangeoverSettings
) -> Step:
    change = changeover.nodes[state.node]
    if state.phase == "bring-up":
        actions: list[Action] = [*_stale(changeover, snap, change.node)]
        if change.deployments:
            actions.append(Apply(change.deployments))
        actions.append(Cordon(change.node, False))
        return replace(state, phase="await-ready", deadline=snap.at + s.ready_timeout_s), actions
    # await-ready: the node's planned pods serve, in rotation
    out: list[Action] = [
        SetRotation(p.name, p.namespace, True)
        for p in snap.pods
        if p.node == change.node and not p.in_rotation and not p.terminating
    ]
    ready = {d.name: d.ready_replicas for d in snap.deployments}
    short = [
        d["metadata"]["name"]
        for d in change.deployments
        if ready.get(d["metadata"]["name"], 0) < d["spec"]["replicas"]
    ]
    if not short and not out:
        nxt = state.node + 1
        done = (*state.completed, change.node)
        phase = "cordon" if nxt < len(changeover.nodes) else "finish"
        return ChangeoverState(phase=phase, node=nxt, completed=done), []
    if snap.at >= state.deadline:
        return _fail(
            state,
            f"node {change.node} has its new layout but {', '.join(short)} not ready within "
            f"{s.ready_timeout_s:g}s",
            out,
        )
    return state, out


def step(
    changeover: Changeover,
    state: ChangeoverState,
    snap: ClusterSnapshot,
    settings: ChangeoverSettings | None = None,
) -> Step:
    """The next state and the actions that lead there, from what ``snap`` shows."""
    s = settings or ChangeoverSettings()
    if state.finished:
        return state, []
    if state.phase == "prepare":
        phase = "cordon" if changeover.nodes else "finish"
        return replace(state, phase=phase), _prepare(changeover, snap)
    if state.phase in ("cordon", "rotate-out", "quiesce", "evict"):
        return _drain(changeover, state, snap, s)
    if state.phase in ("relabel", "await-mig"):
        return _mig(changeover, state, snap, s)
    if state.phase in ("bring-up", "await-ready"):
        return _bring_up(changeover, state, snap, s)
    if state.phase == "finish":
        actions: list[Action] = []
        if changeover.other_deployments:
            actions.append(Apply(changeover.other_deployments))
        return replace(state, phase="done"), [*actions, *_stale(changeover, snap, None)]
    raise ValueError(f"unknown changeover phase {state.phase!r}")


def managed_selector() -> str:
    """Label selector of the Deployments the scheduler owns."""
    return ",".join(f"{k}={v}" for k, v in MANAGED_BY.items())


def pending_count(metrics_text: str) -> int | None:
    """Requests a Triton server is working on, from its Prometheus text: the sum of
    ``nv_inference_pending_request_count`` over models (None when absent)."""
    total, seen = 0.0, False
    for line in metrics_text.splitlines():
        if line.startswith("nv_inference_pending_request_count"):
            try:
                total += float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
            seen = True
    return int(total) if seen else None


def nodes_in(changeover: Changeover) -> Sequence[str]:
    return [n.node for n in changeover.nodes]
