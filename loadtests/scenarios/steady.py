"""Scenario: steady load (add to locust's -f list after a locustfile)."""

from loadtests.shapes import SteadyShape as Steady  # noqa: F401
