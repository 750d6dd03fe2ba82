"""Scenario: base load, a sudden spike to --scenario-users, back to base."""

from loadtests.shapes import SpikeShape as Spike  # noqa: F401
