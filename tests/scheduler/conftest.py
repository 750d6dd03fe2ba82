"""Fixtures shared by the scheduler tests."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from scheduler.plan import PlanRecord
from scheduler.planner import plan_placement
from scheduler.request import PlanningRequest, load_request

EXAMPLES = Path(__file__).resolve().parents[2] / "scheduler" / "examples"


@pytest.fixture(scope="session")
def example_request() -> PlanningRequest:
    return load_request(EXAMPLES / "fleet.yaml", EXAMPLES / "pools.yaml")


@pytest.fixture(scope="session")
def example_record(example_request: PlanningRequest) -> PlanRecord:
    plan = plan_placement(example_request, rng=random.Random(0))
    return PlanRecord(request=example_request, plan=plan)
