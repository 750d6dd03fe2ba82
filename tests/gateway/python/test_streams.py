"""gRPC ``ModelStreamInfer`` through the gateway on a real decoupled Python-backend model
(``converters/decoupled.py``): many responses per request, pipelining, errors mid-stream,
deadlines, cancellation and member failure, compared with the same calls straight to
Triton, on both data planes."""

from __future__ import annotations

import asyncio
import os
import queue
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from prometheus_client.parser import text_string_to_metric_families

from converters.decoupled import DECOUPLED_MODEL_NAME, build_decoupled_model
from infergate.triton.local import LocalTriton
from tests.conftest import triton_settings
from tests.procs import GatewayProcess, pools_yaml, run_gateway, started_triton, wait_until

pytestmark = pytest.mark.integration
MODEL = DECOUPLED_MODEL_NAME


def stream_inputs(module: Any, text: str, count: int, delay_ms: int = 0,
                  fail_at: int = -1) -> list[Any]:
    inputs = []
    for name, value, datatype in (
        ("text_input", np.array([text.encode()], dtype=np.object_), "BYTES"),
        ("count", np.array([count], dtype=np.int32), "INT32"),
        ("delay_ms", np.array([delay_ms], dtype=np.int32), "INT32"),
        ("fail_at", np.array([fail_at], dtype=np.int32), "INT32"),
    ):
        tensor = module.InferInput(name, [1], datatype)
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    return inputs


def _answer(result: Any, error: Any) -> tuple[str, ...]:
    if error is not None:
        return ("error", str(error))
    response = result.get_response()
    if not response.outputs:
        return (response.id, "empty-final")
    return (response.id, result.as_numpy("text_output")[0].decode(),
            str(int(result.as_numpy("index")[0])))


# request id, text, count, delay_ms, fail_at: many responses, one delayed, one failing
REQUESTS = (("a", "alpha", 3, 0, -1), ("b", "beta", 2, 300, -1), ("c", "gamma", 4, 0, 1))


def sync_stream(url: str, requests: tuple[tuple[Any, ...], ...] = REQUESTS,
                empty_final: bool = False) -> list[tuple[str, ...]]:
    """Every answer of one stream (tritonclient.grpc start_stream/async_stream_infer)."""
    answers: queue.Queue[tuple[str, ...]] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: answers.put(_answer(result, error)))
    try:
        for request_id, text, count, delay, fail in requests:
            client.async_stream_infer(MODEL, stream_inputs(grpcclient, text, count, delay, fail),
                                      request_id=request_id,
                                      enable_empty_final_response=empty_final)
    finally:
        client.stop_stream()  # half-closes, then waits for the member to finish
        client.close()
    out = []
    while not answers.empty():
        out.append(answers.get())
    return out


def expected(requests: tuple[tuple[Any, ...], ...] = REQUESTS) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for request_id, text, count, _, fail in requests:
        for i in range(count):
            if i == fail:
                out.append(("error", f"failed at response {i} as asked"))
                break
            out.append((request_id, f"{text} {i}", str(i)))
    return out


def test_stream_relays_every_response_when_decoupled_model_via_sync_client(
    gateway: GatewayProcess, triton: LocalTriton,
) -> None:
    assert triton.endpoints is not None
    via_gateway = sync_stream(gateway.grpc_url)
    direct = sync_stream(triton.endpoints.grpc_url)
    assert sorted(via_gateway) == sorted(direct) == sorted(expected())
    # per request, responses keep their order
    for request_id in "abc":
        assert [a for a in via_gateway if a[0] == request_id] == [
            a for a in expected() if a[0] == request_id]


def test_stream_relays_empty_final_responses_when_client_asks(
    gateway: GatewayProcess, triton: LocalTriton,
) -> None:
    assert triton.endpoints is not None
    requests = (("a", "alpha", 2, 0, -1), ("z", "zero", 0, 0, -1))
    via_gateway = sync_stream(gateway.grpc_url, requests, empty_final=True)
    direct = sync_stream(triton.endpoints.grpc_url, requests, empty_final=True)
    assert sorted(via_gateway) == sorted(direct)
    assert ("z", "empty-final") in via_gateway and ("a", "empty-final") in via_gateway


def test_stream_pipelines_requests_when_an_earlier_one_is_slow(gateway: GatewayProcess) -> None:
    # "slow" waits 1.5 s before its only response; "fast" answers at once: a gateway that
    # handled a stream's requests one after another would deliver "slow" first
    answers = sync_stream(gateway.grpc_url, (("slow", "s", 1, 1500, -1),
                                             ("fast", "f", 1, 0, -1)))
    assert [a[0] for a in answers] == ["fast", "slow"]


