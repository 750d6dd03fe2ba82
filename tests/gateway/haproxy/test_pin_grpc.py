"""A real HAProxy pins unversioned gRPC requests of a model under rollout itself, in its
Lua filter (``gateway/haproxy/grpc_fields.lua``), with no detour through the control plane:

- in front of a real Triton serving the tiny model's two versions (y = 2x + 1 and
  y = 3x + 1), each answer comes from the version the split picked, and is right for it;
  each pinned answer is tallied under its version from HAProxy's log line;
- in front of a member that records the bytes it receives, the message HAProxy forwards
  is byte for byte the control plane's pin (``gateway.policy.rollout.pin_grpc_version``),
  for a small message and for a large one that arrives in many HTTP/2 DATA frames;
- with tenants and a model with Triton priority levels, the class's level is appended
  before the pinned version, byte for byte as the control plane's Python plane appends
  them (``gateway/policy/triton_priority.py``);
- the control plane's gRPC port (a listener that counts connections) sees none of them;
- a compressed message is never appended to."""

from __future__ import annotations

import contextlib
import shutil
import socket
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import replace
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2

from converters.tiny import TINY_MODEL_NAME, TINY_WIDTH, build_tiny_model
from gateway.auth import key_digest
from gateway.haproxy.snapshot import (
    Layout,
    MemberState,
    PoolState,
    RouteState,
    Snapshot,
    TenancyState,
    TenantState,
    server_name,
)
from gateway.netaddr import free_port
from gateway.policy.rollout import pin_grpc_version
from gateway.policy.triton_priority import grpc_entry
from loadtests.rollout_models import affine_onnx
from tests.conftest import triton_settings
from tests.gateway.haproxy.test_native import Native
from tests.procs import started_triton, wait_until

pytestmark = pytest.mark.integration
INFER = "/inference.GRPCInferenceService/ModelInfer"
CAPTURED = "captured"  # the model routed to the recording member
PLAIN = "plain"  # another model routed there, never rolled out nor given levels
PAY = "pay-key-0123456789"  # a critical tenant's key


class Counting:
    """A TCP listener that counts the connections it accepts (and closes them)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = int(self.sock.getsockname()[1])
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError):
                conn, _ = self.sock.accept()
                self.accepted += 1
                conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


@contextlib.contextmanager
def recording_member() -> Iterator[tuple[int, list[bytes]]]:
    """A gRPC server answering ModelInfer with an empty response, recording each
    request's wire bytes (no deserializer: the bytes as HAProxy forwarded them)."""
    seen: list[bytes] = []

    def infer(request: bytes, context: grpc.ServicerContext) -> bytes:
        seen.append(request)
        return b""

    server = grpc.server(futures.ThreadPoolExecutor(2),
                         options=[("grpc.max_receive_message_length", 16 << 20)])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "inference.GRPCInferenceService",
        {"ModelInfer": grpc.unary_unary_rpc_method_handler(infer)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield port, seen
    finally:
        server.stop(0)


def two_versions(repo: Path) -> Path:
    """The tiny model with version 1 (y = 2x + 1) and version 2 (y = 3x + 1), both
    served (``version_policy: all``), as during a rollout."""
    build_tiny_model(repo)
    model = repo / TINY_MODEL_NAME
    shutil.copytree(model / "1", model / "2")  # its backend's files beside the model
    affine_onnx(model / "2" / "model.onnx", 3.0)
    config = model / "config.pbtxt"
    text = config.read_text()
    assert "latest {\n    num_versions: 1\n  }" in text
    config.write_text(text.replace("latest {\n    num_versions: 1\n  }", "all {\n  }"))
    return repo


@pytest.fixture(scope="module")
def pinning(tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[Native, Counting, list[bytes]]]:
    tmp = tmp_path_factory.mktemp("pin_grpc")
    repo = two_versions(tmp / "model_repo")
    control = Counting()
    with started_triton(triton_settings(repo, tmp, TINY_MODEL_NAME)) as triton, \
            recording_member() as (recorder_port, seen):
        e = triton.endpoints
        assert e is not None
        live = MemberState(server_name(e.grpc_url), e.host, e.http_port, e.grpc_port, True)
        # health checked on Triton's HTTP port; gRPC to the recorder
        recorder = MemberState("recorder", "127.0.0.1", e.http_port, recorder_port, True)
        snapshot = Snapshot(
            pools=(PoolState("main", (live,)), PoolState("rec", (recorder,))),
            routes=(RouteState(TINY_MODEL_NAME, (("main", 1.0),), 64),
                    RouteState(CAPTURED, (("rec", 1.0),), 64, split=(1, 7, 100)),
                    RouteState(PLAIN, (("rec", 1.0),), 64)),
        )
        layout = Layout(f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}",
                        f"127.0.0.1:{free_port()}", f"127.0.0.1:{control.port}",
                        tmp / "haproxy", f"127.0.0.1:{free_port()}")
        proxy = Native(layout, snapshot)
        proxy.start()
        try:
            yield proxy, control, seen
        finally:
            proxy.stop()
            control.close()


