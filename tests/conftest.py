"""Shared fixtures: a real sample model, a real tritonserver, a real gateway process.

Every process is started on free loopback ports and stopped in a ``finally``; the
session ends by checking that no tritonserver or Python-backend stub of ours is left.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from converters.decoupled import DECOUPLED_MODEL_NAME, build_decoupled_model
from converters.samples import SAMPLE_MODEL_NAME, build_sample_model
from converters.tiny import TINY_MODEL_NAME, build_tiny_model
from infergate import processes
from infergate.postgres import MISSING, LocalPostgres, find_postgres_bin
from infergate.triton.local import LocalTriton, TritonSettings
from tests.procs import (
    ROOT,
    GatewayProcess,
    join_ended,
    pools_yaml,
    run_gateway,
    triton_processes,
)

# The gateways tests start run `gateway serve --data-plane haproxy` without its separate
# replica process (--no-replica-process: one process fewer to start, the suite's budget),
# except where the layout itself is under test: the session's gateway (the protocol,
# parity, error and stream suites run against it), the crash, adoption and shutdown tests
# (replica=True).
processes.REPLICA_PROCESS = False

RUNTIME_ENV = ROOT / ".venv-triton"


@pytest.fixture(scope="session")
def sample_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model repository holding the EfficientNet-Lite0 sample (exported once), the
    tiny ``y = 2x + 1`` model and the decoupled ``stream`` model."""
    repo = tmp_path_factory.mktemp("repo") / "model_repo"
    build_sample_model(repo)
    build_tiny_model(repo)
    build_decoupled_model(repo)
    return repo


def triton_settings(repo: Path, log_dir: Path, *models: str) -> TritonSettings:
    return TritonSettings(
        model_repository=repo,
        runtime_env=RUNTIME_ENV,
        log_file=log_dir / "triton.log",
        models=models,
    )


@pytest.fixture(scope="session")
def triton(sample_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTriton]:
    server = LocalTriton(
        triton_settings(sample_repo, tmp_path_factory.mktemp("triton"), SAMPLE_MODEL_NAME,
                        TINY_MODEL_NAME, DECOUPLED_MODEL_NAME)
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


DATA_PLANES = ("haproxy", "python")


@pytest.fixture(scope="session", params=DATA_PLANES)
def gateway(
    request: pytest.FixtureRequest, triton: LocalTriton,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[GatewayProcess]:
    """A gateway over the session's Triton, once per data plane: HAProxy carrying the
    hot path (the default) and the Python data plane."""
    assert triton.endpoints is not None
    tmp = tmp_path_factory.mktemp(f"gateway-{request.param}")
    pools = pools_yaml(tmp / "pools.yaml", {"local": [triton.endpoints]})
    with run_gateway(pools, tmp, data_plane=request.param, replica=True) as proc:
        yield proc


@pytest.fixture(params=DATA_PLANES)
def data_plane(request: pytest.FixtureRequest) -> str:
    """For tests that start their own gateway: run them on both data planes."""
    return str(request.param)


@pytest.fixture(scope="session", autouse=True)
def no_leftover_processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    # Every repository the tests serve lives under this session's base temp dir.
    marker = str(tmp_path_factory.getbasetemp())
    yield
    join_ended()  # the Tritons tests were done with, stopping in the background
    left = triton_processes(marker=marker)
    assert not left, f"tritonserver processes left behind: {left}"


@pytest.fixture(scope="session")
def postgres() -> Iterator[LocalPostgres]:
    """A real PostgreSQL (Debian's binaries), started once per session on a free port
    (tests/postgres.py); each test makes the databases it needs."""
    bindir = find_postgres_bin()
    if bindir is None:
        pytest.fail(MISSING)
    server = LocalPostgres(bindir)
    try:
        server.start()
        yield server
    finally:
        server.stop()
