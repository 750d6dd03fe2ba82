"""bench_priority's parts that need no Triton: the levels' config edit (what
``triton_priority.level`` maps the classes to) and the rows and tables it reports."""

from __future__ import annotations

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from gateway.config.tenancy import Priority
from gateway.policy.triton_priority import level
from loadtests.bench_priority import (
    CRITICAL,
    LEVELS,
    PLAIN,
    SHEDDABLE,
    _cost_row,
    _value_row,
    markdown,
    with_levels,
)
from loadtests.benchkit import LoadResult


def _result(images: int, seconds: float, latencies: tuple[float, ...]) -> LoadResult:
    return LoadResult(images, images, seconds, latencies)


def test_the_levels_copy_has_a_level_per_class_and_standard_by_default() -> None:
    config = mc.ModelConfig(name="m")
    config.dynamic_batching.max_queue_delay_microseconds = 2000
    with_levels(config)
    assert config.dynamic_batching.priority_levels == 3
    levels = config.dynamic_batching.priority_levels
    assert config.dynamic_batching.default_priority_level == level(
        Priority.STANDARD, levels) == 2
    assert (CRITICAL, SHEDDABLE) == (1, 3)
    assert config.dynamic_batching.max_queue_delay_microseconds == 2000  # the rest kept


def test_rows_give_levels_over_plain_as_medians_of_rounds() -> None:
    cost = _cost_row(4, {PLAIN: [_result(200, 2.0, (10.0, 20.0)),
                                 _result(220, 2.0, (10.0, 30.0)),
                                 _result(240, 2.0, (12.0, 40.0))],
                         LEVELS: [_result(110, 2.0, (10.0, 80.0))] * 3})
    assert cost["plain_ips"] == 110.0 and cost["levels_ips"] == 55.0
    assert cost["throughput_ratio"] == pytest.approx(0.5)
    assert cost["p99_ratio"] == pytest.approx(80.0 / cost["plain_p99_ms"])
    light, flood = _result(10, 2.0, (5.0,) * 10), _result(300, 3.0, (50.0,) * 300)
    quick = _result(10, 2.0, (2.0,) * 10)
    value = _value_row({PLAIN: [(light, flood)] * 3, LEVELS: [(quick, flood)] * 3})
    assert value["light_p99_ratio"] == pytest.approx(0.4)
    assert value["flood_throughput_ratio"] == pytest.approx(1.0)
    text = markdown([cost, value])
    assert "| 4 | 110.0 | 55.0 |" in text and "0.40x" in text and "16 clients" in text
