"""The tenancy rule as a pure function: a table of load, class and share -> admit or
refuse; class ceilings, shares lent by weight, the config refused whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config.tenancy import Priority, load_tenancy_file, parse_tenancy
from gateway.policy.access import key_digest
from gateway.policy.tenancy import (
    Standing,
    Tenancy,
    Tenant,
    TenantActivity,
    TenantDirectory,
    decide,
    queued_elsewhere,
    refusal_delay_ms,
    refusal_waits_ms,
)

ROOT = Path(__file__).resolve().parents[3]
C = 8  # a pool's capacity
SHED, STD, CRIT = (Tenant(n, p, 1.0) for n, p in (
    ("batch", Priority.SHEDDABLE), ("web", Priority.STANDARD), ("pay", Priority.CRITICAL)))
CAPPED = Tenant("capped", Priority.CRITICAL, 1.0, max_in_flight=3)


def _tenancy(**refuse_at: float) -> Tenancy:
    return Tenancy.from_spec(parse_tenancy({
        "tenants": [{"name": "batch", "priority": "sheddable", "keys": ["batch-key"]},
                    {"name": "web", "priority": "standard", "weight": 3, "keys": ["web-key"]},
                    {"name": "web2", "priority": "standard", "keys": ["web2-key"]},
                    {"name": "pay", "priority": "critical", "keys": ["pay-key"]}],
        "refuse_at": refuse_at}), queue_factor=2.0)


# tenant, load, ceiling, here, share, total -> refused with (None: admitted)
TABLE = [
    (SHED, 0, 8, 0, 8, 0, None),
    (SHED, 7, 8, 7, 8, 7, None),  # below capacity: no one is held to a share
    (SHED, 8, 8, 0, 8, 0, "saturated"),  # sheddable goes first
    (STD, 8, 16, 0, 8, 0, None),  # saturated, under its share
    (STD, 12, 16, 8, 8, 8, "fair_share"),  # saturated, its share in flight
    (STD, 12, 16, 7, 8, 7, None),
    (STD, 16, 16, 0, 8, 0, "saturated"),  # then standard
    (CRIT, 16, 24, 0, 24, 0, None),  # critical keeps the room up to the hard bound
    (CRIT, 23, 24, 10, 24, 10, None),
    (CRIT, 24, 24, 0, 24, 0, "saturated"),
    (STD, 7, 16, 20, 1, 20, None),  # below capacity a share does not count
    (CAPPED, 0, 24, 2, 24, 2, None),
    (CAPPED, 0, 24, 3, 24, 3, "tenant_limit"),  # its own limit, whatever the load
]


@pytest.mark.parametrize(("tenant", "load", "ceiling", "here", "share", "total", "refused"),
                         TABLE)
def test_decide_admits_or_refuses_by_class_ceiling_and_share(
        tenant: Tenant, load: int, ceiling: int, here: int, share: int, total: int,
        refused: str | None) -> None:
    refusal = decide(tenant, Standing("p", load, C, ceiling, here, share, total))
    assert (refusal.reason if refusal else None) == refused
    if refusal is not None:
        assert "'" + (tenant.name if refused != "saturated" else "p") + "'" in refusal.message


def test_refusal_messages_name_the_reason() -> None:
    saturated = decide(SHED, Standing("gpu-a", 9, C, 8, 0, 8))
    assert saturated is not None and saturated.message == (
        "pool 'gpu-a' is saturated: load 9 for capacity 8; sheddable requests are refused "
        "from load 8")
    share = decide(STD, Standing("gpu-a", 9, C, 16, 4, 4))
    assert share is not None and share.message == (
        "pool 'gpu-a' is saturated (load 9 for capacity 8) and tenant 'web' has its share "
        "in flight (4)")
    limit = decide(CAPPED, Standing("gpu-a", 0, C, 24, 0, 1, total=3))
    assert limit is not None and limit.message == (
        "tenant 'capped' has 4 requests in flight (its limit 3)")


@pytest.mark.parametrize(("delay", "deadline_ms", "waits"), [
    (50, None, 50),  # no deadline: the whole delay
    (50, 1000, 50),
    (50, 56, 50),  # 50 ms within 9/10 of 56 (50.4)
    (50, 55, 0),  # beyond 9/10 of 55 (49.5): at once, before the client's deadline
    (50, 1, 0),
    (0, None, 0),  # 0: the tarpit is off
])
def test_a_refusal_waits_its_delay_unless_the_deadline_has_no_room_for_it(
        delay: int, deadline_ms: int | None, waits: int) -> None:
    assert refusal_delay_ms(delay, deadline_ms) == waits


@pytest.mark.parametrize(("waiting", "per_s", "deadline_ms", "waits"), [
    (1, 100, None, 50),  # a tenant refused now and then: the delay
    (5, 100, None, 50),  # 5 waiting x 10 ms each: not beyond the delay
    (6, 100, None, 100),  # beyond it: its share of a second per refusal waiting (60),
    (10, 100, None, 100),  # rounded up to a step of 50 ms
    (11, 100, None, 150),
    (64, 100, None, 650),  # a flood of 64 refused: about 100 refusals a second
    (64, 20, None, 1000),  # at most MAX_REFUSAL_DELAY_MS
    (64, 100, 500, 450),  # within 9/10 of the deadline
    (64, 100, 560, 500),  # rounded down to a step within it (504)
    (64, 100, 110, 50),  # (99): never below the delay
    (64, 100, 56, 50),  # the deadline leaves room for the delay only
    (64, 100, 55, 0),  # not even for the delay: at once
])
def test_a_tenant_with_many_refusals_waiting_waits_longer(
        waiting: int, per_s: int, deadline_ms: int | None, waits: int) -> None:
    assert refusal_delay_ms(50, deadline_ms, waiting, per_s) == waits


@pytest.mark.parametrize("delay", [0, 1, 30, 50, 70, 999, 1000])
def test_every_wait_of_a_refusal_is_one_of_the_listed_waits(delay: int) -> None:
    """HAProxy's plane has a tarpit for each listed wait: every wait the rule gives, for
    any count waiting, rate and deadline, is among them."""
    listed = set(refusal_waits_ms(delay))
    given = {refusal_delay_ms(delay, deadline_ms, waiting, per_s)
             for waiting in (1, 2, 5, 6, 11, 64, 500) for per_s in (1, 7, 20, 100, 100_000)
             for deadline_ms in (None, 1, 55, 56, 99, 110, 503, 560, 1111, 15_000)}
    assert given - {0} <= listed and (delay > 0 or given == {0})
    # and each listed wait is given: one more refusal waiting at a time, 1 ms each
    assert {refusal_delay_ms(delay, None, waiting, 1000) for waiting in range(1, 1200)
            } - {0} == listed
    assert len(listed) <= 21 and (not listed or min(listed) == delay)


def test_refusal_waits_are_the_delay_then_each_step_above_it() -> None:
    assert refusal_waits_ms(50)[:3] == (50, 100, 150) and refusal_waits_ms(50)[-1] == 1000
    assert refusal_waits_ms(70)[:3] == (70, 100, 150)
    assert refusal_waits_ms(1000) == (1000,) and refusal_waits_ms(0) == ()


def test_the_refusal_delay_is_configured_per_tenancy_and_bounded() -> None:
    assert Tenancy.from_spec(parse_tenancy({}), 2.0).refusal_delay_ms == 50
    assert Tenancy.from_spec(parse_tenancy({"refusal_delay_ms": 0}), 2.0).refusal_delay_ms == 0
    for wrong in (-1, 1001, 2.5):
        with pytest.raises(ValueError, match="tenancy: refusal_delay_ms"):
            parse_tenancy({"refusal_delay_ms": wrong})
    assert Tenancy.from_spec(parse_tenancy({}), 2.0).refusals_per_s == 100
    assert Tenancy.from_spec(parse_tenancy({"refusals_per_s": 20}), 2.0).refusals_per_s == 20
    for wrong in (0, -1, 100_001, 2.5):
        with pytest.raises(ValueError, match="tenancy: refusals_per_s"):
            parse_tenancy({"refusals_per_s": wrong})


def test_ceilings_default_from_queue_factor_and_follow_given_ones() -> None:
    t = _tenancy()
    assert [t.ceiling(p, C) for p in Priority] == [24, 16, 8]  # critical, standard, sheddable
    assert [_tenancy(standard=2.5).ceiling(p, C) for p in Priority] == [24, 20, 8]
    assert [_tenancy(sheddable=0.5).ceiling(p, 3) for p in Priority] == [9, 6, 1]
    # a derived ceiling never falls below a given one
    assert _tenancy(standard=4.0).ceiling(Priority.CRITICAL, C) == 32


def test_a_pool_that_queues_in_the_gateway_lets_the_sheddable_class_wait_too() -> None:
    t = _tenancy()
    queued = t.in_pool(gateway_queue=True)
    assert t.in_pool(gateway_queue=False) is t
    # sheddable from 1 + queue_factor / 4 (1.5x), the other classes as in any pool
    assert [queued.ceiling(p, C) for p in Priority] == [24, 16, 12]
    assert [queued.bound_permille(p) for p in Priority] == [1000, 667, 500]
    assert queued.shares(C)["batch"] == 12
    assert dict(t.refuse_at)[Priority.SHEDDABLE] == 1.0  # a pool that queues in Triton
    # a given sheddable ceiling holds in every pool (the same rules); a lower given
    # standard caps the derived one
    given = _tenancy(sheddable=0.5)
    assert given.in_pool(True) is given and given.ceiling(Priority.SHEDDABLE, C) == 4
    assert _tenancy(standard=1.25).in_pool(True).ceiling(Priority.SHEDDABLE, C) == 10
    big = Tenancy.from_spec(parse_tenancy({}), queue_factor=8.0).in_pool(True)
    assert [big.ceiling(p, 2) for p in Priority] == [18, 10, 6]


def test_shares_split_a_class_ceiling_by_weight_among_its_active_tenants() -> None:
    t = _tenancy()
    # every one active: standard's default (1), web (3), web2 (1) share 16
    everyone = {"default", "batch", "web", "web2", "pay"}
    assert t.shares(C, everyone) == {"default": 3, "batch": 8, "web": 9, "web2": 3, "pay": 24}
    assert t.shares(1, everyone) == {"default": 1, "batch": 1, "web": 1, "web2": 1, "pay": 3}
    # web2 alone: the whole standard ceiling; the others are told their share were they
    # to arrive beside it
    assert t.shares(C, {"web2"}) == {"default": 8, "batch": 8, "web": 12, "web2": 16,
                                     "pay": 24}
    assert t.shares(C, {"web", "web2"}) == {"default": 3, "batch": 8, "web": 12, "web2": 4,
                                            "pay": 24}
    # nobody active: each alone, the whole ceiling of its class
    assert t.shares(C) == {"default": 16, "batch": 8, "web": 16, "web2": 16, "pay": 24}


def test_the_models_bound_per_class_scales_by_the_class_ceilings() -> None:
    t = _tenancy()  # refuse_at 1, 2, 3
    assert [t.bound_permille(p) for p in Priority] == [1000, 667, 334]
    assert [t.model_bound(p, 24) for p in Priority] == [24, 16, 8]
    assert [t.model_bound(p, 12) for p in Priority] == [12, 8, 4]
    assert [t.model_bound(p, 1) for p in Priority] == [1, 1, 1]  # never below one
    assert _tenancy(sheddable=3.0).model_bound(Priority.SHEDDABLE, 12) == 12


def test_a_tenant_is_active_while_it_sends_and_for_a_window_after() -> None:
    activity = TenantActivity(window_s=2.0)
    assert activity.active("p", 0.0) == frozenset()
    activity.note("p", "web", 10.0)
    activity.note("q", "pay", 10.0)
    assert activity.active("p", 12.0) == {"web"}
    assert activity.active("p", 12.1) == frozenset()
    assert activity.active("q", 11.0) == {"pay"}


def test_keys_find_their_tenant_and_the_rest_is_the_default() -> None:
    directory = TenantDirectory(_tenancy())
    assert directory.tenant_of("pay-key").name == "pay"
    assert directory.tenant_of(None).name == directory.tenant_of("").name == "default"
    assert directory.tenant_of("someone-else").name == "default"
    hashed = Tenancy.from_spec(parse_tenancy({"tenants": [
        {"name": "x", "keys": [f"sha256:{key_digest('secret-x').upper()}"]}]}), 2.0)
    assert TenantDirectory(hashed).tenant_of("secret-x").name == "x"


@pytest.mark.parametrize(("document", "named"), [
    ({"tenants": [{"name": "a", "priority": "gold"}]}, "tenants.a.priority"),
    ({"tenants": [{"name": "a", "weight": 0}]}, "tenants.a.weight"),
    ({"tenants": [{"name": "a", "max_in_flight": 0}]}, "tenants.a.max_in_flight"),
    ({"tenants": [{"name": "A b"}]}, "tenants.0.name"),
    ({"tenants": [{"name": "a", "keys": ["sha256:xyz"]}]}, "tenants.a.keys"),
    ({"tenants": [{"name": "a", "keys": [""]}]}, "tenants.a.keys"),
    ({"tenants": [{"name": "a"}, {"name": "a"}]}, "names declared twice"),
    ({"tenants": [{"name": "a", "keys": ["k"]}, {"name": "b", "keys": ["k"]}]},
     "tenants.b.keys: a key is named twice (also by tenant 'a')"),
    ({"tenants": [{"name": "default"}]}, "configure it under 'default'"),
    ({"default": {"priority": "urgent"}}, "default.priority"),
    ({"refuse_at": {"standard": 3, "critical": 2}}, "refuse_at.standard (3.0) is above"),
    ({"tenants": [{"name": "a", "rate": {"rate_per_s": -1, "burst": 2}}]},
     "tenants.a.rate.rate_per_s"),
    ({"tenant": []}, "tenant: Extra inputs are not permitted"),
])
def test_a_malformed_tenancy_is_refused_whole_naming_the_field(document: object,
                                                               named: str) -> None:
    with pytest.raises(ValueError, match="tenancy: ") as err:
        parse_tenancy(document)
    assert named in str(err.value)


def test_queued_elsewhere_counts_lasting_load_that_is_not_the_gateways() -> None:
    assert queued_elsewhere([(10.0, 5, 3)], now=10.0) == 2
    assert queued_elsewhere([(10.0, 2, 6)], now=10.0) == 0  # ours may be queued too
    # a burst of our own, then Triton's gauge (refreshed every 2 s) still shows it
    echo = [(10.0, 5, 5), (10.5, 5, 5), (11.0, 5, 0), (11.5, 5, 0)]
    assert queued_elsewhere(echo, now=11.5) == 0
    assert queued_elsewhere(echo, now=14.9) == 5  # 4 s on, it would be lasting load
    lasting = [(10.0 + i / 2, 7, 2) for i in range(8)]  # another replica's, 4 s long
    assert queued_elsewhere(lasting, now=13.5) == 5
    assert queued_elsewhere(lasting, now=30.0) == 0  # nothing recent: nothing counted


def test_the_example_file_and_a_gateway_files_section_load(tmp_path: Path) -> None:
    example = load_tenancy_file(ROOT / "gateway" / "examples" / "tenants.yaml")
    assert [t.name for t in example.tenants] == ["checkout", "search", "nightly-batch"]
    section = tmp_path / "gateway.yaml"
    section.write_text("tenancy:\n  tenants: [{name: a, priority: critical}]\n")
    assert load_tenancy_file(section).tenants[0].priority is Priority.CRITICAL
    broken = tmp_path / "broken.yaml"
    broken.write_text("tenants: [{name: a, priority: urgent}]\n")
    with pytest.raises(ValueError, match=r"broken.yaml: tenants.a.priority: Input should be"):
        load_tenancy_file(broken)
    broken.write_text("tenants: [\n")
    with pytest.raises(ValueError, match="broken.yaml"):
        load_tenancy_file(broken)
