"""The Python data plane's gRPC client toward Triton members: one persistent aio channel
per member, typed stubs plus a raw-bytes ModelInfer."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from tritonclient.grpc import service_pb2_grpc

from gateway.pools import PoolMember

SERVICE = "inference.GRPCInferenceService"
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
    ("grpc.keepalive_time_ms", 30_000),
]
# Triton quotes requests back in its status messages (a 10,000-dimension shape in full,
# 20 KB): the channel toward it takes large trailers; the adapter relays them cut
UPSTREAM_ONLY_OPTIONS = [
    ("grpc.max_metadata_size", 4 << 20),
    ("grpc.absolute_max_metadata_size", 4 << 20),
]


def server_options(max_message_bytes: int) -> list[tuple[str, int]]:
    """A gateway gRPC server's options: larger requests than ``max_message_bytes`` are
    refused by grpc-core before any handler runs; the port is its own. grpc-core binds
    with ``SO_REUSEPORT`` unless told not to, and so does HAProxy: a port another
    listener already holds (a free port two picks both took) would be shared silently,
    the kernel sending some connections to the other listener (a CI run's stream met an
    HAProxy frontend's 404 that way). Without it, the second bind fails, loudly."""
    return [*(o for o in CHANNEL_OPTIONS if o[0] != "grpc.max_receive_message_length"),
            ("grpc.so_reuseport", 0),
            ("grpc.max_receive_message_length", max_message_bytes)]


def _identity(data: bytes) -> bytes:
    return data


class UpstreamGRPC:
    """One persistent aio channel per member; typed stubs plus a raw ModelInfer."""

    def __init__(self) -> None:
        self._members: dict[str, tuple[Any, Any, Any]] = {}
        self._channels: list[grpc.aio.Channel] = []

    def _get(self, member: PoolMember) -> tuple[Any, Any, Any]:
        entry = self._members.get(member.key)
        if entry is None:
            target = member.spec.grpc_address
            channel = grpc.aio.insecure_channel(
                target, options=[*CHANNEL_OPTIONS, *UPSTREAM_ONLY_OPTIONS])
            self._channels.append(channel)
            raw = channel.unary_unary(
                f"/{SERVICE}/ModelInfer",
                request_serializer=_identity,
                response_deserializer=_identity,
            )
            stream = channel.stream_stream(
                f"/{SERVICE}/ModelStreamInfer",
                request_serializer=_identity,
                response_deserializer=_identity,
            )
            entry = self._members[member.key] = (
                service_pb2_grpc.GRPCInferenceServiceStub(channel), raw, stream
            )
        return entry

    def stub(self, member: PoolMember) -> service_pb2_grpc.GRPCInferenceServiceStub:
        return self._get(member)[0]

    def raw_infer(self, member: PoolMember) -> Callable[..., Awaitable[bytes]]:
        return self._get(member)[1]

    def raw_stream(self, member: PoolMember) -> Any:
        """``ModelStreamInfer`` on the member's channel, messages as raw bytes."""
        return self._get(member)[2]

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()