async def _aio_stream(url: str, requests: tuple[tuple[Any, ...], ...]) -> list[tuple[str, ...]]:
    client = grpcaio.InferenceServerClient(url)

    async def requests_iter() -> Any:
        for request_id, text, count, delay, fail in requests:
            yield {"model_name": MODEL, "request_id": request_id,
                   "inputs": stream_inputs(grpcaio, text, count, delay, fail)}

    try:
        return [_answer(result, error)
                async for result, error in client.stream_infer(requests_iter())]
    finally:
        await client.close()


def test_stream_relays_every_response_when_aio_client(
    gateway: GatewayProcess, triton: LocalTriton,
) -> None:
    assert triton.endpoints is not None
    direct_url = triton.endpoints.grpc_url

    async def both() -> tuple[list[tuple[str, ...]], list[tuple[str, ...]]]:
        return (await _aio_stream(gateway.grpc_url, REQUESTS),
                await _aio_stream(direct_url, REQUESTS))

    via_gateway, direct = asyncio.run(both())
    assert sorted(via_gateway) == sorted(direct) == sorted(expected())


def _stream_status(url: str, requests: tuple[tuple[Any, ...], ...], timeout_s: float | None,
                   cancel_after: int | None = None, details: list[str] | None = None
                   ) -> tuple[grpc.StatusCode, int]:
    """(status the stream ended with, responses received before) on a raw aio stub;
    ``details``: gets the status's message."""
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    async def run() -> tuple[grpc.StatusCode, int]:
        channel = grpc.aio.insecure_channel(url)
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        messages = []
        for request_id, text, count, delay, fail in requests:
            request = service_pb2.ModelInferRequest(model_name=MODEL, id=request_id)
            for name, value, datatype in (("text_input", [text.encode()], "BYTES"),
                                          ("count", [count], "INT32"),
                                          ("delay_ms", [delay], "INT32"),
                                          ("fail_at", [fail], "INT32")):
                tensor = request.inputs.add(name=name, datatype=datatype, shape=[1])
                if datatype == "BYTES":
                    tensor.contents.bytes_contents.extend(value)
                else:
                    tensor.contents.int_contents.extend(value)
            messages.append(request)

        async def gen() -> Any:
            for m in messages:
                yield m
            await asyncio.sleep(3600)  # keep the stream open: the server ends it

        call = stub.ModelStreamInfer(gen(), timeout=timeout_s)
        received = 0
        try:
            async for _ in call:
                received += 1
                if cancel_after is not None and received >= cancel_after:
                    call.cancel()
        except grpc.aio.AioRpcError as exc:
            if details is not None:
                details.append(exc.details() or "")
            return exc.code(), received
        except asyncio.CancelledError:
            return grpc.StatusCode.CANCELLED, received
        finally:
            await channel.close()
        return await call.code(), received

    return asyncio.run(run())


def test_stream_ends_with_deadline_exceeded_when_client_deadline_passes(
    gateway: GatewayProcess, triton: LocalTriton,
) -> None:
    """Through HAProxy the client's own timer ends it (the control plane waits
    ``deadline.STREAM_GRACE_MS`` longer): HAProxy 2.6 would turn the control plane's end
    into RST_STREAM(CANCEL), which a client busy reading reports as "Stream removed
    (RST_STREAM ... error code 8)" (CI saw it). Counted ``deadline`` on both planes."""
    assert triton.endpoints is not None
    slow = (("a", "a", 20, 200, -1),)
    said: list[str] = []
    labels = {"model": MODEL, "protocol": "grpc_stream"}
    before = {outcome: _metric(gateway.http_url, "infergate_requests_total", outcome=outcome,
                               **labels) for outcome in ("deadline", "cancelled")}
    code, received = _stream_status(gateway.grpc_url, slow, timeout_s=1.0, details=said)
    direct_code, _ = _stream_status(triton.endpoints.grpc_url, slow, timeout_s=1.0,
                                    details=said)
    assert code == direct_code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert received < 20
    # the text Triton's QA checks look for; straight to Triton too it is sometimes the
    # client's own "Deadline Exceeded", sometimes "Stream removed (Deadline Exceeded)"
    # (whichever of the client's timer and the server's end of the stream comes first)
    assert all("Deadline Exceeded" in text for text in said), said
    assert wait_until(lambda: _metric(gateway.http_url, "infergate_requests_total",
                                      outcome="deadline", **labels)
                      == before["deadline"] + 1, 10)
    assert _metric(gateway.http_url, "infergate_requests_total", outcome="cancelled",
                   **labels) == before["cancelled"]


def _metric(url: str, name: str, **labels: str) -> float:
    text = httpx.get(f"http://{url}/metrics").text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def test_stream_cancellation_frees_the_stream_when_client_cancels(
    gateway: GatewayProcess,
) -> None:
    code, received = _stream_status(gateway.grpc_url, (("a", "a", 100, 50, -1),),
                                    timeout_s=30, cancel_after=2)
    assert code == grpc.StatusCode.CANCELLED and received == 2
    assert wait_until(lambda: _metric(gateway.http_url, "infergate_in_flight_requests",
                                      model=MODEL) == 0, 10)


