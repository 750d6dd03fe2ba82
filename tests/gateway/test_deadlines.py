"""Deadlines shed hopeless work, on both data planes (gateway/policy/deadline.py):

- a request whose deadline its pool cannot meet, by the model's measured service time
  and the pool's load, is refused at once: 504 / DEADLINE_EXCEEDED, the same message on
  both planes, counted as shed, and Triton never sees it;
- Triton's queue drops a request that waited past the model's SLO (its queue policy),
  and the gateway answers 504 / DEADLINE_EXCEEDED, not Triton's 503 / UNAVAILABLE;
- the Python plane hands the client's deadline to Triton (its ``timeout`` parameter), so
  Triton's own queue drops the request when it expires; HAProxy cannot change a body and
  ends the wait with its server timeout (both 504).

Models: ``slow`` computes a 1200 x 1200 matrix product per batch (about 20 ms here),
``slo`` and ``held`` wait ``HOLD_S`` for a batch, ``slo`` with a 300 ms queue timeout,
``held`` with one of 60 s (Triton takes a request's own timeout only when a model has
one, and it is shorter)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from converters.tiny import TINY_WIDTH, build_tiny_model
from gateway.policy.deadline import EXCEEDED, EXPIRED
from infergate.processes import GatewayProcess
from infergate.triton.local import LocalTriton
from tests.conftest import DATA_PLANES, triton_settings
from tests.procs import pools_yaml, run_gateway, started_triton, wait_until

pytestmark = [pytest.mark.integration]
SLOW, SLO, HELD, HOLD_S = "slow", "slo", "held", 8.0
HOPELESS = re.compile(r"Deadline Exceeded: deadline of (\d+) ms cannot be met: model 'slow' "
                      r"is expected to take (\d+) ms in pool 'p' \(load 0 for capacity 1\), "
                      r"more than 9/10 of it; refused before Triton does the work")


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTriton]:
    tmp = tmp_path_factory.mktemp("deadlines")
    repo = tmp / "model_repo"
    build_tiny_model(repo, SLOW, work=1200)
    build_tiny_model(repo, SLO, max_queue_delay_us=int(HOLD_S * 1e6), queue_timeout_us=300_000)
    # a model whose owner asked Triton to drop what expires (so it takes a client's
    # shorter timeout): the default queue timeout far beyond any test's deadline
    build_tiny_model(repo, HELD, max_queue_delay_us=int(HOLD_S * 1e6),
                     queue_timeout_us=60_000_000)
    with started_triton(triton_settings(repo, tmp, SLOW, SLO, HELD)) as server:
        yield server


@pytest.fixture(scope="module", params=DATA_PLANES)
def gateway(request: pytest.FixtureRequest, triton: LocalTriton,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    assert triton.endpoints is not None
    tmp = tmp_path_factory.mktemp(f"deadlines-{request.param}")
    pools = pools_yaml(tmp / "pools.yaml", {"p": [triton.endpoints]}, capacity_per_member=1)
    with run_gateway(pools, tmp, data_plane=request.param) as gw:
        yield gw


def _body() -> bytes:
    return json.dumps({"inputs": [{"name": "x", "shape": [1, TINY_WIDTH], "datatype": "FP32",
                                   "data": [1.0] * TINY_WIDTH}]}).encode()


def _post(gw: GatewayProcess, model: str, deadline_ms: int | None = None) -> httpx.Response:
    headers = {} if deadline_ms is None else {"x-request-timeout-ms": str(deadline_ms)}
    return httpx.post(f"http://{gw.http_url}/v2/models/{model}/infer", content=_body(),
                      headers=headers, timeout=30)


def _grpc(gw: GatewayProcess, model: str, deadline_s: float | None = None) -> tuple[str, str]:
    client = grpcclient.InferenceServerClient(gw.grpc_url)
    inp = grpcclient.InferInput("x", [1, TINY_WIDTH], "FP32")
    inp.set_data_from_numpy(np.ones((1, TINY_WIDTH), np.float32))
    try:
        client.infer(model, [inp], client_timeout=deadline_s)
        return "OK", ""
    except InferenceServerException as exc:
        return str(exc.status()), str(exc.message())
    finally:
        client.close()


def _metric(gw: GatewayProcess, name: str, **labels: str) -> float:
    text = httpx.get(f"http://{gw.http_url}/metrics").text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def _triton_answered(triton: LocalTriton, model: str) -> float:
    assert triton.endpoints is not None
    text = httpx.get(f"http://{triton.endpoints.host}:{triton.endpoints.metrics_port}"
                     "/metrics").text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "nv_inference_request_success" and s.labels.get("model") == model)


def test_a_deadline_the_pool_cannot_meet_is_refused_before_triton_works(
        gateway: GatewayProcess, triton: LocalTriton) -> None:
    for _ in range(3):  # answers whose compute time the probes measure
        assert _post(gateway, SLOW).status_code == 200

    def shed() -> bool:
        answer = _post(gateway, SLOW, deadline_ms=2)
        return answer.status_code == 504 and HOPELESS.fullmatch(answer.json()["error"]) \
            is not None
    assert wait_until(shed, 20), _post(gateway, SLOW, deadline_ms=2).text
    answered = _triton_answered(triton, SLOW)
    # (on a busy host 2 ms may pass before the Python plane's handler runs: its EXPIRED,
    # which does not reach Triton either; a full run of the suite saw it once)
    for _ in range(5):
        answer = _post(gateway, SLOW, deadline_ms=2)
        assert answer.status_code == 504, answer.text
        match = HOPELESS.fullmatch(answer.json()["error"])
        if match is not None:
            break
        assert answer.json()["error"] == EXPIRED, answer.text
    assert match is not None and match.group(1) == "2" and int(match.group(2)) >= 10, answer.text
    # gRPC: a deadline the client's own library does not end first (on a busy host it may
    # pass before the answer: the client's own "Deadline Exceeded", or the Python plane's
    # EXPIRED when its handler runs after it; neither reaches Triton)
    said: list[str] = []
    for _ in range(5):
        code, message = _grpc(gateway, SLOW, deadline_s=0.008)
        said.append(message)
        assert code == "StatusCode.DEADLINE_EXCEEDED", message
        if HOPELESS.fullmatch(message):
            break
        assert message in (EXPIRED, EXCEEDED), message
    assert HOPELESS.fullmatch(said[-1]), said
    assert _triton_answered(triton, SLOW) == answered  # never reached Triton
    # a deadline the pool can meet is served
    assert _post(gateway, SLOW, deadline_ms=30_000).status_code == 200
    assert _grpc(gateway, SLOW, deadline_s=30.0) == ("OK", "")

    def counted() -> bool:  # HAProxy's telemetry arrives a moment after its answers
        return _metric(gateway, "infergate_rejected_requests_total", model=SLOW,
                       reason="deadline") >= 3
    assert wait_until(counted, 20)


def test_a_request_tritons_queue_dropped_at_the_models_slo_is_a_deadline(
        gateway: GatewayProcess) -> None:
    started = time.monotonic()
    answer = _post(gateway, SLO)
    assert answer.status_code == 504, answer.text
    assert answer.json() == {"error": "Request timeout expired"}
    assert _grpc(gateway, SLO) == ("StatusCode.DEADLINE_EXCEEDED", "Request timeout expired")
    assert time.monotonic() - started < HOLD_S  # dropped, not held for the batch


def test_the_clients_deadline_ends_the_wait_on_both_planes(gateway: GatewayProcess,
                                                          triton: LocalTriton) -> None:
    assert triton.endpoints is not None
    started = time.monotonic()
    answer = _post(gateway, HELD, deadline_ms=500)
    assert answer.status_code == 504, answer.text
    if gateway.data_plane == "python":
        # Triton's queue dropped it (the timeout parameter reached it, at 9/10 of the
        # deadline), or the gateway's own timer ended the wait first: this test run alone
        # saw the latter 4 times of 4, in its module's order the former
        assert answer.json()["error"] in (
            "Request timeout expired",
            f"Deadline Exceeded: no answer from member {triton.endpoints.grpc_url} in time")
    else:  # HAProxy's server timeout: it cannot add the parameter to the body
        assert answer.json()["error"] == ("Deadline Exceeded: no answer from the Triton "
                                          "member in time")
    labels = {"model": HELD, "protocol": "grpc"}
    before = {outcome: _metric(gateway, "infergate_requests_total", outcome=outcome, **labels)
              for outcome in ("deadline", "cancelled")}
    code, _ = _grpc(gateway, HELD, deadline_s=0.5)
    assert code == "StatusCode.DEADLINE_EXCEEDED"
    assert time.monotonic() - started < HOLD_S
    # counted ``deadline`` on both planes, whichever timer ended it: the client's own (its
    # cancellation, at the deadline), HAProxy's server timeout, the Python plane's
    assert wait_until(lambda: _metric(gateway, "infergate_requests_total", outcome="deadline",
                                      **labels) == before["deadline"] + 1, 10)
    assert _metric(gateway, "infergate_requests_total", outcome="cancelled",
                   **labels) == before["cancelled"]


def _triton_pending(triton: LocalTriton, model: str) -> float:
    assert triton.endpoints is not None
    text = httpx.get(f"http://{triton.endpoints.host}:{triton.endpoints.metrics_port}"
                     "/metrics").text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "nv_inference_pending_request_count"
               and s.labels.get("model") == model)


def test_a_grpc_call_its_client_cancels_while_triton_holds_it_is_counted_cancelled(
        gateway: GatewayProcess, triton: LocalTriton) -> None:
    """Both planes count it once, as ``cancelled`` (HAProxy logs it with status -1, the
    Python plane's call is cancelled): before, neither counted it at all."""
    def grpc_held(outcome: str | None = None) -> float:
        labels = {"model": HELD, "protocol": "grpc"} | ({"outcome": outcome} if outcome else {})
        return _metric(gateway, "infergate_requests_total", **labels)

    before, cancelled_before = grpc_held(), grpc_held("cancelled")
    client = grpcclient.InferenceServerClient(gateway.grpc_url)
    inp = grpcclient.InferInput("x", [1, TINY_WIDTH], "FP32")
    inp.set_data_from_numpy(np.ones((1, TINY_WIDTH), np.float32))
    errors: list[InferenceServerException | None] = []
    try:
        call = client.async_infer(HELD, [inp], callback=lambda result, error: errors.append(error))
        # Triton holds it for its batch (HOLD_S)
        assert wait_until(lambda: _triton_pending(triton, HELD) >= 1, 5)
        call.cancel()
        assert wait_until(lambda: grpc_held("cancelled") == cancelled_before + 1, 10)
        assert grpc_held() == before + 1  # counted once, under no other outcome
        assert wait_until(lambda: bool(errors), 5)
        assert errors[0] is not None and "CANCELLED" in str(errors[0].status())
    finally:
        client.close()
