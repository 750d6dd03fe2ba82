"""SIGTERM is bounded: ``gateway serve`` exits within ``--drain-timeout`` plus 5 s while
streams are open, on both data planes, and the streams end with what a client retries
(gRPC ``UNAVAILABLE``, a ``generate_stream`` error event saying the gateway is shutting
down) instead of being cut or reset. Real processes: Triton with the decoupled
model, the gateway as a subprocess, real clients."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from converters.decoupled import DECOUPLED_MODEL_NAME, build_decoupled_model
from infergate.triton.local import LocalTriton
from tests.conftest import triton_settings
from tests.procs import pools_yaml, run_gateway, started_triton

pytestmark = pytest.mark.integration
MODEL = DECOUPLED_MODEL_NAME
DRAIN_S = 2.0
COUNT, DELAY_MS = 1000, 100  # ~100 s of responses
LONG = {"text_input": "x", "count": COUNT, "delay_ms": DELAY_MS}


@pytest.fixture(scope="module")
def stream_triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTriton]:
    tmp = tmp_path_factory.mktemp("shutdown")
    build_decoupled_model(tmp / "repo")
    with started_triton(triton_settings(tmp / "repo", tmp, MODEL)) as server:
        yield server


@dataclass
class Seen:
    """What one stream's client saw: responses, and how the stream ended."""

    first: threading.Event = field(default_factory=threading.Event)
    responses: int = 0
    end: str = ""  # the status (gRPC) or the last event (HTTP)
    details: str = ""
    error: str = ""  # what the client library raised, if anything


def _generate_stream(url: str, seen: Seen) -> None:
    try:
        with httpx.stream("POST", f"http://{url}/v2/models/{MODEL}/generate_stream",
                          json=LONG, timeout=60) as resp:
            for line in resp.iter_lines():
                if line:
                    seen.responses += 1
                    seen.end = line
                    seen.first.set()
    except httpx.HTTPError as exc:  # a body cut short
        seen.error = repr(exc)


def _model_stream_infer(url: str, seen: Seen) -> None:
    request = service_pb2.ModelInferRequest(model_name=MODEL, id="long")
    for name, value in (("count", COUNT), ("delay_ms", DELAY_MS)):
        request.inputs.add(name=name, datatype="INT32", shape=[1]).contents.int_contents \
            .append(value)
    request.inputs.add(name="text_input", datatype="BYTES", shape=[1]).contents \
        .bytes_contents.append(b"x")

    async def run() -> None:
        async with grpc.aio.insecure_channel(url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

            async def requests() -> AsyncIterator[service_pb2.ModelInferRequest]:
                yield request
                await asyncio.sleep(3600)  # the client's side stays open

            call = stub.ModelStreamInfer(requests())
            try:
                async for _ in call:
                    seen.responses += 1
                    seen.first.set()
            except grpc.aio.AioRpcError as exc:
                seen.end, seen.details = exc.code().name, exc.details() or ""
                return
            seen.end = (await call.code()).name

    asyncio.run(run())


def test_serve_exits_within_drain_timeout_and_ends_streams_retryably_when_sigterm(
    stream_triton: LocalTriton, data_plane: str, tmp_path: Path,
) -> None:
    assert stream_triton.endpoints is not None
    pools = pools_yaml(tmp_path / "pools.yaml", {"local": [stream_triton.endpoints]})
    sse, stream = Seen(), Seen()
    with run_gateway(pools, tmp_path, "--drain-timeout", str(DRAIN_S),
                     data_plane=data_plane, replica=True) as gw:
        clients = [threading.Thread(target=_generate_stream, args=(gw.http_url, sse)),
                   threading.Thread(target=_model_stream_infer, args=(gw.grpc_url, stream))]
        for client in clients:
            client.start()
        assert sse.first.wait(30) and stream.first.wait(30)
        before = (sse.responses, stream.responses)
        sent = time.monotonic()
        gw.proc.send_signal(signal.SIGTERM)
        code = gw.proc.wait(DRAIN_S + 30)
        exited_after = time.monotonic() - sent
        for client in clients:
            client.join(10)
    print(f"\n[{data_plane}] exited {exited_after:.2f} s after SIGTERM "
          f"(--drain-timeout {DRAIN_S:g}); generate_stream: {sse.responses - before[0]} "
          f"events during the drain, last {sse.end!r}, error {sse.error!r}; "
          f"ModelStreamInfer: {stream.responses - before[1]} responses during the drain, "
          f"ended {stream.end} {stream.details!r}")
    assert code == 0
    # the open streams held the drain for its whole length, and nothing outlived it
    assert DRAIN_S - 0.5 <= exited_after < DRAIN_S + 5
    # both streams kept flowing while the gateway drained
    assert sse.responses > before[0] + 5 and stream.responses > before[1] + 5
    assert not sse.error, sse.error
    assert "shutting down" in json.loads(sse.end.removeprefix("data: "))["error"]
    assert stream.end == "UNAVAILABLE", stream.details
    if data_plane == "python":  # through HAProxy: its connection closing (GOAWAY) says why
        assert "shutting down" in stream.details


def test_serve_with_a_replica_polling_its_snapshots_stops_without_an_error_in_its_log(
    stream_triton: LocalTriton, tmp_path: Path,
) -> None:
    """The data-plane replica long-polls the control plane's snapshot feed (up to 30 s
    a poll). It stops first and lets its poll go; the control plane's poll ends with it,
    and one still parked when the control plane closes (a replica elsewhere) is answered
    at once: uvicorn never has to cancel it, which it logged as an exception."""
    assert stream_triton.endpoints is not None
    pools = pools_yaml(tmp_path / "pools.yaml", {"local": [stream_triton.endpoints]})
    with (run_gateway(pools, tmp_path, "--drain-timeout", "1", data_plane="haproxy",
                      replica=True) as gw,
          httpx.Client(base_url=f"http://{gw.http_url}", timeout=10) as client):
        # a second poller, as a replica on another host would be: parked until the end
        parked = threading.Thread(target=lambda: client.get(
            "/v1/dataplane/snapshot", params={"have": _version(client), "wait": 30}))
        parked.start()
        gw.proc.send_signal(signal.SIGTERM)
        code = gw.proc.wait(30)
        parked.join(10)
    log = gw.log.read_text(errors="replace")
    assert code == 0, log[-3000:]
    assert "Exception in ASGI application" not in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]


def _version(client: httpx.Client) -> str:
    return str(client.get("/v1/dataplane/snapshot").json()["version"])
