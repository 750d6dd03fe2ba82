"""HTTP inference bodies schemathesis cannot write, both data planes: binary tensors
with a broken ``Inference-Header-Content-Length``, truncated or oversized tensor bytes,
wrong datatypes, shapes and ``binary_data_size``, compressed-looking bodies that are not,
random bytes, and model names that are not UTF-8, too long or not names at all. Seeded
mutations of one good request."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest

from converters.tiny import TINY_MODEL_NAME, TINY_WIDTH
from tests.fuzz.conftest import fuzzing
from tests.fuzz.tally import Tally, cases
from tests.procs import GatewayProcess

pytestmark = pytest.mark.integration
DATATYPES = ["BOOL", "UINT8", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64",
             "BYTES", "BF16", "fp32", "", "FP31", "STRING"]
Request = tuple[str, dict[str, str], bytes]  # path, headers, body


def binary_request(rng: random.Random, rows: int = 2) -> tuple[dict[str, Any], bytes]:
    x = np.asarray([rng.uniform(-5, 5) for _ in range(rows * TINY_WIDTH)], np.float32)
    header = {"inputs": [{"name": "x", "shape": [rows, TINY_WIDTH], "datatype": "FP32",
                          "parameters": {"binary_data_size": x.nbytes}}],
              "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}
    return header, x.tobytes()


def _encode(header: dict[str, Any], tensor: bytes, length: str | None = None) -> Request:
    head = json.dumps(header).encode()
    hdrs = {"content-type": "application/octet-stream",
            "inference-header-content-length": length if length is not None else str(len(head))}
    return f"/v2/models/{TINY_MODEL_NAME}/infer", hdrs, head + tensor


def _broken_length(rng: random.Random) -> Request:
    header, tensor = binary_request(rng)
    size = len(json.dumps(header))
    length = rng.choice([str(size + rng.randint(1, 64)), str(size - rng.randint(1, size)),
                         "0", "-1", str(2**63), str(2**64 + 5), "abc", "1e3", " 12", "",
                         str(size + len(tensor)), str(size + len(tensor) + 1), "0x10"])
    return _encode(header, tensor, length)


def _truncated_tensor(rng: random.Random) -> Request:
    header, tensor = binary_request(rng, rng.randint(1, 8))
    return _encode(header, tensor[: rng.randint(0, len(tensor) - 1)])


def _extra_tensor_bytes(rng: random.Random) -> Request:
    header, tensor = binary_request(rng)
    return _encode(header, tensor + rng.randbytes(rng.randint(1, 256)))


def _wrong_binary_size(rng: random.Random) -> Request:
    header, tensor = binary_request(rng)
    params = header["inputs"][0]["parameters"]
    params["binary_data_size"] = rng.choice([-1, 0, 1, len(tensor) * 2, 2**62, "12", None,
                                             1.5, [], {"a": 1}, True])
    return _encode(header, tensor)


def _wrong_datatype(rng: random.Random) -> Request:
    header, tensor = binary_request(rng)
    header["inputs"][0]["datatype"] = rng.choice(DATATYPES)
    if header["inputs"][0]["datatype"] == "BYTES" and rng.random() < 0.5:
        tensor = (2**31).to_bytes(4, "little") + tensor[4:]  # a length prefix past the end
    return _encode(header, tensor)


def _wrong_shape(rng: random.Random) -> Request:
    header, tensor = binary_request(rng)
    header["inputs"][0]["shape"] = rng.choice([
        [], [0], [-1, TINY_WIDTH], [2**62, 2**62], [2, TINY_WIDTH + 1], [1] * 64,
        [TINY_WIDTH * 2], [2, TINY_WIDTH, 1], ["2", "16"], [2.5, 16], [True, 16],
        [rng.randint(-2**40, 2**40) for _ in range(rng.randint(1, 4))],
    ])
    return _encode(header, tensor)


def _wrong_json_tensor(rng: random.Random) -> Request:
    rows = rng.randint(1, 3)
    entry: dict[str, Any] = {"name": rng.choice(["x", "y", "", "x" * 300, 5]),
                             "shape": [rows, TINY_WIDTH], "datatype": rng.choice(DATATYPES),
                             "data": [1.0] * rows * TINY_WIDTH}
    field = rng.choice(["data", "shape", "datatype", "name", "parameters", None])
    if field is not None:
        entry[field] = rng.choice([None, "x", {"a": [1]}, [[1, 2], [3]], [1e308] * 16,
                                   ["a"] * 32, -1, [None] * 16, True])
    body: dict[str, Any] = {"inputs": rng.choice([[entry], [entry, entry], [], entry, None])}
    if rng.random() < 0.3:
        body["outputs"] = rng.choice([[{"name": {"a": 1}}], [{"name": 7}], [{}], "y",
                                      [{"name": "nope"}], [{"name": "y", "parameters": 3}]])
    if rng.random() < 0.2:
        body["parameters"] = rng.choice([{"priority": "high"}, {"timeout": -5}, [], "x",
                                         {"binary_data_output": "yes"}])
    return (f"/v2/models/{TINY_MODEL_NAME}/infer", {"content-type": "application/json"},
            json.dumps(body).encode())


def _random_body(rng: random.Random) -> Request:
    body = rng.choice([rng.randbytes(rng.randint(0, 512)), b"", b"{", b"[]", b"null",
                       b'{"inputs": [' * 200, b"\xff\xfe{}", b"{}" * 1000])
    hdrs = rng.choice([{}, {"content-type": "application/json"},
                       {"content-encoding": rng.choice(["gzip", "deflate", "br", "x"])},
                       {"content-type": "multipart/form-data; boundary=x"},
                       {"inference-header-content-length": str(rng.randint(0, 600))}])
    return f"/v2/models/{TINY_MODEL_NAME}/infer", hdrs, body


def _strange_path(rng: random.Random) -> Request:
    name = rng.choice(["%FF%FE", "%C0%AF", "..", "%2e%2e", "a" * 5000, "%00", "tiny%00",
                       "t%20iny", "tiny;x", "%F0%9F%98%80", "tiny/../tiny", "\u00e9"])
    version = rng.choice(["", "/versions/1", "/versions/%FF", "/versions/-1",
                          "/versions/99999999999999999999", "/versions/1.5", "/versions/"])
    header, tensor = binary_request(rng)
    _, hdrs, body = _encode(header, tensor)
    return f"/v2/models/{name}{version}/infer", hdrs, body


def _bad_deadline(rng: random.Random) -> Request:
    path, hdrs, body = _encode(*binary_request(rng))
    # not a deadline at all (a valid but short one is a real deadline: 504 is right)
    hdrs["x-request-timeout-ms"] = rng.choice(["-1", "abc", "1e400", "nan", "0", "",
                                               "99999999999999999999", "-0", "inf"])
    return path, hdrs, body


MUTATORS: list[Callable[[random.Random], Request]] = [
    _broken_length, _truncated_tensor, _extra_tensor_bytes, _wrong_binary_size,
    _wrong_datatype, _wrong_shape, _wrong_json_tensor, _random_body, _strange_path,
    _bad_deadline,
]


def test_binary_and_json_tensor_fuzz_answers_no_server_fault(gateway: GatewayProcess,
                                                             tally: Tally) -> None:
    rng = random.Random(11)
    with fuzzing(gateway, tally, "http-tensors") as surface, \
            httpx.Client(base_url=f"http://{gateway.http_url}", timeout=30,
                         trust_env=False) as client:
        for _ in range(cases(2000)):
            path, headers, body = rng.choice(MUTATORS)(rng)
            try:
                resp = client.post(path, content=body, headers=headers)
            except httpx.LocalProtocolError:
                continue  # httpx refuses to send it (a header value with spaces, say)
            except httpx.RemoteProtocolError as exc:  # the connection dropped: no answer
                tally.record(surface, "connection-reset", str(exc), (path, headers))
                continue
            tally.record(surface, resp.status_code, resp.text, (path, headers, body[:120]))
