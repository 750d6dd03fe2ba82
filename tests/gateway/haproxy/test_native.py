"""A real HAProxy driven by snapshots alone (no control plane) in front of a real Triton:
every answer HAProxy produces itself, on both protocols, comes from the error table;
live changes go through the runtime API without a reload; a reload drops nothing and
leaves no new connection hanging."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from converters.tiny import TINY_MODEL_NAME, TINY_WIDTH
from gateway.haproxy.changes import runtime_commands
from gateway.haproxy.config import CLOSE_SPREAD_S, GOAWAY_IDLE_S
from gateway.haproxy.process import HAProxyProcess, write_files
from gateway.haproxy.render import render
from gateway.haproxy.runtime import RuntimeAPI, send
from gateway.haproxy.snapshot import (
    Layout,
    MemberState,
    PoolState,
    RouteState,
    Snapshot,
    server_name,
)
from gateway.haproxy.telemetry import LogReceiver, RequestLog
from gateway.metrics import create_metrics
from gateway.netaddr import free_port
from gateway.policy.access import key_digest
from gateway.policy.rate import RateClass
from gateway.telemetry import VersionTally
from tests.conftest import triton_settings
from tests.grpc_wire import grpc_call
from tests.procs import started_triton, wait_until

pytestmark = pytest.mark.integration
MAX_BODY = 64 * 1024
TOKEN = "predict-token-0123456789"
UPLOAD_ONLY = "upload-token-0123456789"


class Native:
    """HAProxy rendered from a snapshot; ``move`` applies the next one as the control
    plane does (runtime commands, else a reload)."""

    def __init__(self, layout: Layout, snapshot: Snapshot) -> None:
        self.layout, self.snapshot = layout, snapshot
        self.process = HAProxyProcess(layout)
        self.metrics = create_metrics()
        self.tally = VersionTally()
        self.receiver = LogReceiver(layout.log_address, RequestLog(self.metrics,
                                                                  tally=self.tally))

    def start(self) -> None:
        self.receiver.start()
        write_files(render(self.snapshot, self.layout), self.layout)
        self.process.start()

    def move(self, snapshot: Snapshot) -> str:
        commands = runtime_commands(self.snapshot, snapshot, self.layout)
        write_files(render(snapshot, self.layout), self.layout)
        if commands is None:
            self.process.reload()
        else:
            RuntimeAPI(self.layout.admin_socket).run(commands)
        self.snapshot = snapshot
        return "reload" if commands is None else "runtime"

    def worker_pid(self) -> str:
        info = RuntimeAPI(self.layout.admin_socket).query("show info")
        return next(line for line in info.splitlines() if line.startswith("Pid:"))

    def stop(self) -> None:
        self.process.stop(2)
        self.receiver.stop()


@contextlib.contextmanager
def hung_member() -> Iterator[int]:
    """A port that accepts connections and never answers (a SIGSTOPped server)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(server.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield int(server.getsockname()[1])
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()


@pytest.fixture(scope="module")
def native(tiny_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Native]:
    tmp = tmp_path_factory.mktemp("native")
    with started_triton(triton_settings(tiny_repo, tmp, TINY_MODEL_NAME)) as triton, \
            hung_member() as hung_port:
        e = triton.endpoints
        assert e is not None
        live = MemberState(server_name(e.grpc_url), e.host, e.http_port, e.grpc_port, True)
        hung = MemberState("hung", "127.0.0.1", hung_port, hung_port, True)
        snapshot = Snapshot(
            pools=(PoolState("main", (live,)), PoolState("stuck", (hung,))),
            routes=(RouteState(TINY_MODEL_NAME, (("main", 1.0),), 64),),
        )
        layout = Layout(f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}",
                        f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}",
                        tmp / "haproxy", f"127.0.0.1:{free_port()}", max_body_bytes=MAX_BODY)
        proxy = Native(layout, snapshot)
        proxy.start()
        try:
            yield proxy
        finally:
            proxy.stop()


