"""Scenario: linear ramp from 1 user to --scenario-users (add to locust's -f list)."""

from loadtests.shapes import RampShape as Ramp  # noqa: F401
