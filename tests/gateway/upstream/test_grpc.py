"""The gateway's gRPC servers' options (gateway/upstream/grpc.py)."""

from __future__ import annotations

import asyncio
import socket

import grpc
import pytest

from gateway.upstream.grpc import server_options


def test_a_gateway_grpc_server_refuses_a_port_another_listener_shares_out() -> None:
    """HAProxy listens with SO_REUSEPORT, and so would grpc-core unless told not to: a
    forwarder given the port of an HAProxy frontend (two free-port picks alike) started
    without a word, and the kernel sent some of HAProxy's connections to the other
    listener (a CI run's stream met an HTTP frontend's 404). Now its bind fails."""
    async def bind(options: list[tuple[str, int]], port: int) -> int:
        server = grpc.aio.server(options=options)
        try:
            return int(server.add_insecure_port(f"127.0.0.1:{port}"))
        finally:
            await server.stop(None)

    with socket.socket() as haproxy_like:
        haproxy_like.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        haproxy_like.bind(("127.0.0.1", 0))
        haproxy_like.listen()
        port = haproxy_like.getsockname()[1]
        # (grpc-core's default shares it: what the gateway's servers did before)
        assert asyncio.run(bind([], port)) == port
        with pytest.raises(RuntimeError, match="Failed to bind"):
            asyncio.run(bind(server_options(1 << 20), port))
