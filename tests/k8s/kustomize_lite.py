"""A small, strict subset of ``kustomize build``, so every overlay is rendered and validated
even where no kustomize binary is installed.

Supported (exactly what k8s/ uses; anything else raises :class:`UnsupportedKustomization`
rather than rendering something kustomize would not):

- ``resources``: YAML files and directories holding a kustomization;
- ``namespace``: set on every namespaced object;
- ``labels`` with ``includeSelectors: false``: added to ``metadata.labels`` only;
- ``images``: ``newName`` / ``newTag`` / ``digest`` for containers and init containers;
- ``patches`` by ``path``: strategic-merge patches, targeted by the patch's kind/name;
- ``configMapGenerator`` (files, literals, labels) with ``disableNameSuffixHash: true``.

Transformers run in kustomize's order: patches, namespace, labels, images.
Where ``kubectl kustomize`` exists, a test checks this renderer gives the same objects.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

Obj = dict[str, Any]

KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
SUPPORTED_KEYS = {
    "apiVersion", "kind", "resources", "namespace", "labels", "images", "patches",
    "configMapGenerator", "generatorOptions",
}
CLUSTER_SCOPED = {
    "Namespace", "PriorityClass", "ClusterRole", "ClusterRoleBinding", "StorageClass",
    "PersistentVolume", "CustomResourceDefinition", "APIService", "RuntimeClass",
    "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "Node",
}
# Strategic-merge keys of the list fields k8s/ patches (from the Kubernetes API's
# patchMergeKey); every other list is replaced whole, as kustomize does.
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "volumes": "name",
    "env": "name",
    "imagePullSecrets": "name",
    "volumeMounts": "mountPath",
}


class UnsupportedKustomization(ValueError):
    """The kustomization uses a feature this renderer does not implement."""


def object_key(obj: Obj) -> tuple[str, str, str]:
    meta = obj.get("metadata", {})
    return (obj["kind"], meta.get("namespace", ""), meta["name"])


def build(directory: Path) -> list[Obj]:
    """Render the kustomization in ``directory``; returns objects in resource order."""
    kustomization = _load_kustomization(directory)
    objects: list[Obj] = []
    for entry in kustomization.get("resources", []):
        path = (directory / entry).resolve()
        objects.extend(build(path) if path.is_dir() else _load_yaml_objects(path))
    objects.extend(_generate_configmaps(directory, kustomization))
    _check_unique(objects, directory)
    for patch in kustomization.get("patches", []):
        _apply_patch(objects, directory, patch)
    if "namespace" in kustomization:
        for obj in objects:
            if obj["kind"] not in CLUSTER_SCOPED:
                obj.setdefault("metadata", {})["namespace"] = kustomization["namespace"]
    for label in kustomization.get("labels", []):
        if label.get("includeSelectors", False) or label.get("includeTemplates", False):
            raise UnsupportedKustomization(f"{directory}: labels into selectors/templates")
        for obj in objects:
            obj.setdefault("metadata", {}).setdefault("labels", {}).update(label["pairs"])
    for image in kustomization.get("images", []):
        for obj in objects:
            for container in _containers(obj):
                container["image"] = _retag(container["image"], image)
    return objects


def _load_kustomization(directory: Path) -> Obj:
    for name in KUSTOMIZATION_FILES:
        if (directory / name).is_file():
            data = yaml.safe_load((directory / name).read_text()) or {}
            unknown = set(data) - SUPPORTED_KEYS
            if unknown:
                raise UnsupportedKustomization(f"{directory}: {sorted(unknown)}")
            return data
    raise FileNotFoundError(f"no kustomization in {directory}")


def _load_yaml_objects(path: Path) -> list[Obj]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _check_unique(objects: Iterable[Obj], directory: Path) -> None:
    seen: set[tuple[str, str, str]] = set()
    for obj in objects:
        key = object_key(obj)
        if key in seen:
            raise ValueError(f"{directory}: {key} declared twice")
        seen.add(key)


def _generate_configmaps(directory: Path, kustomization: Obj) -> list[Obj]:
    generators = kustomization.get("configMapGenerator", [])
    options = kustomization.get("generatorOptions", {})
    if generators and not options.get("disableNameSuffixHash"):
        raise UnsupportedKustomization(f"{directory}: name suffix hashes are not implemented")
    generated = []
    for gen in generators:
        unknown = set(gen) - {"name", "files", "literals", "options"}
        if unknown or set(gen.get("options", {})) - {"labels"}:
            raise UnsupportedKustomization(f"{directory}: configMapGenerator {sorted(unknown)}")
        data: dict[str, str] = {}
        for entry in gen.get("files", []):
            key, _, rel = entry.rpartition("=")
            path = directory / rel
            data[key or path.name] = path.read_text()
        for literal in gen.get("literals", []):
            key, _, value = literal.partition("=")
            data[key] = value
        meta: Obj = {"name": gen["name"]}
        labels = {**options.get("labels", {}), **gen.get("options", {}).get("labels", {})}
        if labels:
            meta["labels"] = labels
        generated.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
                          "data": data})
    return generated


def _apply_patch(objects: list[Obj], directory: Path, entry: Obj) -> None:
    if set(entry) != {"path"}:
        raise UnsupportedKustomization(f"{directory}: only 'path' patches: {entry}")
    for patch in _load_yaml_objects(directory / entry["path"]):
        if isinstance(patch, list):
            raise UnsupportedKustomization(f"{directory}: JSON 6902 patch {entry['path']}")
        kind, namespace, name = object_key(patch)
        matches = [
            o for o in objects
            if o["kind"] == kind and o["metadata"]["name"] == name
            and (not namespace or o["metadata"].get("namespace", "") == namespace)
        ]
        if len(matches) != 1:
            raise ValueError(f"{entry['path']}: patch {kind}/{name} matches {len(matches)} objects")
        target = matches[0]
        merged = strategic_merge(target, patch)
        target.clear()
        target.update(merged)


def strategic_merge(base: Any, patch: Any, field: str = "") -> Any:
    """Kubernetes strategic merge for the cases k8s/ uses: maps merge key by key, ``null``
    deletes a key, lists in :data:`MERGE_KEYS` merge item by item, other lists replace."""
    if isinstance(base, dict) and isinstance(patch, dict):
        if "$patch" in patch:
            raise UnsupportedKustomization(f"$patch directives ({field})")
        out = copy.deepcopy(base)
        for key, value in patch.items():
            if value is None:
                out.pop(key, None)
            elif key in out:
                out[key] = strategic_merge(out[key], value, key)
            else:
                out[key] = copy.deepcopy(value)
        return out
    if isinstance(base, list) and isinstance(patch, list) and field in MERGE_KEYS:
        key = MERGE_KEYS[field]
        out = copy.deepcopy(base)
        for item in patch:
            index = next((i for i, b in enumerate(out) if b.get(key) == item.get(key)), None)
            if index is None:
                out.append(copy.deepcopy(item))
            else:
                out[index] = strategic_merge(out[index], item, field)
        return out
    return copy.deepcopy(patch)


def _containers(obj: Obj) -> list[Obj]:
    spec = obj.get("spec", {})
    pod = spec.get("template", {}).get("spec", {}) if "template" in spec else {}
    if obj["kind"] == "Pod":
        pod = spec
    return [*pod.get("containers", []), *pod.get("initContainers", [])]


def _retag(reference: str, image: Obj) -> str:
    name, digest = reference.split("@", 1) if "@" in reference else (reference, "")
    tag = ""
    if ":" in name.rsplit("/", 1)[-1]:
        name, tag = name.rsplit(":", 1)
    if name != image["name"]:
        return reference
    name = image.get("newName", name)
    if "digest" in image:
        return f"{name}@{image['digest']}"
    tag = image.get("newTag", tag)
    out = f"{name}:{tag}" if tag else name
    return f"{out}@{digest}" if digest and "newTag" not in image else out