def _infer(native: Native, x: float = 1.0, version: str = "") -> tuple[str, float]:
    """(the version that answered, y[0]) of one request with x = ``x`` everywhere."""
    client = grpcclient.InferenceServerClient(native.layout.grpc_bind)
    try:
        data = np.full((1, TINY_WIDTH), x, np.float32)
        inp = grpcclient.InferInput("x", list(data.shape), "FP32")
        inp.set_data_from_numpy(data)
        result = client.infer(TINY_MODEL_NAME, [inp], model_version=version)
        return result.get_response().model_version, float(result.as_numpy("y")[0][0])
    finally:
        client.close()


def _split(native: Native, model: str, split: tuple[int, int, int]) -> None:
    base = native.snapshot
    routes = tuple(replace(r, split=split) if r.model == model else r for r in base.routes)
    assert native.move(replace(base, routes=routes)) == "runtime"


def _raw(native: Native, message: bytes, compressed: bool = False, key: str = "") -> None:
    with grpc.insecure_channel(
            native.layout.grpc_bind,
            options=[("grpc.max_send_message_length", 16 << 20)],
            compression=grpc.Compression.Gzip if compressed else None) as channel:
        call = channel.unary_unary(INFER, request_serializer=None,
                                   response_deserializer=None)
        call(message, timeout=10, metadata=[("x-api-key", key)] if key else None)


