"""One table of requests, both data planes: each row is a request and the answer expected
(HTTP status or gRPC code, message, headers such as ``Retry-After``), sent to a gateway
with HAProxy carrying inference and to one with the Python data plane, over one real
Triton. Every row must get the expected answer from both; a plane that answers
differently fails the row with both answers side by side.

The gateways are configured so that every check of the request policy
(``gateway/policy``, in its order) can refuse: inference gated by tokens, a rate limit
on three keys and one on a tenant's two keys (tenancy on), a model that never finishes
preloading (not ready), no wildcard pool (unknown models are unknown), a small body
limit. Rows also pin the order of the
checks where two would refuse the same request. Differences that remain are rows of
:data:`KEPT`, each with its reason (and docs/request-policy.md, "Both planes answer alike").
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import yaml
from tritonclient.grpc import service_pb2

from converters.tiny import TINY_MODEL_NAME, TINY_WIDTH
from gateway.policy import access, deadline, model_name, shape
from gateway.policy.rate import RateClass
from gateway.policy.tenancy import RATE_WHO
from infergate.triton.local import LocalTriton
from tests.conftest import DATA_PLANES
from tests.fuzz.test_grpc import MUTATORS
from tests.grpc_wire import grpc_call
from tests.procs import GatewayProcess, pools_yaml, run_gateway, wait_until

pytestmark = pytest.mark.integration

TINY = TINY_MODEL_NAME
GHOST = "ghost"  # preloaded, never loads: not ready for the gateway's whole life
PREDICT = "predict-token-0123456789"
UPLOAD_ONLY = "upload-only-token-0123456789"
# keys with a rate limit of their own (burst 2), one per row that reaches it
LIMITED = {"http": "limited-http-key-01234567", "grpc": "limited-grpc-key-01234567",
           "route": "limited-route-key-0123456"}
# a sheddable tenant with a rate of its own over two keys (gateway/policy/tenancy.py): the
# gateways have tenancy on, so every row passes through its rules
METERED = {"http": "metered-http-key-0123456", "grpc": "metered-grpc-key-0123456"}
MAX_BODY = 64 * 1024
RATE = RateClass(rate_per_s=0.01, burst=2)  # 2 per 200 s: Retry-After 100
INFER = "/inference.GRPCInferenceService/ModelInfer"


# -- requests ----------------------------------------------------------------------------
def http_body(rows: int = 1, datatype: str = "FP32") -> bytes:
    return json.dumps({"inputs": [{"name": "x", "shape": [rows, TINY_WIDTH],
                                   "datatype": datatype, "data": [1.0] * rows * TINY_WIDTH}]
                       }).encode()


def grpc_body(model: str = TINY, datatype: str = "FP32", version: str = "") -> bytes:
    request = service_pb2.ModelInferRequest(model_name=model, model_version=version)
    request.inputs.add(name="x", datatype=datatype, shape=[1, TINY_WIDTH])
    request.raw_input_contents.append(np.ones(TINY_WIDTH, np.float32).tobytes())
    return request.SerializeToString()


@dataclass(frozen=True)
class Answer:
    status: int | str  # HTTP status, or the gRPC code's name
    message: str = ""  # a regular expression the error message must match
    headers: tuple[tuple[str, str], ...] = ()  # (lower-case name, value)

    def mismatch(self, got: Answer) -> str | None:
        if got.status != self.status:
            return f"status {got.status}, expected {self.status}"
        if self.message and not re.search(self.message, got.message):
            return f"message {got.message!r} does not match {self.message!r}"
        missing = [h for h in self.headers if h not in got.headers]
        return f"headers {missing} missing from {got.headers}" if missing else None


@dataclass(frozen=True)
class Row:
    name: str
    protocol: str  # "http" or "grpc"
    expect: Answer
    model: str = TINY
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)  # HTTP headers / gRPC metadata
    path: str = ""  # HTTP: default /v2/models/<model>/infer
    repeat: int = 1  # sent this many times; the last answer is the row's (the earlier
    # ones must be alike on both planes)
    method: str = "POST"


def _token(token: str) -> dict[str, str]:
    return {"x-api-key": token}


AUTH = _token(PREDICT)
OK_HTTP = Answer(200)
OK_GRPC = Answer("OK")
RETRY_NOT_READY = (("retry-after", "2"),)

# sub-messages of a ModelInferRequest: parameters (map entries), inputs, outputs
_SUBMESSAGES = {4, 5, 6}
_RAW_INPUT_CONTENTS = 7


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while data[pos] & 0x80:
        value |= (data[pos] & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
    return value | data[pos] << shift, pos + 1


def field_boundaries(message: bytes, start: int = 0, end: int | None = None,
                     nested: bool = True) -> set[int]:
    """Every offset where a field of ``message`` (or of its sub-messages) starts or ends."""
    end = len(message) if end is None else end
    cuts, pos = {start}, start
    while pos < end:
        key, pos = _varint(message, pos)
        if key & 7 == 2:
            length, pos = _varint(message, pos)
            if nested and key >> 3 in _SUBMESSAGES:
                cuts |= field_boundaries(message, pos, pos + length, nested=False)
            pos += length
        else:
            assert key & 7 == 0, "grpc_body() holds varint and length-delimited fields only"
            _, pos = _varint(message, pos)
        cuts.add(pos)
    return cuts


def raw_tensor_cuts(message: bytes) -> set[int]:
    """Offsets inside the (first) raw tensor: after its key, after its length, one byte
    in, half-way, 74 bytes (the cut the issue found) and one byte short of its end."""
    pos = 0
    while True:
        key, after_key = _varint(message, pos)
        length, data = _varint(message, after_key)
        if key == _RAW_INPUT_CONTENTS << 3 | 2:
            assert data < 74 < data + length, "the issue's cut lies in the tensor"
            return {after_key, data, data + 1, data + length // 2, 74, data + length - 1}
        pos = data + length


def cut_short_rows() -> list[Row]:
    """A valid message cut short at every field boundary (its own and its inputs') and
    inside its raw tensor: INVALID_ARGUMENT from both planes. Cut inside a field, it does
    not parse: Triton's "Unable to parse request" (the Python plane must not complete
    it with fields of its own, such as the deadline's ``timeout`` parameter: cut at byte
    74 it did, and the request ran). Cut between two fields, it parses and
    Triton finds the request short of its model name, input or tensor."""
    body = grpc_body()
    between = field_boundaries(body, nested=False)
    cuts = sorted((field_boundaries(body) | raw_tensor_cuts(body)) - {len(body)})

    def expect(n: int) -> Answer:
        if n == 0:
            return Answer("INVALID_ARGUMENT", re.escape(model_name.NO_MODEL))
        return Answer("INVALID_ARGUMENT", "" if n in between else "^Unable to parse")

    return [Row(f"message cut short at byte {n} of {len(body)}", "grpc", expect(n),
                body=body[:n], headers=AUTH) for n in cuts]


ROWS = [
    # valid requests
    Row("valid json body", "http", OK_HTTP, body=http_body(), headers=AUTH),
    Row("valid batch of 4", "http", OK_HTTP, body=http_body(4), headers=AUTH),
    Row("valid message", "grpc", OK_GRPC, body=grpc_body(), headers=AUTH),
    Row("valid deadline", "http", OK_HTTP, body=http_body(),
        headers={**AUTH, "x-request-timeout-ms": "30000"}),
    Row("valid grpc deadline", "grpc", OK_GRPC, body=grpc_body(),
        headers={**AUTH, "grpc-timeout": "30S"}),
    Row("bearer token", "http", OK_HTTP, body=http_body(),
        headers={"authorization": f"Bearer {PREDICT}"}),
    # malformed bodies: Triton's parse errors are the client's 400 / INVALID_ARGUMENT
    Row("body not json", "http", Answer(400), body=b"{not json", headers=AUTH),
    Row("wrong datatype", "http", Answer(400), body=http_body(datatype="FP64"), headers=AUTH),
    Row("wrong datatype", "grpc", Answer("INVALID_ARGUMENT"), body=grpc_body(datatype="INT8"),
        headers=AUTH),
    Row("shape beyond any request", "http", Answer(400, re.escape(shape.HUGE_SHAPE)),
        body=json.dumps({"inputs": [{"name": "x", "datatype": "INT16", "data": [True],
                                     "shape": [933246, 1883129, 17592186044415, 9090]}]
                         }).encode(), headers=AUTH),
    Row("shape beyond any request, binary header", "http",
        Answer(400, re.escape(shape.HUGE_SHAPE)),
        body=b'{"inputs":[{"name":"x","datatype":"FP32","shape":[4294967296,4294967296,16],'
             b'"parameters":{"binary_data_size":64}}]}' + b"\0" * 64,
        headers={**AUTH, "inference-header-content-length": "115"}),
    Row("no model named", "grpc", Answer("INVALID_ARGUMENT", re.escape(model_name.NO_MODEL)),
        body=grpc_body(model=""), headers=AUTH),
    Row("model name cut short", "grpc",
        Answer("INVALID_ARGUMENT", re.escape(model_name.NO_MODEL)), body=b"\x0a\x04ti",
        headers=AUTH),
    Row("model name not UTF-8", "grpc",
        Answer("INVALID_ARGUMENT", re.escape(model_name.NOT_UTF8)),
        body=b"\x0a\x05tiny\x80" + grpc_body()[6:], headers=AUTH),
    Row("model name cut short, no token", "grpc",
        Answer("INVALID_ARGUMENT", re.escape(model_name.NO_MODEL)), body=b"\x0a\x04ti"),
    *cut_short_rows(),
    # unknown model and version
    Row("unknown model", "http", Answer(404, "unknown model: 'nope'"), model="nope",
        body=http_body(), headers=AUTH),
    Row("unknown model", "grpc", Answer("NOT_FOUND", "unknown model: 'nope'"),
        body=grpc_body(model="nope"), headers=AUTH),
    # a name the message quotes as the client wrote it: gRPC's percent-encoding of
    # grpc-message (a '%' and what is not printable ASCII) read back by the client
    Row("unknown model, a name with '%' and non-ASCII", "http",
        Answer(404, re.escape("unknown model: '50%41-\u00fcber' is not found")),
        body=http_body(), headers=AUTH, path="/v2/models/50%2541-%C3%BCber/infer"),
    Row("unknown model, a name with '%' and non-ASCII", "grpc",
        Answer("NOT_FOUND", re.escape("unknown model: '50%41-\u00fcber' is not found")),
        body=grpc_body(model="50%41-\u00fcber"), headers=AUTH),
    Row("unknown version", "http", Answer(404, "'tiny' version 9 is not found"),
        body=http_body(), headers=AUTH,
        path=f"/v2/models/{TINY}/versions/9/infer"),
    Row("unknown version", "grpc", Answer("NOT_FOUND", "'tiny' version 9 is not found"),
        body=grpc_body(version="9"), headers=AUTH),
    # malformed deadlines
    *(Row(f"deadline {value!r}", "http", Answer(400, "X-Request-Timeout-Ms must be a whole"),
          body=http_body(), headers={**AUTH, deadline.HTTP_TIMEOUT_HEADER: value})
      for value in ("abc", "0", "-5", "1.5", "1e3", "", "1000000000")),
    # oversize bodies
    Row("body over the limit", "http", Answer(413, "larger than"),
        body=b"{" + b" " * MAX_BODY + b"}", headers=AUTH),
    Row("message over the limit", "grpc", Answer("RESOURCE_EXHAUSTED"),
        body=grpc_body() + b"\x12\x00" * (MAX_BODY // 2), headers=AUTH),
    # readiness
    Row("model preloading", "http",
        Answer(503, re.escape(f"model '{GHOST}' is not ready yet: preloading"),
               RETRY_NOT_READY), model=GHOST, body=http_body(), headers=AUTH),
    Row("model preloading", "grpc",
        Answer("UNAVAILABLE", re.escape(f"model '{GHOST}' is not ready yet: preloading")),
        body=grpc_body(model=GHOST), headers=AUTH),
    Row("gateway readiness", "http", Answer(503), method="GET", path="/v2/health/ready"),
    Row("gateway liveness", "http", Answer(200), method="GET", path="/v2/health/live"),
    # auth on every surface
    Row("no token", "http",
        Answer(401, re.escape(access.MISSING_TOKEN),
               (("www-authenticate", access.WWW_AUTHENTICATE),)), body=http_body()),
    Row("no token", "grpc", Answer("UNAUTHENTICATED", re.escape(access.MISSING_TOKEN)),
        body=grpc_body()),
    Row("empty token", "http", Answer(401, re.escape(access.MISSING_TOKEN)), body=http_body(),
        headers={"x-api-key": ""}),
    Row("unknown token", "http", Answer(401, access.UNKNOWN_TOKEN), body=http_body(),
        headers=_token("not-a-known-token-at-all")),
    Row("unknown token", "grpc", Answer("UNAUTHENTICATED", access.UNKNOWN_TOKEN),
        body=grpc_body(), headers=_token("not-a-known-token-at-all")),
    Row("token without predict", "http",
        Answer(403, re.escape(access.LACKS_SCOPE.format(name="owner", scope="predict"))),
        body=http_body(), headers=_token(UPLOAD_ONLY)),
    Row("token without predict", "grpc", Answer("PERMISSION_DENIED", "lacks the 'predict'"),
        body=grpc_body(), headers=_token(UPLOAD_ONLY)),
    Row("model metadata without token", "http", Answer(401), method="GET",
        path=f"/v2/models/{TINY}"),
    Row("model metadata", "http", OK_HTTP, method="GET", path=f"/v2/models/{TINY}",
        headers=AUTH),
    Row("upload api without token", "http", Answer(401), method="GET", path="/v1/models"),
    Row("admin api with predict token", "http", Answer(403), method="POST",
        path=f"/v2/repository/models/{TINY}/load", headers=AUTH),
    # the order of the checks where two would refuse
    Row("preloading model, no token: auth first", "http", Answer(401), model=GHOST,
        body=http_body()),
    Row("unknown model, no token: auth first", "grpc", Answer("UNAUTHENTICATED"),
        body=grpc_body(model="nope")),
    Row("bad deadline, no token: the request first", "http", Answer(400), body=http_body(),
        headers={deadline.HTTP_TIMEOUT_HEADER: "soon"}),
    # rate limits at the boundary: the configured burst (2) passes, the next is refused
    Row("rate limit: the burst passes", "http", OK_HTTP, body=http_body(),
        headers=_token(LIMITED["http"]), repeat=2),
    Row("rate limit: one over", "http",
        Answer(429, re.escape(RATE.message()), (("retry-after", str(RATE.retry_after_s)),)),
        body=http_body(), headers=_token(LIMITED["http"])),
    Row("rate limit: one over", "grpc", Answer("RESOURCE_EXHAUSTED", re.escape(RATE.message())),
        body=grpc_body(), headers=_token(LIMITED["grpc"]), repeat=3),
    Row("rate limit counts before the route", "grpc", Answer("RESOURCE_EXHAUSTED"),
        body=grpc_body(model="nope"), headers=_token(LIMITED["route"]), repeat=3),
    # a tenant's rate counts all its keys together
    Row("tenant rate: the burst passes", "http", OK_HTTP, body=http_body(),
        headers=_token(METERED["http"]), repeat=2),
    Row("tenant rate: one over, by its other key", "grpc",
        Answer("RESOURCE_EXHAUSTED", re.escape(RATE.message(RATE_WHO.format(tenant="metered")))),
        body=grpc_body(), headers=_token(METERED["grpc"])),
]

# Differences between the planes that remain, each with its reason: none today.
KEPT: dict[str, str] = {}


# -- the two gateways ----------------------------------------------------------------------
def gateway_config(path: Path, triton: LocalTriton, tokens: Path) -> Path:
    assert triton.endpoints is not None
    pools_yaml(path, {"local": [triton.endpoints]})
    data = yaml.safe_load(path.read_text())
    data["pools"][0]["models"] = [TINY, GHOST]
    data["models"] = {GHOST: {"preload": True}}
    data["rate_limits"] = {"keys": {key: {"rate_per_s": RATE.rate_per_s, "burst": RATE.burst}
                                    for key in LIMITED.values()}}
    data["auth"] = {"tokens_file": str(tokens), "predict": "token"}
    data["tenancy"] = {"tenants": [{
        "name": "metered", "priority": "sheddable", "keys": list(METERED.values()),
        "rate": {"rate_per_s": RATE.rate_per_s, "burst": RATE.burst}}]}
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def planes(triton: LocalTriton, tmp_path_factory: pytest.TempPathFactory,
           ) -> Iterator[dict[str, GatewayProcess]]:
    tmp = tmp_path_factory.mktemp("parity")
    tokens = tmp / "tokens.yaml"
    tokens.write_text(yaml.safe_dump({"tokens": [
        {"name": "app", "scopes": ["predict"], "token": PREDICT},
        {"name": "owner", "scopes": ["upload"], "token": UPLOAD_ONLY},
        *({"name": f"limited-{p}", "scopes": ["predict"], "token": k}
          for p, k in LIMITED.items()),
        *({"name": f"metered-{p}", "scopes": ["predict"], "token": k}
          for p, k in METERED.items()),
    ]}))
    config = gateway_config(tmp / "gateway.yaml", triton, tokens)
    body_limit = ("--max-request-bytes", str(MAX_BODY))
    with run_gateway(config, tmp, *body_limit, data_plane="haproxy", until="live") as haproxy, \
            run_gateway(config, tmp, *body_limit, data_plane="python", until="live") as python:
        gateways = {"haproxy": haproxy, "python": python}
        for gw in gateways.values():  # preloading has marked the ghost model not ready
            assert wait_until(lambda gw=gw: send(gw, ROWS[0]).status == 200  # type: ignore[misc]
                              and send(gw, _ghost_row()).status == 503, 60)
        yield gateways


def _ghost_row() -> Row:
    return next(r for r in ROWS if r.model == GHOST and r.protocol == "http")


def send(gateway: GatewayProcess, row: Row) -> Answer:
    return _send_http(gateway, row) if row.protocol == "http" else _send_grpc(gateway, row)


def _send_http(gateway: GatewayProcess, row: Row) -> Answer:
    path = row.path or f"/v2/models/{row.model}/infer"
    resp = httpx.request(row.method, f"http://{gateway.http_url}{path}", content=row.body,
                         headers={"content-type": "application/json", **row.headers},
                         timeout=60)
    message = ""
    if resp.status_code >= 400:
        try:
            message = str(resp.json().get("error", ""))
        except ValueError:
            message = resp.text
    headers = tuple((k, v) for k, v in resp.headers.items()
                    if k in ("retry-after", "www-authenticate"))
    return Answer(resp.status_code, message, headers)


def _send_grpc(gateway: GatewayProcess, row: Row) -> Answer:
    with grpc.insecure_channel(gateway.grpc_url) as channel:
        call = channel.unary_unary(INFER, request_serializer=None, response_deserializer=None)
        timeout = None
        metadata = [(k, v) for k, v in row.headers.items() if k != "grpc-timeout"]
        if "grpc-timeout" in row.headers:
            timeout = float(row.headers["grpc-timeout"].rstrip("S"))
        try:
            call(row.body, metadata=metadata, timeout=timeout or 60)
            return Answer("OK")
        except grpc.RpcError as error:
            trailing = tuple((k, v) for k, v in (error.trailing_metadata() or ())  # type: ignore[attr-defined]
                             if k == "retry-after")
            return Answer(error.code().name, error.details() or "",  # type: ignore[attr-defined]
                          trailing)


# -- the suite -----------------------------------------------------------------------------
def _answers(planes: dict[str, GatewayProcess], row: Row) -> dict[str, Answer]:
    """Each plane's last answer to the row; the earlier ones (``repeat``) alike."""
    sent = {plane: [send(planes[plane], row) for _ in range(row.repeat)]
            for plane in DATA_PLANES}
    earlier = {plane: [a.status for a in answers[:-1]] for plane, answers in sent.items()}
    assert len({tuple(s) for s in earlier.values()}) == 1, earlier
    return {plane: answers[-1] for plane, answers in sent.items()}


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r.protocol}: {r.name}")
def test_both_planes_answer_as_the_table_says(planes: dict[str, GatewayProcess],
                                              row: Row) -> None:
    answers = _answers(planes, row)
    wrong = {p: why for p, a in answers.items() if (why := row.expect.mismatch(a))}
    if row.name in KEPT:
        pytest.xfail(KEPT[row.name])
    assert not wrong, f"{wrong}\nanswers: {answers}"


