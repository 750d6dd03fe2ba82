"""Canaries that fail safe, on the control plane's side, with fakes (a fake
``MemberAdmin``, an injected wall clock, a feed over a file): the rollout renews its
lease every tick (a pause included) and publishes a share only with one; a promotion
drops it; and a restart mid-rollout unloads the candidate only once the replicas the
previous process knew have acknowledged the stable-only split."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any
from unittest.mock import create_autospec

from converters.tiny import TINY_MODEL_NAME, build_tiny_model
from gateway.auth import TokenTable
from gateway.config import GatewayConfig
from gateway.config.lifecycle import LifecycleSpec
from gateway.config.pools import MemberSpec, PoolSpec
from gateway.config.rollout import RolloutSpec
from gateway.core import Core
from gateway.haproxy.feed import AGENTS_FILE, SnapshotFeed
from gateway.lifecycle.assembly import build_lifecycle
from gateway.lifecycle.records.jobs import LifecycleStore, ModelRecord, RolloutRecord, VersionRecord
from gateway.lifecycle.service import ModelLifecycle
from gateway.upstream.triton import MemberAdmin

TINY = TINY_MODEL_NAME
GATEWAY = GatewayConfig(pools=(PoolSpec(name="p", members=(MemberSpec(),)),))


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _admin(versions: list[int]) -> Any:
    admin: Any = create_autospec(MemberAdmin, instance=True)
    admin.infer.return_value = (200, b"{}")  # warm-up answers
    admin.loaded_versions.return_value = versions
    return admin


def _records(tmp_path: Path, rollout_at: int | None = None) -> Path:
    """Version 1 serving, 2 published; with ``rollout_at``, a rollout of 2 left running
    at that percent by a dead process (and its job)."""
    repo = tmp_path / "model_repo"
    build_tiny_model(repo)
    text = (repo / TINY / "config.pbtxt").read_text()
    (repo / TINY / "2").mkdir()
    store = LifecycleStore(tmp_path / "state" / "lifecycle.db")
    store.put_version(VersionRecord(TINY, 1, "serving", text, time.time()))
    store.put_version(VersionRecord(TINY, 2, "available", text, time.time()))
    store.put_model(ModelRecord(TINY, "serving", 0.0, serving_version=1, pools=("p",)))
    if rollout_at is not None:
        store.create_job("job-r", TINY, "ci")
        store.update_job("job-r", state="rolling_out", version=2)
        now = time.time()
        store.put_rollout(RolloutRecord("job-r", TINY, 1, 2, {"steps": [50, 100]},
                                        "running", now, now, percent=rollout_at))
    store.close()
    return repo


def _lifecycle(tmp_path: Path, repo: Path, core: Core, admin: Any) -> ModelLifecycle:
    spec = LifecycleSpec(repository=repo, state_dir=tmp_path / "state")
    return build_lifecycle(spec, GATEWAY, core, admin, on_version_changed=lambda m: None)


def _watch(core: Core) -> list[tuple[int | None, int | None, float | None]]:
    """At every settle: (the split's percent, the shadow's, the lease)."""
    seen: list[tuple[int | None, int | None, float | None]] = []

    async def follower() -> None:
        split, shadow = core.state.split_of(TINY), core.state.shadow_of(TINY)
        seen.append((split.percent if split else None, shadow.percent if shadow else None,
                     core.state.verdict_at(TINY)))

    core.state.follow(follower)
    return seen


def test_rollout_leases_every_share_and_drops_the_lease_when_promoting(
    tmp_path: Path
) -> None:
    repo = _records(tmp_path)
    core = Core.for_config(GATEWAY)
    lifecycle = _lifecycle(tmp_path, repo, core, _admin([1]))
    wall = lifecycle.rollouts.wall_clock = Clock(1_700_000_000.0)
    seen = _watch(core)
    spec = RolloutSpec(steps=(50,), step_seconds=0.3, min_requests=0, agreement_samples=0,
                       shadow={"percent": 10, "seconds": 0.3, "min_requests": 0})

    outcome = asyncio.run(lifecycle.rollouts.run("job-1", TINY, 1, 2, spec, None, (1,),
                                                 lambda *step: None))
    assert outcome.promoted, outcome.reason
    shares = [one for i, one in enumerate(seen)  # what each settle published, once
              if ((one[0] or 0) > 0 or one[1]) and (i == 0 or seen[i - 1] != one)]
    # the shadow step and the step each published with a lease; the promotion without
    assert shares == [(0, 10, wall.t), (50, None, wall.t), (100, None, None)]
    assert core.state.split_of(TINY) is None and core.state.verdict_at(TINY) is None


def test_paused_rollout_keeps_renewing_its_lease_when_control_plane_is_there(
    tmp_path: Path
) -> None:
    repo = _records(tmp_path)
    core = Core.for_config(GATEWAY)
    lifecycle = _lifecycle(tmp_path, repo, core, _admin([1]))
    rollouts = lifecycle.rollouts
    wall = rollouts.wall_clock = Clock(1_700_000_000.0)
    spec = RolloutSpec(steps=(50,), step_seconds=3600, min_requests=10,
                       agreement_samples=0, shadow="none")

    async def scenario() -> None:
        running = asyncio.create_task(rollouts.run("job-1", TINY, 1, 2, spec, None, (1,),
                                                   lambda *step: None))
        for _ in range(100):
            split = core.state.split_of(TINY)
            if split is not None and split.percent == 50:
                break
            await asyncio.sleep(0.05)
        wall.t += 7
        await asyncio.sleep(0.6)  # ticks of 0.25 s: each a verdict (none yet: a hold)
        assert core.state.verdict_at(TINY) == wall.t
        rollouts.pause(TINY)
        wall.t += 7
        await asyncio.sleep(0.6)
        assert core.state.verdict_at(TINY) == wall.t  # no verdict, the lease all the same
        assert core.state.split_of(TINY).percent == 50  # type: ignore[union-attr]
        rollouts.abort(TINY, "ci")
        outcome = await asyncio.wait_for(running, 10)
        assert not outcome.promoted and "aborted by ci" in outcome.reason

    asyncio.run(scenario())
    assert core.state.split_of(TINY) is None and core.state.verdict_at(TINY) is None


def test_restart_unloads_candidate_only_after_known_replicas_acknowledged_stable(
    tmp_path: Path
) -> None:
    repo = _records(tmp_path, rollout_at=50)
    agents = tmp_path / "state" / AGENTS_FILE
    SnapshotFeed(Core.for_config(GATEWAY), TokenTable(),
                 agents_path=agents).saw("replica-a", "the-50%-split")  # then killed

    core = Core.for_config(GATEWAY)  # the restarted process, assembled as serve() does
    admin = _admin([1, 2])  # the members still hold both versions
    lifecycle = _lifecycle(tmp_path, repo, core, admin)
    lifecycle.recover()
    feed = SnapshotFeed(core, TokenTable(), agents_path=agents)
    core.state.follow(feed.settle)
    at_unload: list[tuple[list[str], Any]] = []

    async def load(member: Any, model: str, config: Any = None) -> None:
        at_unload.append((feed.behind(), core.state.split_of(TINY)))

    admin.load.side_effect = load

    async def scenario() -> None:
        preload = asyncio.create_task(lifecycle.preload_one(TINY))
        await asyncio.sleep(0.5)
        assert at_unload == [] and not preload.done()  # waits for replica-a
        stable_only, snapshot = feed.current()
        route = next(r for r in snapshot.routes if r.model == TINY)
        assert (route.split, route.verdict_at) == ((1, 2, 0), None)
        feed.saw("replica-a", stable_only)  # it applied the stable-only split
        await asyncio.wait_for(preload, 10)

    asyncio.run(scenario())
    assert len(at_unload) == 1
    behind, split = at_unload[0]
    assert behind == [] and split is not None and split.percent == 0
    assert core.state.split_of(TINY) is None  # the members serve stable alone
    assert not lifecycle.rollouts.interrupted(TINY)
    rollout = lifecycle.catalog.store.rollout(TINY)
    assert rollout is not None and rollout.state == "interrupted"
    assert lifecycle.catalog.store.job("job-r").error == \
        "interrupted: the control plane restarted"