def _message(model: str, padding: int = 0) -> bytes:
    """A ModelInferRequest's wire bytes for ``model`` (no version), with ``padding``
    bytes of an unknown field at its end (a large message)."""
    request = service_pb2.ModelInferRequest(model_name=model, id="pin")
    wire = request.SerializeToString()
    if padding:
        # field 1000, wire type 2 (a varint tag of two bytes), a varint length
        length, varint = padding, b""
        while True:
            byte, length = length & 0x7F, length >> 7
            varint += bytes([byte | (0x80 if length else 0)])
            if not length:
                break
        wire += bytes([0xC2, 0x3E]) + varint + bytes(range(256)) * (padding // 256) \
            + bytes(padding % 256)
    return wire


def test_haproxy_pins_unversioned_grpc_to_split_version_with_right_answers(
    pinning: tuple[Native, Counting, list[bytes]]
) -> None:
    native, control, _ = pinning
    native.tally.watch(TINY_MODEL_NAME)
    try:
        _split(native, TINY_MODEL_NAME, (1, 2, 100))
        assert _infer(native) == ("2", 4.0)  # the candidate: 3x + 1
        _split(native, TINY_MODEL_NAME, (1, 2, 0))
        assert _infer(native) == ("1", 3.0)  # stable: 2x + 1
        _split(native, TINY_MODEL_NAME, (1, 2, 50))
        answers = [_infer(native, x=0.5) for _ in range(40)]
        expected = {"1": 2.0, "2": 2.5}
        assert all(y == expected[v] for v, y in answers), answers
        by_version = {v: sum(1 for w, _ in answers if w == v) for v in expected}
        assert min(by_version.values()) >= 5, by_version  # both, by the split's draw
        # a request naming its version keeps it
        assert _infer(native, version="1") == ("1", 3.0)
        # each pinned answer tallied under its version, from HAProxy's log line
        assert wait_until(lambda: native.tally.window(TINY_MODEL_NAME, 2, 0).requests
                          == by_version["2"] + 1
                          and native.tally.window(TINY_MODEL_NAME, 1, 0).requests
                          == by_version["1"] + 1, 5)
        assert control.accepted == 0  # no request went to the control plane
    finally:
        native.tally.forget(TINY_MODEL_NAME)
        native.move(replace(native.snapshot, routes=tuple(
            replace(r, split=None) if r.model == TINY_MODEL_NAME else r
            for r in native.snapshot.routes)))


@pytest.mark.parametrize("padding", [0, 300_000], ids=["small", "large"])
def test_haproxy_forwards_the_control_planes_pinned_bytes_when_message_streams(
    pinning: tuple[Native, Counting, list[bytes]], padding: int
) -> None:
    """The recorder gets ``pin_grpc_version(message, 7)``, byte for byte (the large
    message is 300 KB: about 19 DATA frames of 16 KB, more than HAProxy's buffer)."""
    native, control, seen = pinning
    message = _message(CAPTURED, padding)
    before = len(seen)
    _raw(native, message)
    assert len(seen) == before + 1
    assert seen[-1] == pin_grpc_version(message, 7)
    _split(native, CAPTURED, (1, 7, 0))
    try:
        _raw(native, message)
        assert seen[-1] == pin_grpc_version(message, 1)
    finally:
        _split(native, CAPTURED, (1, 7, 100))
    assert control.accepted == 0


@pytest.mark.parametrize("padding", [0, 300_000], ids=["small", "large"])
def test_haproxy_appends_the_classs_level_then_the_pin_as_the_python_plane_does(
    pinning: tuple[Native, Counting, list[bytes]], padding: int
) -> None:
    """Tenants, and the recorded model with three levels: a critical tenant's message
    reaches the member as ``pin_grpc_version(message + grpc_entry(1), 7)``, the default
    (standard) tenant's with level 2: what ``gateway/python/grpc_api.py`` sends."""
    native, control, seen = pinning
    base = native.snapshot
    leveled = replace(base, tenancy=TenancyState(
        tenants=(TenantState("default", "standard"), TenantState("pay", "critical")),
        keys=((key_digest(PAY), "pay"),)), levels=((CAPTURED, 3),))
    assert native.move(leveled) == "reload"  # the filters in every backend now
    try:
        message = _message(CAPTURED, padding)
        _raw(native, message, key=PAY)
        assert seen[-1] == pin_grpc_version(message + grpc_entry(1), 7)
        _raw(native, message)
        assert seen[-1] == pin_grpc_version(message + grpc_entry(2), 7)
        _split(native, CAPTURED, (1, 7, 0))  # stable: the same filter, another version
        _raw(native, message, key=PAY)
        assert seen[-1] == pin_grpc_version(message + grpc_entry(1), 1)
        # a model without levels, through the same backend and filter: as sent
        plain = _message(PLAIN, padding)
        _raw(native, plain, key=PAY)
        assert seen[-1] == plain
    finally:
        native.move(base)
    assert control.accepted == 0


def test_haproxy_never_appends_to_compressed_grpc_when_rolled_out(
    pinning: tuple[Native, Counting, list[bytes]]
) -> None:
    """A compressed message is not HAProxy's to pin, nor to read (its model name is in
    the compressed bytes): it goes to the Python forwarder, which decompresses it (here a
    listener that counts the connection and closes it: UNAVAILABLE), and the member never
    sees it with bytes appended."""
    native, control, seen = pinning
    before, asked = len(seen), control.accepted
    with pytest.raises(grpc.RpcError) as refused:
        _raw(native, _message(CAPTURED, 4096), compressed=True)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert control.accepted > asked
    assert len(seen) == before