def test_both_planes_answer_mutated_messages_alike(planes: dict[str, GatewayProcess]) -> None:
    """The gRPC fuzz suite's mutations of a good request (bytes flipped, inserted, cut;
    names not UTF-8; wrong tensors; strange fields), each sent to both planes: the same
    gRPC code from each, whatever it is."""
    rng = random.Random(19)
    differ: list[str] = []
    for i in range(300):
        body = rng.choice(MUTATORS)(rng)
        row = Row(f"mutation {i}", "grpc", OK_GRPC, body=body, headers=AUTH)
        answers = _answers(planes, row)
        if len({a.status for a in answers.values()}) > 1:
            differ.append(f"{body[:40]!r}: {answers}")
    assert not differ, "\n".join(differ[:10])


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_both_planes_serve_compressed_requests_as_triton_does(
        planes: dict[str, GatewayProcess], algorithm: str) -> None:
    """Triton's clients compress on request (``compression_algorithm`` over gRPC,
    ``request_compression_algorithm`` over HTTP), and Triton serves it: so do both
    planes. HAProxy cannot read a compressed gRPC message's model name: it hands the
    message to the Python forwarder (grpcio decompresses it), where before the call was
    reset (CANCELLED)."""
    x = np.arange(TINY_WIDTH, dtype=np.float32)[None, :]
    for plane in DATA_PLANES:
        gw = planes[plane]
        g = grpcclient.InferenceServerClient(gw.grpc_url)
        inp = grpcclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        got = g.infer(TINY, [inp], headers=dict(AUTH), compression_algorithm=algorithm)
        np.testing.assert_allclose(got.as_numpy("y"), 2 * x + 1, err_msg=plane)
        h = httpclient.InferenceServerClient(gw.http_url)
        inp = httpclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        # (a copy: tritonclient.http adds its own headers to the dict it is given)
        got = h.infer(TINY, [inp], headers=dict(AUTH),
                      request_compression_algorithm=algorithm)
        np.testing.assert_allclose(got.as_numpy("y"), 2 * x + 1, err_msg=plane)


def test_both_planes_answer_every_grpc_row_as_grpc(planes: dict[str, GatewayProcess]) -> None:
    """Each gRPC row once more, as the wire carries it (:mod:`tests.grpc_wire`): every
    answer of both planes, the data plane's own refusals included, has the gRPC
    content-type and a ``grpc-status``, which grpc-python's leniency does not check (Go's
    gRPC refuses an answer without that content-type). Last in this module: the rows'
    limits have answered the table already."""
    wrong = []
    for row in (r for r in ROWS if r.protocol == "grpc"):
        for plane in DATA_PLANES:
            got = grpc_call(planes[plane].grpc_url, row.body, row.headers)
            if got.get("content-type") != "application/grpc" or "grpc-status" not in got:
                wrong.append(f"{plane}, {row.name}: {got}")
    assert not wrong, "\n".join(wrong)

