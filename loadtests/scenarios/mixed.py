"""Scenario: steady users, the --models mix shifting from model to model."""

from loadtests.shapes import MixedModelsShape as MixedModels  # noqa: F401
