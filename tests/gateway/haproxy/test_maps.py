"""The map files' contents (``gateway/haproxy/maps.py``): routes and splits, limits,
readiness, token and rate-key digests. Whole rendered maps: ``test_golden.py``."""

from __future__ import annotations

from gateway.haproxy.maps import route_maps, split
from gateway.haproxy.snapshot import RouteState
from gateway.policy.access import key_digest
from tests.gateway.haproxy.conftest import snapshot


def test_split_gives_cumulative_permille_when_canary_weights() -> None:
    pools, cuts = split(RouteState("m", (("main", 0.9), ("canary", 0.1)), 1), 3)
    assert pools == ["main", "canary", "main"]
    assert cuts == [0, 900, 1000]  # rank 2 never serves: the model has two pools


def test_route_maps_hold_every_named_model_when_rendered() -> None:
    maps = route_maps(snapshot())
    assert maps["route0"] == {"resnet": "main", "tiny": "main"}
    assert maps["route1"] == {"resnet": "canary", "tiny": "main"}
    assert maps["cut1"] == {"resnet": "900", "tiny": "1000"}
    assert maps["limits"] == {"resnet": "48", "tiny": "24"}
    assert maps["ratekeys"] == {key_digest("batch-jobs"): "1"}  # class 0 is the default


def test_not_ready_reason_is_one_line_when_it_spans_several() -> None:
    """A map value is the rest of its line: a reason with line breaks is joined, one
    that is only blanks still marks the model not ready."""
    maps = route_maps(snapshot(routes=(
        RouteState("bert", (("main", 1.0),), 12, not_ready="loading\n  on  member 2\t"),
        RouteState("blank", (("main", 1.0),), 12, not_ready=" \n "),
        RouteState("ready", (("main", 1.0),), 12))))
    assert maps["notready"] == {"bert": "loading on member 2", "blank": "-"}