def test_stream_metrics_count_responses_per_request_when_decoupled(
    gateway: GatewayProcess,
) -> None:
    labels = {"model": MODEL, "protocol": "grpc_stream"}
    before = (_metric(gateway.http_url, "infergate_responses_per_request_count", **labels),
              _metric(gateway.http_url, "infergate_responses_per_request_sum", **labels),
              _metric(gateway.http_url, "infergate_time_to_first_response_seconds_count",
                      **labels))
    sync_stream(gateway.grpc_url)
    after = (_metric(gateway.http_url, "infergate_responses_per_request_count", **labels),
             _metric(gateway.http_url, "infergate_responses_per_request_sum", **labels),
             _metric(gateway.http_url, "infergate_time_to_first_response_seconds_count",
                     **labels))
    # 3 requests: 3 + 2 + 2 (one answer, then the error) responses, each answered
    assert (after[0] - before[0], after[1] - before[1], after[2] - before[2]) == (3, 7, 3)


@pytest.fixture
def own_triton(tmp_path: Path) -> Iterator[LocalTriton]:
    repo = tmp_path / "repo"
    build_decoupled_model(repo)
    with started_triton(triton_settings(repo, tmp_path, MODEL)) as server:
        yield server


def test_stream_ends_with_unavailable_when_member_dies_after_client_half_closed(
    own_triton: LocalTriton, data_plane: str, tmp_path: Path,
) -> None:
    """tritonclient.grpc.aio's stream_infer half-closes once its request iterator ends;
    the member dies while it is still answering."""
    assert own_triton.endpoints is not None and own_triton.pid is not None
    pools = pools_yaml(tmp_path / "pools.yaml", {"only": [own_triton.endpoints]})

    async def run(url: str) -> list[tuple[str, ...]]:
        client = grpcaio.InferenceServerClient(url)

        async def requests_iter() -> Any:
            yield {"model_name": MODEL, "request_id": "a",
                   "inputs": stream_inputs(grpcaio, "x", 200, 50)}

        seen: list[tuple[str, ...]] = []
        try:
            async for result, error in client.stream_infer(requests_iter()):
                seen.append(_answer(result, error))
                if len(seen) == 1:
                    os.killpg(own_triton.pid or 0, signal.SIGKILL)
        except grpc.aio.AioRpcError as exc:  # the aio client raises the stream's status
            seen.append(("error", str(exc.code())))
        finally:
            await client.close()
        return seen

    with run_gateway(pools, tmp_path, data_plane=data_plane) as gw:
        seen = asyncio.run(run(gw.grpc_url))
    assert seen[0] == ("a", "x 0", "0")
    assert seen[-1] == ("error", "StatusCode.UNAVAILABLE")
    assert len(seen) < 200


def test_stream_ends_when_member_dies_while_client_stream_open(
    own_triton: LocalTriton, data_plane: str, tmp_path: Path,
) -> None:
    """With the client's request side still open, HAProxy 2.6 may turn the control plane's
    end of the stream into RST_STREAM(CANCEL) (haproxy/haproxy#1219): whether the client
    reads the trailers' UNAVAILABLE or the reset's CANCELLED first is a race there (CI saw
    both), so HAProxy may answer either; the Python data plane always says UNAVAILABLE."""
    assert own_triton.endpoints is not None and own_triton.pid is not None
    pools = pools_yaml(tmp_path / "pools.yaml", {"only": [own_triton.endpoints]})
    with run_gateway(pools, tmp_path, data_plane=data_plane) as gw:
        answers: queue.Queue[tuple[tuple[str, ...], str]] = queue.Queue()
        client = grpcclient.InferenceServerClient(gw.grpc_url)
        client.start_stream(callback=lambda result, error: answers.put(
            (_answer(result, error), str(error.status()) if error is not None else "")))
        try:
            client.async_stream_infer(MODEL, stream_inputs(grpcclient, "x", 200, 50),
                                      request_id="a")
            first = answers.get(timeout=30)
            assert first[0] == ("a", "x 0", "0")
            os.killpg(own_triton.pid, signal.SIGKILL)
            seen = [answers.get(timeout=30)]
            while seen[-1][0][0] != "error":
                seen.append(answers.get(timeout=30))
        finally:
            client.stop_stream(cancel_requests=True)
            client.close()
    expected = ({"StatusCode.CANCELLED", "StatusCode.UNAVAILABLE"} if data_plane == "haproxy"
                else {"StatusCode.UNAVAILABLE"})
    assert seen[-1][1] in expected
    assert len(seen) < 200
