"""A scripted cluster for changeover tests: no API server, behaviour from recorded sequences.

What the MIG manager writes to ``nvidia.com/mig.config.state`` after a relabel comes from
``recorded/mig-manager-transitions.yaml``: sequences transcribed from what
NVIDIA/mig-parted's ``reconfigure-mig.sh`` does (``pending``, ``rebooting`` across a
reboot, ``success`` or ``failed``; ``success`` at once when ``assert`` finds the config
already applied), one value per observation. They are not captured from a live cluster.

Kubernetes' side is modelled as far as the changeover depends on it: cordoning, pod labels,
the Eviction API (refusals scripted per pod, as a PodDisruptionBudget would refuse),
pods that terminate one observation after an eviction, Deployments that are ready one
observation after they are applied, and PriorityClasses whose ``value`` is immutable.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from scheduler.changeover import (
    Action,
    Apply,
    Changeover,
    ClusterSnapshot,
    Cordon,
    Delete,
    DeploymentView,
    Evict,
    PodView,
    Relabel,
    SetRotation,
)
from scheduler.errors import ApplyFailed
from scheduler.manifests import NODE_LABEL
from scheduler.migparted import MIG_CONFIG_LABEL, MIG_CONFIG_STATE_LABEL

TRANSITIONS = Path(__file__).parent / "recorded" / "mig-manager-transitions.yaml"


def mig_manager_script(name: str) -> list[str | None]:
    return list(yaml.safe_load(TRANSITIONS.read_text())["transitions"][name]["states"])


@dataclass
class ScriptedCluster:
    node_labels: dict[str, dict[str, str]]
    pods: dict[str, PodView] = field(default_factory=dict)
    scripts: dict[str, list[str | None]] = field(default_factory=dict)
    """Per node: the states the MIG manager writes after a relabel, one per observation."""
    refuse: dict[str, int] = field(default_factory=dict)
    """Per pod: evictions refused before one is allowed (a large number: never)."""
    in_flight: dict[str, list[int]] = field(default_factory=dict)
    """Per pod: in-flight requests per observation once it is out of rotation."""
    deployments: dict[str, DeploymentView] = field(default_factory=dict)
    priority_classes: dict[str, int] = field(default_factory=dict)
    unschedulable: dict[str, bool] = field(default_factory=dict)
    lag: dict[str, int] = field(default_factory=dict)
    """Per node: observations after a relabel during which reads still show the old labels."""
    actions: list[Action] = field(default_factory=list)
    states_at_action: list[dict[str, str | None]] = field(default_factory=list)
    """The MIG manager's real state of every node when each action was taken."""
    observations: int = 0
    _running: dict[str, list[str | None]] = field(default_factory=dict)
    _stale_view: dict[str, tuple[int, dict[str, str]]] = field(default_factory=dict)
    _leaving: set[str] = field(default_factory=set)
    _observed_at_action: list[int] = field(default_factory=list)

    def observe(self, changeover: Changeover, at: float,
                refusals: dict[str, str]) -> ClusterSnapshot:
        self.observations += 1
        for name in list(self._leaving):  # evicted pods are gone one observation later
            self.pods.pop(name, None)
        self._leaving = {n for n, p in self.pods.items() if p.terminating}
        for node, script in self._running.items():
            if script:
                state = script.pop(0)
                if state is None:
                    self.node_labels[node].pop(MIG_CONFIG_STATE_LABEL, None)
                else:
                    self.node_labels[node][MIG_CONFIG_STATE_LABEL] = state
        for name, pod in self.pods.items():  # requests drain once no new ones arrive
            values = self.in_flight.get(name)
            if values and not pod.in_rotation:
                self.pods[name] = replace(pod, in_flight=values.pop(0))
        labels = {n: dict(v) for n, v in self.node_labels.items()}
        for node, (left, old) in list(self._stale_view.items()):
            if left > 0:
                labels[node] = dict(old)
                self._stale_view[node] = (left - 1, old)
        snapshot = ClusterSnapshot(
            at=at,
            node_labels=labels,
            unschedulable=dict(self.unschedulable),
            pods=tuple(self.pods.values()),
            deployments=tuple(self.deployments.values()),
            priority_classes=dict(self.priority_classes),
            refusals=dict(refusals),
        )
        for name, d in self.deployments.items():  # ready one observation after applying
            self.deployments[name] = replace(d, ready_replicas=d.replicas)
        return snapshot

    def execute(self, action: Action) -> str | None:
        self.actions.append(action)
        self.states_at_action.append(
            {n: labels.get(MIG_CONFIG_STATE_LABEL) for n, labels in self.node_labels.items()}
        )
        self._observed_at_action.append(self.observations)
        if isinstance(action, Apply):
            for obj in action.objects:
                self._apply(obj)
        elif isinstance(action, Delete):
            if action.kind == "PriorityClass":
                self.priority_classes.pop(action.name, None)
            else:
                self.deployments.pop(action.name, None)
        elif isinstance(action, Cordon):
            self.unschedulable[action.node] = action.unschedulable
        elif isinstance(action, SetRotation):
            pod = self.pods[action.pod]
            self.pods[action.pod] = replace(
                pod, in_rotation=action.in_rotation, rotation_labelled=True
            )
        elif isinstance(action, Evict):
            left = self.refuse.get(action.pod, 0)
            if left > 0:
                self.refuse[action.pod] = left - 1
                return "Cannot evict pod as it would violate the pod's disruption budget."
            if action.pod in self.pods:
                self.pods[action.pod] = replace(self.pods[action.pod], terminating=True)
        elif isinstance(action, Relabel):
            old = dict(self.node_labels[action.node])
            if self.lag.get(action.node):
                self._stale_view[action.node] = (self.lag[action.node], old)
            self.node_labels[action.node][MIG_CONFIG_LABEL] = action.config
            self.node_labels[action.node].pop(MIG_CONFIG_STATE_LABEL, None)
            self._running[action.node] = list(self.scripts.get(action.node, ["success"]))
        return None

    def _apply(self, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        if obj["kind"] == "PriorityClass":
            have = self.priority_classes.get(meta["name"])
            if have is not None and have != obj["value"]:
                raise ApplyFailed(f"PriorityClass/{meta['name']}: value may not be changed")
            self.priority_classes[meta["name"]] = obj["value"]
        elif obj["kind"] == "Deployment":
            old = self.deployments.get(meta["name"])
            self.deployments[meta["name"]] = DeploymentView(
                meta["name"], meta["namespace"], meta["labels"].get(NODE_LABEL),
                obj["spec"]["replicas"], old.ready_replicas if old else 0,
            )  # fmt: skip

    def observations_between(self, first: int, second: int) -> int:
        """Snapshots read between the actions at indexes ``first`` and ``second``."""
        return self._observed_at_action[second] - self._observed_at_action[first]