def _infer(native: Native, protocol: str, model: str = TINY_MODEL_NAME,
           headers: dict[str, str] | None = None, width: int = TINY_WIDTH,
           timeout_s: float | None = None,
           deadline_s: float | None = None) -> tuple[str, str]:
    """(status, message): "200"/"OK" on success, else the HTTP status or gRPC code.
    ``timeout_s``: the deadline sent with the request (HTTP: ``X-Request-Timeout-Ms``;
    gRPC: the call's deadline); ``deadline_s``: the client's own bound (HTTP: its
    connect and network timeouts, raising ``TimeoutError``; gRPC: the call's deadline,
    DEADLINE_EXCEEDED)."""
    x = np.ones((1, width), np.float32)
    if protocol == "http":
        client: object = httpclient.InferenceServerClient(
            native.layout.http_bind, network_timeout=deadline_s or 10,
            connection_timeout=deadline_s or 10)
        module: object = httpclient
    else:
        client = grpcclient.InferenceServerClient(native.layout.grpc_bind)
        module = grpcclient
        if timeout_s is None:
            timeout_s = deadline_s
    inp = module.InferInput("x", list(x.shape), "FP32")  # type: ignore[attr-defined]
    inp.set_data_from_numpy(x)
    # a copy: tritonclient.http adds its own (int-valued) headers to the dict it is given
    kwargs: dict[str, object] = {"headers": dict(headers or {})}
    if timeout_s is not None:
        if protocol == "http":
            kwargs["headers"] = {**(headers or {}),
                                 "X-Request-Timeout-Ms": str(int(timeout_s * 1e3))}
        else:
            kwargs["client_timeout"] = timeout_s
    try:
        client.infer(model, [inp], **kwargs)  # type: ignore[attr-defined]
        return "OK", ""
    except InferenceServerException as exc:
        return str(exc.status()).removeprefix("StatusCode."), exc.message() or ""
    finally:
        client.close()  # type: ignore[attr-defined]


HTTP_TO_GRPC = {"400": "INVALID_ARGUMENT", "401": "UNAUTHENTICATED",
                "403": "PERMISSION_DENIED", "404": "NOT_FOUND", "413": "RESOURCE_EXHAUSTED",
                "429": "RESOURCE_EXHAUSTED", "503": "UNAVAILABLE", "504": "DEADLINE_EXCEEDED"}


def _both(native: Native, expected_http: str, needle: str, **kwargs: object) -> None:
    for protocol in ("http", "grpc"):
        status, message = _infer(native, protocol, **kwargs)  # type: ignore[arg-type]
        wanted = expected_http if protocol == "http" else HTTP_TO_GRPC[expected_http]
        assert (status, needle in message) == (wanted, True), (protocol, status, message)


def test_haproxy_answers_unknown_model_not_found_when_no_pool_serves_it(native: Native) -> None:
    _both(native, "404", "Request for unknown model: 'nope' is not found", model="nope")


def test_haproxy_answers_unavailable_with_reason_when_model_not_ready(native: Native) -> None:
    base = native.snapshot
    route = replace(base.routes[0], not_ready="loading version 2")
    assert native.move(replace(base, routes=(route,))) == "runtime"
    try:
        _both(native, "503", "is not ready yet: loading version 2")
        url = f"http://{native.layout.http_bind}/v2/models/{TINY_MODEL_NAME}/infer"
        assert httpx.post(url, content=b"{}").headers["retry-after"] == "2"
    finally:
        native.move(base)
    assert _infer(native, "http") == ("OK", "")


def test_haproxy_checks_predict_tokens_by_digest_when_gated(native: Native) -> None:
    base = native.snapshot
    gated = replace(base, predict_gated=True, tokens=(
        (key_digest(TOKEN), "predict;app"), (key_digest(UPLOAD_ONLY), "upload;owner")))
    assert native.move(gated) == "reload"  # auth on/off is structural
    try:
        _both(native, "401", "missing API token")
        _both(native, "401", "unknown API token", headers={"x-api-key": "wrong-token-xyz"})
        _both(native, "403", "token 'owner' lacks the 'predict' scope",
              headers={"authorization": f"Bearer {UPLOAD_ONLY}"})
        for protocol in ("http", "grpc"):
            assert _infer(native, protocol, headers={"authorization": f"Bearer {TOKEN}"}) == \
                ("OK", "")
        # a refused token's answer is a gRPC one (UNAUTHENTICATED), content-type and all
        assert _grpc_answer(native, b"\x0a\x04tiny")[:2] == ("application/grpc", "16")
    finally:
        native.move(base)


