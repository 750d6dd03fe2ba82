"""Request size limits on both data planes: a body (HTTP) or message (gRPC) above
``--max-request-bytes`` is refused with 413 / RESOURCE_EXHAUSTED, and the gateway keeps
serving."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from converters.tiny import TINY_MODEL_NAME, TINY_WIDTH
from infergate.processes import GatewayProcess
from infergate.triton.local import LocalTriton
from tests.conftest import DATA_PLANES
from tests.procs import pools_yaml, run_gateway

pytestmark = pytest.mark.integration
LIMIT = 64 * 1024


@pytest.fixture(scope="module", params=DATA_PLANES)
def small_gateway(request: pytest.FixtureRequest, triton: LocalTriton,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    assert triton.endpoints is not None
    tmp = tmp_path_factory.mktemp(f"limits-{request.param}")
    pools = pools_yaml(tmp / "pools.yaml", {"local": [triton.endpoints]})
    with run_gateway(pools, tmp, "--max-request-bytes", str(LIMIT),
                     data_plane=request.param) as gw:
        yield gw


def _call(gw: GatewayProcess, protocol: str, rows: int) -> str:
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(gw.http_url if protocol == "http" else gw.grpc_url)
    x = np.ones((rows, TINY_WIDTH), np.float32)
    inp = module.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    try:
        client.infer(TINY_MODEL_NAME, [inp])
        return "OK"
    except InferenceServerException as exc:
        return str(exc.status()).removeprefix("StatusCode.")
    finally:
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_gateway_refuses_request_above_size_limit_and_keeps_serving(
    small_gateway: GatewayProcess, protocol: str,
) -> None:
    too_many_rows = 2 * LIMIT // (4 * TINY_WIDTH)  # twice the limit in FP32 payload
    expected = "413" if protocol == "http" else "RESOURCE_EXHAUSTED"
    assert _call(small_gateway, protocol, too_many_rows) == expected
    assert _call(small_gateway, protocol, 2) == "OK"
