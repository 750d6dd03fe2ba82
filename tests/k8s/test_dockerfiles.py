"""The Dockerfiles agree with the code and the manifests. No Docker engine runs here, so
images are not built in tests; these checks catch the usual drift instead: a COPY of a
path that moved, a dependency the code imports but the image lacks, a user or port that
differs from what the Kubernetes manifests expect."""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.k8s.conftest import Obj, container, find, pod_spec
from tests.procs import ROOT

DOCKER = ROOT / "docker"
FIRST_PARTY = {"gateway", "scheduler", "converters", "infergate", "loadtests"}
# image (= package = container name) -> (Dockerfile, Deployment)
IMAGES = {
    "gateway": ("Dockerfile.gateway", "infergate-control-plane"),
    "scheduler": ("Dockerfile.scheduler", "infergate-scheduler"),
}


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", re.split(r"[\[<>=;! ]", name)[0].strip()).lower()


def installed_closure(requirements: list[str]) -> set[str]:
    """Distributions pip installs for these requirements, following each installed
    distribution's own requirements (with the extras asked for)."""
    seen: set[tuple[str, frozenset[str]]] = set()
    pending = [Requirement(r) for r in requirements]
    while pending:
        req = pending.pop()
        key = (normalise(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            requires = importlib.metadata.requires(req.name) or []
        except importlib.metadata.PackageNotFoundError:
            continue  # an optional extra not installed here: its own name still counts
        for text in requires:
            sub = Requirement(text)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e})
                                         for e in (req.extras or {""})):
                pending.append(sub)
    return {name for name, _ in seen}


@functools.cache
def project_dependencies() -> tuple[set[str], set[str]]:
    """What the images install: pyproject.toml's dependencies (always) and its optional
    extras (with --build-arg EXTRAS=...), each with everything they pull in."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = installed_closure(list(project["dependencies"]))
    extras = installed_closure([d for deps in project["optional-dependencies"].values()
                                for d in deps])
    return base, extras


def module_file(module: str) -> Path | None:
    path = ROOT / Path(*module.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(nodes: list[ast.stmt], eager_only: bool) -> list[str]:
    """Modules imported by these statements; with eager_only, not those inside functions
    (which run only when called: lazy imports of optional packages)."""
    names: list[str] = []
    for node in nodes:
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and eager_only:
            continue
        else:
            children = [c for c in ast.iter_child_nodes(node) if isinstance(c, ast.stmt)]
            names += _imports(children, eager_only)
    return names


def third_party_imports(package: str, eager_only: bool) -> set[str]:
    """Top-level third-party modules imported by ``package`` and, transitively, by the
    first-party modules it imports."""
    pending = list((ROOT / package).rglob("*.py"))
    seen: set[Path] = set()
    found: set[str] = set()
    while pending:
        path = pending.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in _imports(ast.parse(path.read_text()).body, eager_only):
            top = name.split(".")[0]
            if top in FIRST_PARTY:
                target = module_file(name)
                if target is not None and target not in seen:
                    pending.append(target)
            elif top not in sys.stdlib_module_names and top != "__future__":
                found.add(top)
    return found


@functools.cache
def _module_distributions() -> dict[str, list[str]]:
    return dict(packages_distributions())


def distributions_of(module: str) -> set[str]:
    return {normalise(d) for d in _module_distributions().get(module, [module])}


@pytest.mark.parametrize("image", list(IMAGES))
def test_image_installs_what_its_code_imports(image: str) -> None:
    """The images install pyproject.toml's dependencies (+ chosen extras), so: every
    import at module level (the service cannot start without it) is a base dependency,
    and every lazily imported package is at least a declared extra."""
    base, extras = project_dependencies()
    eager_missing = sorted(m for m in third_party_imports(image, eager_only=True)
                           if not distributions_of(m) & base)
    assert not eager_missing, f"{image} imports at start-up, not in dependencies: {eager_missing}"
    undeclared = sorted(m for m in third_party_imports(image, eager_only=False)
                        if not distributions_of(m) & (base | extras))
    assert not undeclared, f"{image} imports packages pyproject.toml does not declare: {undeclared}"


@pytest.mark.parametrize(
    "dockerfile",
    sorted(p for p in DOCKER.glob("Dockerfile.*") if p.suffix != ".dockerignore"),
    ids=lambda p: p.name,
)
def test_dockerfile_copies_paths_that_exist(dockerfile: Path) -> None:
    copies = [rest for op, rest in instructions(dockerfile) if op == "COPY"
              and not rest.startswith("--from")]
    assert copies
    for rest in copies:
        *sources, _ = rest.split()
        for source in sources:
            assert (ROOT / source).exists(), f"{dockerfile.name}: COPY {source}"
    assert (dockerfile.parent / f"{dockerfile.name}.dockerignore").is_file()


@pytest.mark.parametrize("image", list(IMAGES))
def test_image_user_ports_and_entrypoint_match_the_deployment(
    image: str, rendered: dict[str, list[Obj]]
) -> None:
    dockerfile, deployment = IMAGES[image]
    steps = instructions(DOCKER / dockerfile)
    user = [rest for op, rest in steps if op == "USER"][-1]
    exposed = {int(p) for op, rest in steps if op == "EXPOSE" for p in rest.split()}
    entrypoint = [rest for op, rest in steps if op == "ENTRYPOINT"][-1]
    workload = find(rendered["gpu-mig"], "Deployment", deployment)
    security = pod_spec(workload)["securityContext"]
    assert user == f"{security['runAsUser']}:{security['runAsGroup']}"
    c = container(workload, image)
    # the ports the pod listens on (the gateway's are HAProxy's, in the container beside)
    listening = {p["containerPort"] for each in pod_spec(workload)["containers"]
                 for p in each.get("ports", [])}
    assert exposed == listening
    assert entrypoint == f'["python", "-m", "{image}"]'
    assert c["command"][:3] == ["python", "-m", image]
    assert (ROOT / image / "__init__.py").is_file()


def test_cpu_triton_image_serves_the_ports_and_user_the_pool_expects(
    rendered: dict[str, list[Obj]],
) -> None:
    steps = instructions(DOCKER / "Dockerfile.triton-cpu")
    workload = find(rendered["cpu-dev"], "Deployment", "triton-efficientnet-lite0")
    security = pod_spec(workload)["securityContext"]
    assert [r for op, r in steps if op == "USER"][-1] == (
        f"{security['runAsUser']}:{security['runAsGroup']}")
    c = container(workload, "tritonserver")
    exposed = {int(p) for op, rest in steps if op == "EXPOSE" for p in rest.split()}
    assert exposed == {p["containerPort"] for p in c["ports"]}
    # the manifests call `tritonserver`: the image provides it on PATH
    assert c["command"] == ["tritonserver"]
    assert any("/usr/local/bin/tritonserver" in rest for op, rest in steps if op == "RUN")
    seed = pod_spec(workload)["initContainers"][0]["command"][-1]
    assert "/opt/infergate/model_repo/" in seed
    assert any(rest.endswith("/opt/infergate/model_repo/") for op, rest in steps if op == "COPY")
    # the stubs' numpy on one BLAS thread, as local members start them
    assert ("ENV", "OPENBLAS_NUM_THREADS=1") in steps