def _grpc_answer(native: Native, message: bytes) -> tuple[str, str, str]:
    """(content-type, grpc-status, grpc-message) of HAProxy's answer to a ModelInfer call
    of ``message``, as sent (:mod:`tests.grpc_wire`)."""
    received = grpc_call(native.layout.grpc_bind, message)
    return (received.get("content-type", ""), received.get("grpc-status", ""),
            received.get("grpc-message", ""))


@pytest.mark.parametrize(("message", "status", "needle"), [
    (b"", "3", "the request names no model"),  # answered before any name is read
    (b"\x0a\x02\xff\xfe", "3", "not valid UTF-8"),
    (b"\x0a\x04nope", "5", "Request for unknown model: 'nope' is not found"),
])
def test_haproxy_grpc_answers_carry_grpc_content_type_when_haproxy_answers_itself(
    native: Native, message: bytes, status: str, needle: str
) -> None:
    content_type, grpc_status, grpc_message = _grpc_answer(native, message)
    assert (content_type, grpc_status) == ("application/grpc", status), grpc_message
    assert needle in grpc_message


def test_haproxy_sheds_at_once_when_model_limit_reached(native: Native) -> None:
    base = native.snapshot
    closed = replace(base.routes[0], max_in_system=0)
    assert native.move(replace(base, routes=(closed,))) == "runtime"
    try:
        _both(native, "429", "overloaded: model 'tiny'")
    finally:
        native.move(base)


def test_haproxy_rate_limits_per_key_digest_when_window_full(native: Native) -> None:
    base = native.snapshot
    native.move(replace(base, rate_keys=((key_digest("limited-key"), RateClass(0.1, 2)),)))
    try:
        headers = {"x-api-key": "limited-key"}
        results = [_infer(native, "http", headers=headers)[0] for _ in range(3)]
        assert results == ["OK", "OK", "429"]
        assert _infer(native, "grpc", headers=headers)[0] == "RESOURCE_EXHAUSTED"
        assert _infer(native, "http", headers={"x-api-key": "other"}) == ("OK", "")
    finally:
        native.move(base)


def test_haproxy_answers_unavailable_when_no_member_routable(native: Native) -> None:
    base = native.snapshot
    main = base.pools[0]
    held = replace(main, members=(replace(main.members[0], routable=False),))
    assert native.move(replace(base, pools=(held, base.pools[1]))) == "runtime"
    try:
        _both(native, "503", "no healthy Triton member")
    finally:
        native.move(base)
    assert _infer(native, "grpc") == ("OK", "")


def test_haproxy_answers_deadline_exceeded_in_time_when_member_hangs(native: Native) -> None:
    base = native.snapshot
    stuck = RouteState(TINY_MODEL_NAME, (("stuck", 1.0),), 64)
    native.move(replace(base, routes=(stuck,)))
    try:
        for protocol in ("http", "grpc"):
            started = time.monotonic()
            status, _ = _infer(native, protocol, timeout_s=0.3)
            elapsed = time.monotonic() - started
            assert status == ("504" if protocol == "http" else "DEADLINE_EXCEEDED")
            assert elapsed < 3.0, elapsed  # bounded by the deadline, not the 300 s default
    finally:
        native.move(base)


