"""MIG placement scheduler: which MIG instances each GPU gets, and which Triton pool
runs on each, on the 8-slot memory axis with exact start slots (see README.md).

The policy is :func:`plan_placement`, a pure function of a :class:`PlanningRequest`
(fleet + pools + options) and an injected clock and random generator.
"""

from scheduler.plan import PlacementPlan, PlanRecord
from scheduler.planner import plan_placement
from scheduler.request import PlannerOptions, PlanningRequest, load_request, parse_request
from scheduler.validator import validate_plan

__all__ = [
    "PlacementPlan",
    "PlanRecord",
    "PlannerOptions",
    "PlanningRequest",
    "load_request",
    "parse_request",
    "plan_placement",
    "validate_plan",
]
