"""Rendered manifests of every overlay (k8s/overlays/*), rendered once per session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.k8s.kustomize_lite import build
from tests.procs import ROOT

K8S = ROOT / "k8s"
OVERLAYS = {p.name: p for p in sorted((K8S / "overlays").iterdir()) if p.is_dir()}
Obj = dict[str, Any]


@pytest.fixture(scope="session")
def rendered() -> dict[str, list[Obj]]:
    return {name: build(path) for name, path in OVERLAYS.items()}


def find(objects: list[Obj], kind: str, name: str) -> Obj:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} objects"
    return matches[0]


def of_kind(objects: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objects if o["kind"] == kind]


def pod_spec(obj: Obj) -> Obj:
    spec: Obj = obj["spec"]["template"]["spec"]
    return spec


def container(obj: Obj, name: str) -> Obj:
    return next(c for c in pod_spec(obj)["containers"] if c["name"] == name)


def repo_path(relative: str) -> Path:
    return ROOT / relative