def test_haproxy_refuses_oversized_http_body_when_above_limit(native: Native) -> None:
    # (gRPC: sent to the control plane's server to refuse; see tests/gateway/test_limits.py)
    status, message = _infer(native, "http", width=MAX_BODY // 4)
    assert (status, "request body larger than" in message) == ("413", True), message


def test_haproxy_routes_new_model_live_when_map_entry_added(native: Native) -> None:
    base = native.snapshot
    alias = RouteState("tiny_alias", (("main", 1.0),), 8)
    pid = native.worker_pid()
    assert native.move(replace(base, routes=(*base.routes, alias))) == "runtime"
    try:
        # Triton does not know the alias: it answers, and the line says where it went
        status, message = _infer(native, "http", model="tiny_alias")
        assert status == "404" and "unknown model" in message.lower(), (status, message)
        assert native.worker_pid() == pid

        def routed() -> float:
            return sum(s.value for m in native.metrics.registry.collect()
                       if m.name == "infergate_requests" for s in m.samples
                       if s.labels.get("model") == "tiny_alias"
                       and s.labels.get("pool") == "main" and s.name.endswith("_total"))

        assert wait_until(lambda: routed() == 1, 5)
    finally:
        native.move(base)


def test_haproxy_pins_unversioned_http_to_split_version_when_rolled_out(
    native: Native
) -> None:
    """A rollout's split, moved in live: unversioned HTTP requests get a version in
    their path (version 9 does not exist: Triton says so, which shows the rewrite),
    named ones keep theirs, and each pinned answer is tallied under its version."""
    base = native.snapshot
    route = replace(base.routes[0], split=(1, 9, 100))
    assert native.move(replace(base, routes=(route,))) == "runtime"
    native.tally.watch(TINY_MODEL_NAME)
    try:
        status, message = _infer(native, "http")
        assert status == "404" and "version 9 is not found" in message, (status, message)
        native.move(replace(base, routes=(replace(route, split=(1, 9, 0)),)))
        assert _infer(native, "http") == ("OK", "")  # pinned to version 1, which exists
        assert wait_until(lambda: native.tally.window(TINY_MODEL_NAME, 1, 0).requests == 1
                          and native.tally.window(TINY_MODEL_NAME, 9, 0).errors == 1, 5)
    finally:
        native.tally.forget(TINY_MODEL_NAME)
        native.move(base)


def test_haproxy_counts_every_request_when_lines_streamed(native: Native) -> None:
    def total() -> float:
        return sum(s.value for m in native.metrics.registry.collect()
                   if m.name == "infergate_requests" for s in m.samples
                   if s.name.endswith("_total") and s.labels["model"] == TINY_MODEL_NAME
                   and s.labels["outcome"] == "success")

    before = total()
    for protocol in ("http", "grpc") * 5:
        assert _infer(native, protocol)[0] == "OK"
    assert wait_until(lambda: total() - before == 10, 5), total() - before


# The load: a fresh client per call, so a new connection each time, the case a reload
# once stalled: a gRPC connection the old worker accepted just before it stopped was
# told to go away before its first call and then held, with the call, until
# hard-stop-after (30 s; docs/haproxy.md, "Live changes and reloads"). About one
# reload in fifteen stalled a call then; the next test catches that every time, so this
# one reloads ten times (a member added, then removed, ...).
LOAD = ("http", "grpc")
LOAD_DEADLINE_S = 3.0  # a call slower than this fails the test (they take milliseconds)
RELOADS = 10


def _member_added(snapshot: Snapshot) -> Snapshot:
    """Pool ``main`` with a second member (a reload): the same Triton, another name."""
    main = snapshot.pools[0]
    twin = replace(main.members[0], name="twin")
    return replace(snapshot, pools=(replace(main, members=(*main.members, twin)),
                                    *snapshot.pools[1:]))


def test_haproxy_reload_drops_no_request_when_member_added_under_load(native: Native) -> None:
    base = native.snapshot
    grown = _member_added(base)
    failures: list[str] = []
    done = threading.Event()
    count = [0]

    def load(protocol: str) -> None:
        while not done.is_set():
            started = time.monotonic()
            try:
                status, message = _infer(native, protocol, deadline_s=LOAD_DEADLINE_S)
            except Exception as exc:  # any: a thread that ends silently hides a failure
                status, message = type(exc).__name__, str(exc)
            count[0] += 1
            if status != "OK":
                failures.append(f"{protocol}: {status} {message} "
                                f"({time.monotonic() - started:.1f} s)")

    def served(calls: int) -> bool:  # that many more calls end within 10 s
        at = count[0]
        return wait_until(lambda: count[0] >= at + calls, 10)

    threads = [threading.Thread(target=load, args=(p,)) for p in LOAD]
    for thread in threads:
        thread.start()
    try:
        assert served(20), failures
        for i in range(RELOADS):  # a member added, removed, added...
            assert native.move(grown if i % 2 == 0 else base) == "reload"
            assert served(20), failures
    finally:
        done.set()
        for thread in threads:
            thread.join()
        if native.snapshot != base:
            native.move(base)
    assert failures == [] and count[0] >= 20 * (RELOADS + 1)


# HTTP/2 by hand (frame types and flags of RFC 9113), as much as a first call takes
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, SETTINGS, GOAWAY = 0, 1, 4, 7
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
CALL_AFTER_S = 0.05  # a new gRPC connection's first call leaves that long after SETTINGS


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return (len(payload).to_bytes(3, "big") + bytes((kind, flags))
            + stream.to_bytes(4, "big") + payload)


def _unknown_model_call() -> bytes:
    """A gRPC ModelInfer of model ``nope`` on stream 1, which HAProxy answers itself
    (NOT_FOUND): HPACK literals without indexing, no Huffman coding."""
    def literal(name: bytes, value: bytes) -> bytes:
        return b"\x00" + bytes((len(name),)) + name + bytes((len(value),)) + value

    path = b"/inference.GRPCInferenceService/ModelInfer"
    block = (b"\x83\x86"  # :method POST, :scheme http (static table)
             + b"\x04" + bytes((len(path),)) + path  # :path, its name from the table
             + b"\x01\x09localhost"  # :authority
             + literal(b"content-type", b"application/grpc") + literal(b"te", b"trailers"))
    message = b"\x0a\x04nope"  # ModelInferRequest, field 1 (model_name)
    return (_frame(HEADERS, END_HEADERS, 1, block)
            + _frame(DATA, END_STREAM, 1, b"\x00" + len(message).to_bytes(4, "big") + message))


def _first_call(sock: socket.socket, idle_s: float = GOAWAY_IDLE_S + 2.0) -> str:
    """Open HTTP/2 on ``sock`` as gRPC does and make a first call shortly after the
    server's SETTINGS came (:data:`CALL_AFTER_S`), unless a GOAWAY came first: gRPC
    then sends nothing on the connection and waits for the server to close it.
    "answered", "closed", or "held" (nothing from the server for ``idle_s``)."""
    sock.sendall(PREFACE + _frame(SETTINGS, 0, 0))
    buf, settled, goaway, called = b"", 0.0, False, False
    while True:
        calling = settled and not goaway and not called
        wait = max(0.0, settled + CALL_AFTER_S - time.monotonic()) if calling else idle_s
        if not select.select([sock], [], [], wait)[0]:
            if not calling:
                return "held"
            sock.sendall(_unknown_model_call())
            called = True
            continue
        chunk = sock.recv(65536)
        if not chunk:
            return "closed"
        buf += chunk
        while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
            kind, flags, stream = buf[3], buf[4], int.from_bytes(buf[5:9], "big")
            buf = buf[9 + int.from_bytes(buf[:3], "big"):]
            if kind == SETTINGS and not flags & ACK:
                settled = time.monotonic()
                sock.sendall(_frame(SETTINGS, ACK, 0))
            goaway |= kind == GOAWAY
            if kind == HEADERS and stream == 1:
                return "answered"


def _stopping(native: Native, worker: str) -> bool:
    """Whether ``worker`` is stopping; False while the master re-executes itself for the
    reload (its socket refuses connections for that moment: CI saw it)."""
    try:
        return "Stopping: 1" in send(native.layout.master_socket,
                                     f"@!{worker} show info; quit")
    except OSError:
        return False


# the client speaks within the old worker's close-spread-time, or after it
@pytest.mark.parametrize("delay_s", [0.2, CLOSE_SPREAD_S + 0.5])
def test_haproxy_reload_leaves_no_connection_hanging_when_opened_just_before(
    native: Native, delay_s: float
) -> None:
    """A connection the old worker accepted before a reload, whose client speaks
    ``delay_s`` after the old worker began to stop: its first call is answered, or
    the connection is closed so that the client reconnects; never held unanswered
    (it was, until hard-stop-after: config.CLOSE_SPREAD_S says why)."""
    base = native.snapshot
    grown = _member_added(base)
    host, port = native.layout.grpc_bind.rsplit(":", 1)
    old = native.worker_pid().split(":")[1].strip()
    with socket.create_connection((host, int(port))) as sock:
        time.sleep(0.2)  # accepted by the worker of now
        try:
            assert native.move(grown) == "reload"
            assert wait_until(lambda: _stopping(native, old), 5)
            time.sleep(delay_s)
            assert _first_call(sock) in ("answered", "closed")
        finally:
            native.move(base)
