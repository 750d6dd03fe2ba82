"""Snapshots, layouts and ``haproxy -c`` shared by the rendering tests (``test_maps``,
``test_answers``, ``test_config``, ``test_changes``, ``test_render``, ``test_golden``);
HTTP servers that answer with their own name, for the tests that run a real HAProxy in
front of them (``test_residency``, ``test_planes``)."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from gateway.haproxy.process import find_haproxy
from gateway.haproxy.snapshot import (
    Layout,
    MemberState,
    PoolState,
    RouteState,
    Snapshot,
    server_name,
)
from gateway.policy.access import key_digest
from gateway.policy.rate import RateClass


def layout_in(tmp: Path) -> Layout:
    return Layout("127.0.0.1:18000", "127.0.0.1:18001", "127.0.0.1:18002", "127.0.0.1:18003",
                  tmp, "127.0.0.1:18004")


def member(port: int, routable: bool = True, weight: int = 256) -> MemberState:
    return MemberState(server_name(f"127.0.0.1:{port + 1}"), "127.0.0.1", port, port + 1,
                       routable, weight)


def snapshot(**changes: object) -> Snapshot:
    """Two pools (``main``: two members, ``canary``: one), a 90/10 canary split, a
    default route and rate limits (a default class and one key's)."""
    base = Snapshot(
        pools=(PoolState("main", (member(9000), member(9010))),
               PoolState("canary", (member(9020),))),
        routes=(RouteState("resnet", (("main", 0.9), ("canary", 0.1)), 48),
                RouteState("tiny", (("main", 1.0),), 24)),
        default_route=RouteState("", (("main", 1.0),), 48),
        rate_default=RateClass(100, 200),
        rate_keys=((key_digest("batch-jobs"), RateClass(20, 20)),),
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def haproxy_check(config: Path) -> subprocess.CompletedProcess[str]:
    """``haproxy -c -f config`` with the real HAProxy (its maps and error files must be
    where the configuration names them)."""
    binary = find_haproxy()
    assert binary is not None, "make test installs Debian's haproxy"
    return subprocess.run([binary, "-c", "-f", str(config)],
                          capture_output=True, text=True, check=False)


class FakeMember(ThreadingHTTPServer):
    """Answers health checks, and every request with its own name; a request with
    ``x-hold`` waits until ``release`` is set."""

    daemon_threads = True

    def __init__(self, name: str) -> None:
        self.name = name
        self.release = threading.Event()
        self.connections: set[socket.socket] = set()
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def process_request(self, request: Any, client_address: Any) -> None:
        self.connections.add(request)
        super().process_request(request, client_address)

    def vanish(self) -> None:
        """Gone as a killed process is: nothing listens, every connection is closed."""
        self.shutdown()
        self.server_close()
        for connection in list(self.connections):
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    server: FakeMember
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._answer()

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("content-length", 0)))
        if self.headers.get("x-hold"):
            self.server.release.wait(30)
        self._answer()

    def _answer(self) -> None:
        body = json.dumps({"by": self.server.name}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@contextlib.contextmanager
def serving(name: str) -> Iterator[FakeMember]:
    server = FakeMember(name)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.release.set()
        server.shutdown()
        server.server_close()
        thread.join()


def as_member(server: FakeMember) -> MemberState:
    key = f"127.0.0.1:{server.port}"
    return MemberState(server_name(key), "127.0.0.1", server.port, server.port, True)
