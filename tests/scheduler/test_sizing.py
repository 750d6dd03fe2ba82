from __future__ import annotations

import pytest

from scheduler.pools import CapacityEntry, LatencyModel, PoolSpec
from scheduler.profiles import WHOLE_DEVICE, gpu_type
from scheduler.sizing import capacity_table, replica_rps, size_pool


def make_pool(**fields: object) -> PoolSpec:
    base: dict[str, object] = {
        "name": "p",
        "model": "m",
        "memory_gib": 4,
        "target_rps": 500,
        "max_replicas": 8,
        "capacity": [
            {"profile": 19, "rps": 100},
            {"profile": 14, "rps": 260},
            {"profile": 9, "rps": 390},
        ],
    }
    base.update(fields)
    return PoolSpec.model_validate(base)


def test_size_pool_picks_fewest_slices_when_several_profiles_meet_target() -> None:
    best = size_pool(make_pool(), ["A100-80GB"]).best
    # 1g: 5 x 1 slice = 5; 2g: 2 x 2 = 4; 3g: 2 x 4 = 8 -> two 2g instances.
    assert best is not None and (best.profile, best.replicas) == (14, 2)
    assert best.meets_target


def test_size_pool_skips_profile_when_memory_does_not_fit() -> None:
    best = size_pool(make_pool(memory_gib=12), ["A100-80GB"]).best
    assert best is not None and best.profile in (14, 9)
    assert all(o.profile != 19 for o in size_pool(make_pool(memory_gib=12), ["A100-80GB"]).options)


def test_size_pool_applies_headroom_when_given() -> None:
    best = size_pool(make_pool(target_rps=500), ["A100-80GB"], headroom=1.2).best
    assert best is not None and best.replicas * best.replica_rps >= 600


def test_size_pool_marks_shortfall_when_max_replicas_too_low() -> None:
    sizing = size_pool(make_pool(target_rps=5000, max_replicas=2), ["A100-80GB"])
    assert sizing.best is not None and not sizing.best.meets_target
    assert sizing.best.replicas == 2


def test_size_pool_reports_problem_when_no_allowed_type_in_fleet() -> None:
    pool = make_pool(constraints={"gpu_types": ["H100-80GB"]})
    sizing = size_pool(pool, ["A100-80GB"])
    assert sizing.best is None and "H100-80GB" in (sizing.problem or "")


def test_size_pool_reports_memory_when_model_too_big() -> None:
    sizing = size_pool(make_pool(memory_gib=200), ["A100-80GB"])
    assert sizing.best is None and "200" in (sizing.problem or "")


def test_latency_model_follows_nexus_rule_when_slo_limits_batch() -> None:
    model = LatencyModel(base_ms=4.0, per_item_ms=0.6, max_batch=64)
    # 2 * (4 + 0.6 b) <= 50 -> b <= 35; 35 / 25 ms = 1400 req/s.
    assert model.throughput_at_slo(50.0) == pytest.approx(35 * 1000 / (4 + 0.6 * 35))
    assert model.throughput_at_slo(8.0) == 0.0


def test_capacity_entry_for_gpu_type_wins_when_generic_entry_also_matches() -> None:
    pool = make_pool(
        capacity=[
            {"profile": 9, "rps": 100},
            {"gpu_type": "H100-80GB", "profile": "3g.40gb", "rps": 180},
        ]
    )
    assert replica_rps(pool, gpu_type("H100-80GB"), 9) == 180
    assert replica_rps(pool, gpu_type("A100-80GB"), 9) == 100
    table = capacity_table(pool, [gpu_type("H100-80GB"), gpu_type("A100-80GB")])
    assert table == {("H100-80GB", 9): 180, ("A100-80GB", 9): 100}


def test_size_pool_lists_whole_device_when_non_mig_type() -> None:
    pool = make_pool(capacity=[CapacityEntry(gpu_type="T4", rps=300)])
    best = size_pool(pool, ["T4"]).best
    assert best is not None and (best.profile, best.replicas) == (WHOLE_DEVICE, 2)


def test_size_pool_spans_types_when_replica_count_holds_on_both() -> None:
    pool = make_pool(target_rps=300, capacity=[{"profile": 9, "rps": 400}])
    best = size_pool(pool, ["A100-80GB", "H100-80GB"]).best
    assert best is not None and best.gpu_types == ("A100-80GB", "H100-80GB")


def test_size_pool_keeps_current_profile_when_sticking_and_target_still_met() -> None:
    pool = make_pool(target_rps=500)  # best: 2 x 2g (4 slices); 1g needs 5 x 1 slice
    assert size_pool(pool, ["A100-80GB"]).best.profile == 14  # type: ignore[union-attr]
    sticky = size_pool(pool, ["A100-80GB"], current_profile=19, stick_at_any_cost=True).best
    assert sticky is not None and (sticky.profile, sticky.replicas) == (19, 5)
    # Without sticking at any cost, only an equally cheap current profile wins.
    assert size_pool(pool, ["A100-80GB"], current_profile=19).best.profile == 14  # type: ignore[union-attr]
