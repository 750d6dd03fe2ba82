"""HTTP/1.1 framing at the gateway's front door (HAProxy, or uvicorn on the Python data
plane): ``Transfer-Encoding: chunked`` with a ``Content-Length`` is decoded like Triton
does, and whatever the front door refuses comes back as ``{"error": ...}``."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator

import numpy as np
import pytest
import requests

from converters.tiny import TINY_MODEL_NAME, TINY_WIDTH
from infergate.triton.local import LocalTriton
from tests.procs import GatewayProcess

pytestmark = pytest.mark.integration
BODY = json.dumps({"inputs": [{"name": "x", "shape": [1, TINY_WIDTH], "datatype": "FP32",
                               "data": [1.0] * TINY_WIDTH}]}).encode()
INFER = f"/v2/models/{TINY_MODEL_NAME}/infer"


def _exchange(port: int, request: bytes, closes: bool = True
              ) -> tuple[int, dict[str, str], bytes, bool]:
    """(status, headers, body, whether the server closed the connection after it: waited
    for up to 5 s when ``closes``, else not asked, False)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in lines[1:])
        length = int(headers.get("content-length", "0"))
        while len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
        closed = False
        if closes:
            sock.settimeout(5)
            with contextlib.suppress(TimeoutError):
                closed = sock.recv(1) == b""
        return int(lines[0].split()[1]), headers, body, closed


def _chunked_with_length(path: str, body: bytes) -> bytes:
    chunks = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    return (f"POST {path} HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            f"Transfer-Encoding: chunked\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode() + chunks


def test_front_door_decodes_chunked_body_when_content_length_too(
    gateway: GatewayProcess, triton: LocalTriton,
) -> None:
    assert triton.endpoints is not None
    request = _chunked_with_length(INFER, BODY)
    status, headers, body, closed = _exchange(gateway.http_port, request)
    direct = _exchange(triton.endpoints.http_port, request, closes=False)  # Triton keeps it open
    assert (status, json.loads(body)) == (direct[0], json.loads(direct[2])) == (
        200, json.loads(direct[2]))
    np.testing.assert_array_equal(json.loads(body)["outputs"][0]["data"],
                                  [3.0] * TINY_WIDTH)
    # the length is not trusted: nothing more is read from that connection
    assert closed and headers.get("connection") == "close"


def test_front_door_decodes_chunked_body_when_control_plane_path(
    gateway: GatewayProcess,
) -> None:
    request = _chunked_with_length("/v2/repository/index", b'{"ready": true}')
    status, headers, body, _ = _exchange(gateway.http_port, request)
    assert status == 200 and TINY_MODEL_NAME in {m["name"] for m in json.loads(body)}


def _requests_framing(path: str, body: bytes) -> bytes:
    """What ``requests`` sends for a generator body with a Content-Length header: both
    framing headers, and the body raw (not chunk-encoded)."""
    return (f"POST {path} HTTP/1.1\r\nHost: gw\r\nContent-Length: {len(body)}\r\n"
            "Transfer-Encoding: chunked\r\n\r\n").encode() + body


def _assert_refused(gateway: GatewayProcess, answer: tuple[int, dict[str, str], bytes, bool]
                    ) -> None:
    status, headers, body, closed = answer
    assert status == 400 and closed
    if gateway.data_plane == "haproxy":
        # HAProxy 2.6's HTTP/1 parser answers with its built-in page: errorfile,
        # errorfiles and http-error do not reach errors found while parsing (checked)
        assert headers["content-type"] == "text/html"
    else:
        assert headers["content-type"] == "application/json"
        assert "malformed HTTP request" in json.loads(body)["error"]


def test_front_door_refuses_raw_body_when_declared_chunked(gateway: GatewayProcess) -> None:
    _assert_refused(gateway, _exchange(gateway.http_port, _requests_framing(INFER, BODY)))


def test_front_door_answers_requests_client_when_generator_body_has_length(
    gateway: GatewayProcess,
) -> None:
    """The refusal reaches a client that is still sending its body (the Python front
    door closes lingering). Triton itself resets the connection here."""
    if gateway.data_plane == "haproxy":
        pytest.skip("HAProxy closes at once: whether the client reads its HTML 400 before "
                    "the reset is a race (covered on raw sockets above)")

    def body() -> Iterator[bytes]:
        yield BODY[:10]
        yield BODY[10:]

    answer = requests.post(f"http://{gateway.http_url}{INFER}", data=body(), timeout=30,
                           headers={"Content-Length": str(len(BODY))})
    assert answer.status_code == 400
    assert "malformed HTTP request" in answer.json()["error"]


@pytest.mark.parametrize("request_bytes", [
    b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"zz\r\nnot a chunk\r\n0\r\n\r\n",
    b"POST /v2/repository/index HTTP/1.1\r\nHost gw\r\n\r\n",
], ids=["bad-chunk-size", "bad-header-line"])
def test_front_door_refuses_request_when_malformed(
    gateway: GatewayProcess, request_bytes: bytes,
) -> None:
    _assert_refused(gateway, _exchange(gateway.http_port, request_bytes))
