"""Fixtures for gateway tests that need their own Triton processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from converters.tiny import build_tiny_model


@pytest.fixture(scope="module")
def tiny_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("tiny") / "model_repo"
    build_tiny_model(repo)
    return repo
