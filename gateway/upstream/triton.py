"""The one admin client toward Triton members (the lifecycle, the batching policy,
the residency and repository calls all use it): repository load/unload with a config
override and the repository index (over the member's gRPC port), config, metadata,
statistics, the metrics page, and synthetic inference requests (warm-up, keep-warm).

Repository calls go over gRPC, not HTTP: Triton's HTTP server (libevhtp) binds each
connection to one of its worker threads, and its load handler holds that thread until
the load ends, so HTTP inference on every connection bound to the same thread (the data
plane's keep-alive connections) waits for the load; a connection of its own for loads
is bound to a thread like any other. Measured (tritonserver 2.51,
``loadtests/bench_member_loads.py``, docs/residency.md): HTTP inference p99 17 ms with
no load, 707 ms while 100 MB models loaded over HTTP, 15 ms while they loaded over gRPC.

A version is loaded with its own config (the one published with it) plus
``version_policy { specific { versions: [v] } }``. Triton loads the new version in the
background while the loaded one keeps serving, runs the config's ``model_warmup``
before marking it ready, and only then swaps and unloads the old one (checked against
tritonserver 2.51: no failed request across a swap; a refused load leaves the serving
version in place). A change of ``version_policy`` alone reloads nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any

import grpc
import httpx
import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc.service_pb2_grpc import GRPCInferenceServiceStub

from converters.spec import TRITON_TO_NUMPY
from gateway.errors import DeployFailed, GatewayError, InvalidInput, ModelNotFound, Unavailable
from gateway.pools import PoolMember
from gateway.upstream.grpc import CHANNEL_OPTIONS, UPSTREAM_ONLY_OPTIONS

log = logging.getLogger(__name__)

NUMPY_DTYPES = {t: np.dtype(n) for t, n in TRITON_TO_NUMPY.items()}  # converters' table
DYNAMIC_DIM_FALLBACK = 8  # a dynamic non-batch dimension with no warm-up dims to copy
# the call never reached Triton's answer: the member is down, slow or going away
UNREACHED = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                       grpc.StatusCode.CANCELLED})


# (member, path, body, headers) -> (status, body): how synthetic inference is sent
InferTransport = Callable[[PoolMember, str, bytes, dict[str, str]],
                          Awaitable[tuple[int, bytes]]]


class MemberAdmin:
    """``infer_transport``: the data path's own upstream (server.py passes the HTTP
    adapter's keep-alive pool), so warm-up requests keep warm the very connections user
    requests use; default: this client. Repository calls use one gRPC channel per
    member, opened at its first call and closed by :meth:`close`.

    ``live_targets``: the gRPC addresses of the members the gateway has now. When a
    channel opens for a new member, the channels to members no longer among them (a DNS
    pool's pods replaced, each with a new address) are closed, their calls in flight
    given up to ``load_timeout_s`` to end; without it every address ever called kept its
    channel until :meth:`close`."""

    def __init__(self, client: httpx.AsyncClient, load_timeout_s: float = 600.0,
                 infer_transport: InferTransport | None = None,
                 call_timeout_s: float = 60.0,
                 live_targets: Callable[[], Collection[str]] | None = None) -> None:
        self.client = client
        self.load_timeout_s = load_timeout_s  # a load's deadline
        self.infer_transport = infer_transport
        self.call_timeout_s = call_timeout_s  # an unload's, the index's
        self.live_targets = live_targets
        self._channels: dict[str, tuple[grpc.aio.Channel, GRPCInferenceServiceStub]] = {}
        self._retiring: dict[asyncio.Task[None], grpc.aio.Channel] = {}  # closing, calls end
        self._closed = False

    @property
    def targets(self) -> frozenset[str]:
        """The members' gRPC addresses a channel is open to."""
        return frozenset(self._channels)

    async def load(self, member: PoolMember, model: str,
                   config: dict[str, Any] | None = None) -> None:
        """Load ``model`` (with ``config`` as its config, when given); returns once it is
        loaded and warm. Triton's refusal is DeployFailed with its message."""
        request = pb.RepositoryModelLoadRequest(model_name=model)
        if config is not None:
            request.parameters["config"].string_param = json.dumps(config)
        try:
            await self._stub(member).RepositoryModelLoad(request, timeout=self.load_timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise _repository_error(member, f"loading {model!r}", exc) from exc

    async def unload(self, member: PoolMember, model: str) -> None:
        request = pb.RepositoryModelUnloadRequest(model_name=model)
        try:
            await self._stub(member).RepositoryModelUnload(request,
                                                          timeout=self.call_timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise _repository_error(member, f"unloading {model!r}", exc) from exc

    async def repository_index(self, member: PoolMember, ready: bool = False,
                               ) -> list[dict[str, Any]]:
        """Triton's repository index: every model of its repository (``ready``: those
        loaded and ready only), each ``{"name", "version", "state", "reason"}`` as its
        HTTP answer has them (a field Triton leaves empty is absent); ``state`` is
        ``READY`` for those loaded and ready (explicit model control)."""
        try:
            answer = await self._stub(member).RepositoryIndex(
                pb.RepositoryIndexRequest(ready=ready), timeout=self.call_timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise Unavailable(f"member {member.key}: repository index: "
                              f"{exc.code().name} {exc.details()}") from exc
        return [json_format.MessageToDict(entry, preserving_proto_field_name=True)
                for entry in answer.models]

    async def metrics_text(self, member: PoolMember) -> str:
        """The member's Prometheus page (its metrics port)."""
        url = f"http://{member.spec.metrics_address}/metrics"
        try:
            resp = await self.client.get(url)
        except httpx.HTTPError as exc:
            raise Unavailable(f"member {member.key} unreachable: {exc!r}") from exc
        if resp.status_code != 200:
            raise Unavailable(f"member {member.key}: GET /metrics -> {resp.status_code}")
        return resp.text

    async def close(self) -> None:
        """Close the members' gRPC channels (the HTTP client is its owner's to close)."""
        self._closed = True
        channels = [c for c, _ in self._channels.values()] + list(self._retiring.values())
        self._channels = {}
        for task in list(self._retiring):
            task.cancel()
        for channel in channels:
            await channel.close()

    def _stub(self, member: PoolMember) -> GRPCInferenceServiceStub:
        if self._closed:
            raise Unavailable(f"member {member.key}: the admin client is closed")
        target = member.spec.grpc_address
        entry = self._channels.get(target)
        if entry is None:
            self._retire_gone(target)
            channel = grpc.aio.insecure_channel(
                target, options=[*CHANNEL_OPTIONS, *UPSTREAM_ONLY_OPTIONS])
            entry = self._channels[target] = (channel, GRPCInferenceServiceStub(channel))
        return entry[1]

    def _retire_gone(self, coming: str) -> None:
        """Close the channels to members no longer among :attr:`live_targets` (``coming``
        is about to be called, whatever they say), each once its calls end."""
        if self.live_targets is None:
            return
        live = {*self.live_targets(), coming}
        for target in [t for t in self._channels if t not in live]:
            channel, _ = self._channels.pop(target)
            task = asyncio.ensure_future(channel.close(grace=self.load_timeout_s))
            self._retiring[task] = channel
            task.add_done_callback(self._retired)

    def _retired(self, task: asyncio.Task[None]) -> None:
        self._retiring.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            log.warning("closing a channel to a member gone: %s", task.exception())

    async def config(self, member: PoolMember, model: str) -> mc.ModelConfig:
        url = f"http://{member.spec.http_address}/v2/models/{model}/config"
        try:
            resp = await self.client.get(url)
        except httpx.HTTPError as exc:
            raise Unavailable(f"member {member.key} unreachable: {exc!r}") from exc
        if resp.status_code != 200:
            raise DeployFailed(f"{member.key}: no config for {model!r}: {_message(resp)}")
        return json_format.ParseDict(resp.json(), mc.ModelConfig(), ignore_unknown_fields=True)

    async def loaded_versions(self, member: PoolMember, model: str) -> list[int]:
        """Versions of ``model`` the member has loaded and ready (empty if none)."""
        url = f"http://{member.spec.http_address}/v2/models/{model}"
        try:
            resp = await self.client.get(url)
        except httpx.HTTPError as exc:
            raise Unavailable(f"member {member.key} unreachable: {exc!r}") from exc
        if resp.status_code != 200:
            return []
        return sorted(int(v) for v in resp.json().get("versions", []) if str(v).isdigit())

    async def infer(self, member: PoolMember, model: str, version: int | None, body: bytes,
                    headers: dict[str, str]) -> tuple[int, bytes]:
        path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
        if self.infer_transport is not None:
            return await self.infer_transport(member, path, body, headers)
        resp = await self._post(member, path, body, headers)
        return resp.status_code, resp.content

    async def get_json(self, member: PoolMember, path: str) -> dict[str, Any]:
        """GET ``path`` on the member's HTTP port. Triton's 404 / 400 (an unknown model,
        a bad version) is the caller's mistake; any other error answer is Unavailable."""
        resp = await self._request(member, "GET", path, client_errors=True)
        data: dict[str, Any] = resp.json()
        return data

    async def post_ok(self, member: PoolMember, path: str, body: bytes | str,
                      headers: dict[str, str] | None = None) -> None:
        """POST that must succeed; an error answer is Unavailable with Triton's message."""
        await self._request(member, "POST", path,
                            body.encode() if isinstance(body, str) else body, headers)

    async def _request(self, member: PoolMember, method: str, path: str, body: bytes = b"",
                       headers: dict[str, str] | None = None, client_errors: bool = False,
                       ) -> httpx.Response:
        url = f"http://{member.spec.http_address}{path}"
        try:
            resp = await self.client.request(method, url, content=body, headers=headers)
        except httpx.InvalidURL as exc:  # a model name with control characters, say
            raise InvalidInput(f"not a valid request path: {path!r}") from exc
        except httpx.HTTPError as exc:
            raise Unavailable(f"member {member.key} unreachable: {exc!r}") from exc
        if resp.status_code >= 400:
            error: type[GatewayError] = Unavailable
            if client_errors and resp.status_code in (400, 404):
                error = ModelNotFound if resp.status_code == 404 else InvalidInput
            raise error(f"member {member.key}: {method} {path} -> {resp.status_code} "
                        f"{_message(resp)[:300]}")
        return resp

    async def _post(self, member: PoolMember, path: str, body: bytes,
                    headers: dict[str, str] | None = None) -> httpx.Response:
        url = f"http://{member.spec.http_address}{path}"
        try:
            return await self.client.post(url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            raise Unavailable(f"member {member.key} unreachable: {exc!r}") from exc


def _repository_error(member: PoolMember, doing: str,
                      exc: grpc.aio.AioRpcError) -> GatewayError:
    """Triton's refusal (a broken model, no such model) is DeployFailed with its
    message; a call that never got its answer (down, past the deadline) Unavailable."""
    if exc.code() in UNREACHED:
        return Unavailable(f"member {member.key} unreachable while {doing}: "
                           f"{exc.code().name} {exc.details()}")
    return DeployFailed(f"{member.key}: {doing} failed: {(exc.details() or '')[:2000]}")


def _message(resp: httpx.Response) -> str:
    try:
        return str(resp.json().get("error", resp.text))[:2000]
    except ValueError:
        return resp.text[:2000]


def override_for_version(config: mc.ModelConfig, version: int | None,
                         warm_batches: tuple[int, ...] = (1,),
                         also: Sequence[int] = ()) -> dict[str, Any]:
    """The JSON load override: ``config`` pinned to ``version`` (``None``: as it is;
    ``also``: more versions loaded beside it, a rollout's stable), with zero-data
    ``model_warmup`` at ``warm_batches`` when it declares none, so no version ever
    reaches traffic cold."""
    pinned = mc.ModelConfig()
    pinned.CopyFrom(config)
    if version is not None:
        pinned.version_policy.Clear()
        pinned.version_policy.specific.versions.extend(sorted({version, *also}))
    if not pinned.model_warmup and pinned.max_batch_size > 0:
        for batch in warm_batches:
            if batch > pinned.max_batch_size:
                continue
            warm = pinned.model_warmup.add(name=f"zero_batch_{batch}", batch_size=batch,
                                           count=1)
            for tensor in pinned.input:
                entry = warm.inputs[tensor.name]
                entry.data_type = tensor.data_type
                entry.dims.extend(d if d > 0 else DYNAMIC_DIM_FALLBACK for d in tensor.dims)
                entry.zero_data = True
    return json_format.MessageToDict(pinned, preserving_proto_field_name=True)


def synthetic_request(config: mc.ModelConfig, batch: int) -> tuple[bytes, dict[str, str]]:
    """A binary-tensor infer request of zeros at ``batch`` (dims from the config, dynamic
    ones from its warm-up entries when it has any)."""
    warm_dims: dict[str, list[int]] = {}
    for warm in config.model_warmup:
        for name, entry in warm.inputs.items():
            warm_dims.setdefault(name, list(entry.dims))
    inputs, blobs = [], []
    for tensor in config.input:
        datatype = mc.DataType.Name(tensor.data_type).removeprefix("TYPE_")
        declared = list(tensor.dims)
        known = warm_dims.get(tensor.name, [])
        dims = [d if d > 0 else (known[i] if i < len(known) and known[i] > 0
                                 else DYNAMIC_DIM_FALLBACK) for i, d in enumerate(declared)]
        shape = ([batch] if config.max_batch_size > 0 else []) + dims
        array: np.ndarray = np.zeros(shape, dtype=NUMPY_DTYPES.get(datatype, np.float32))
        blobs.append(array.tobytes())
        inputs.append({"name": tensor.name, "shape": shape, "datatype": datatype,
                       "parameters": {"binary_data_size": array.nbytes}})
    outputs = [{"name": o.name, "parameters": {"binary_data": True}} for o in config.output]
    header = json.dumps({"inputs": inputs, "outputs": outputs}).encode()
    return header + b"".join(blobs), {"Inference-Header-Content-Length": str(len(header)),
                                      "Content-Type": "application/octet-stream"}
