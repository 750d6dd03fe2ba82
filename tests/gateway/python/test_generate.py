"""Triton's generate extension through the gateway, plain HTTP, on the decoupled test
model: the same answers as Triton, server-sent events relayed one by one, errors in
Triton's shape, metrics; on both data planes."""

from __future__ import annotations

import json
import socket
from typing import Any

import httpx
import pytest

from converters.decoupled import DECOUPLED_MODEL_NAME
from infergate.triton.local import LocalTriton
from tests.gateway.python.test_streams import _metric
from tests.procs import GatewayProcess

pytestmark = pytest.mark.integration
MODEL = DECOUPLED_MODEL_NAME

BODIES: list[Any] = [
    {"text_input": "hi", "count": 1},  # exactly one response
    {"text_input": "hi", "count": 3},  # generate refuses many; generate_stream: 3 events
    {"text_input": "hi", "count": 3, "fail_at": 1},  # one event, then an error event
    {"text_input": "hi", "count": 0},  # no response at all
    {"text_input": "hi", "count": 2, "delay_ms": 200},
    {"no_such_input": 1},  # Triton's 400
]


def _post(url: str, path: str, body: Any) -> tuple[int, str, Any]:
    data = body if isinstance(body, str) else json.dumps(body)
    resp = httpx.post(f"http://{url}{path}", content=data, timeout=30)
    kind = resp.headers.get("content-type", "").split(";")[0]
    return resp.status_code, kind, resp.json() if kind == "application/json" else resp.text


@pytest.mark.parametrize("endpoint", ["generate", "generate_stream"])
@pytest.mark.parametrize("version", ["", "/versions/1"])
def test_generate_answers_like_triton_when_same_request(
    gateway: GatewayProcess, triton: LocalTriton, endpoint: str, version: str,
) -> None:
    assert triton.endpoints is not None
    path = f"/v2/models/{MODEL}{version}/{endpoint}"
    for body in BODIES:
        assert _post(gateway.http_url, path, body) == _post(triton.endpoints.http_url, path,
                                                            body), body


def test_generate_stream_relays_events_when_each_is_sent(gateway: GatewayProcess) -> None:
    path = f"/v2/models/{MODEL}/generate_stream"
    body = {"text_input": "hi", "count": 3, "fail_at": 2}
    with httpx.stream("POST", f"http://{gateway.http_url}{path}", json=body,
                      timeout=30) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = [line for line in resp.iter_lines() if line]
    assert [json.loads(e.removeprefix("data: ")) for e in events] == [
        {"index": 0, "model_name": MODEL, "model_version": "1", "text_output": "hi 0"},
        {"index": 1, "model_name": MODEL, "model_version": "1", "text_output": "hi 1"},
        {"error": "failed at response 2 as asked"},
    ]


def test_generate_stream_sends_first_event_when_later_ones_pending(
    gateway: GatewayProcess,
) -> None:
    """The first event reaches the client while the request is still in flight at the
    member (the second comes 2 s later): nothing waits for the whole answer."""
    path = f"/v2/models/{MODEL}/generate_stream"
    body = {"text_input": "hi", "count": 2, "delay_ms": 2000}
    with httpx.stream("POST", f"http://{gateway.http_url}{path}", json=body,
                      timeout=30) as resp:
        lines = resp.iter_lines()
        first = next(line for line in lines if line)
        in_flight = _metric(gateway.http_url, "infergate_in_flight_requests", model=MODEL)
        rest = [line for line in lines if line]
    assert json.loads(first.removeprefix("data: "))["index"] == 0
    assert in_flight == 1
    assert len(rest) == 1


def test_generate_errors_in_triton_shape_when_gateway_refuses(
    gateway: GatewayProcess, triton: LocalTriton,
) -> None:
    assert triton.endpoints is not None
    for endpoint in ("generate", "generate_stream"):
        path = f"/v2/models/{MODEL}/{endpoint}"
        status, kind, answer = _post(gateway.http_url, path, "{not json")
        direct = _post(triton.endpoints.http_url, path, "{not json")
        # Triton says 500 for a body it cannot parse; the gateway 400, same message
        assert (status, kind) == (400, "application/json") and direct[0] == 500
        assert answer == direct[2]
        resp = httpx.post(f"http://{gateway.http_url}{path}", content="{}",
                          headers={"x-request-timeout-ms": "soon"})
        assert resp.status_code == 400 and "error" in resp.json()


def test_generate_stream_metrics_count_events_when_streamed(gateway: GatewayProcess) -> None:
    labels = {"model": MODEL, "protocol": "http_generate_stream"}
    names = ("infergate_responses_per_request_count", "infergate_responses_per_request_sum",
             "infergate_time_to_first_response_seconds_count")
    before = [_metric(gateway.http_url, n, **labels) for n in names]
    _post(gateway.http_url, f"/v2/models/{MODEL}/generate_stream",
          {"text_input": "hi", "count": 4})
    after = [_metric(gateway.http_url, n, **labels) for n in names]
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 4, 1]
    ok = _metric(gateway.http_url, "infergate_requests_total", model=MODEL,
                 protocol="http_generate_stream", outcome="success")
    assert ok >= 1


def test_generate_stream_events_arrive_apart_when_sent_apart(gateway: GatewayProcess) -> None:
    """16 events 2 ms apart reach the client's socket in several reads: a front door
    that holds small writes back while more keep coming delivers the stream in one or
    two (HAProxy without ``option http-no-delay`` did)."""
    body = json.dumps({"text_input": "hi", "count": 16, "delay_ms": 2}).encode()
    request = (f"POST /v2/models/{MODEL}/generate_stream HTTP/1.1\r\nHost: gw\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
               "Connection: close\r\n\r\n").encode() + body
    with socket.create_connection(("127.0.0.1", gateway.http_port), timeout=30) as sock:
        sock.sendall(request)
        reads, data = 0, b""
        while chunk := sock.recv(65536):
            if b"data: " in chunk:
                reads += 1
            data += chunk
    assert data.count(b"data: ") == 16
    assert reads >= 4, reads
