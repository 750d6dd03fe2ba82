"""Control plane toward the pools: repository calls routed to the pools that own a
model, and the dynamic-batching policy applied through Triton's load API.

Loads and unloads go to *every* member of every pool serving the model (a model must be
loaded wherever traffic for it can be routed); the index merges one member per pool.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx
import numpy as np

from gateway.batching import BatchingDecision, batch_latency_from_stats, derive_batching
from gateway.dataplane import DataPlane
from gateway.errors import InvalidInput, Unavailable
from gateway.pools import PoolMember

T = TypeVar("T")

NUMPY_DTYPES = {"FP32": np.float32, "FP16": np.float16, "INT64": np.int64, "INT32": np.int32,
                "INT8": np.int8, "UINT8": np.uint8, "BOOL": np.bool_, "FP64": np.float64}


class ModelControl:
    def __init__(self, dataplane: DataPlane, client: httpx.AsyncClient) -> None:
        self.dataplane = dataplane
        self.client = client

    # -- generic routing ---------------------------------------------------------------
    def owners(self, model: str) -> list[PoolMember]:
        members = [m for p in self.dataplane.route(model).pools for m in p.members]
        if not members:
            raise Unavailable(f"no member serves '{model}'")
        return members

    def index_members(self) -> list[PoolMember]:
        """One available member per pool."""
        now = self.dataplane.clock()
        chosen = []
        for pool in self.dataplane.pools:
            alive = [m for m in pool.members if m.available(now)]
            if alive:
                chosen.append(alive[0])
        if not chosen:
            raise Unavailable("no healthy Triton member")
        return chosen

    async def broadcast(self, model: str, call: Callable[[PoolMember], Awaitable[T]]) -> list[T]:
        """Run ``call`` on every member owning ``model``; the first failure is raised
        after all calls finish (no member is left half-way because another failed)."""
        results = await asyncio.gather(*(call(m) for m in self.owners(model)),
                                       return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return results  # type: ignore[return-value]

    async def index(self, call: Callable[[PoolMember], Awaitable[T]]) -> list[T]:
        return list(await asyncio.gather(*(call(m) for m in self.index_members())))

    # -- dynamic batching ---------------------------------------------------------------
    async def apply_batching(self, model: str, latency_slo_ms: float,
                             probe_batches: bool = True) -> BatchingDecision:
        """Measure per-batch latency on one member, derive settings, reload everywhere."""
        member = self.owners(model)[0]
        config = await self._get_json(member, f"/v2/models/{model}/config")
        max_batch = int(config.get("max_batch_size", 0))
        if max_batch <= 0:
            raise InvalidInput(f"model '{model}' does not batch (max_batch_size 0)")
        if probe_batches:
            await self._probe_batches(member, model, config, max_batch)
        stats = await self._get_json(member, f"/v2/models/{model}/stats")
        model_stats: dict[str, Any] = next(iter(stats.get("model_stats", [])), {})
        latency = batch_latency_from_stats(model_stats)
        if not latency:
            raise Unavailable(f"no batch statistics for '{model}' yet: send traffic first")
        decision = derive_batching(latency_slo_ms, latency, max_batch)
        config["dynamic_batching"] = {**config.get("dynamic_batching", {}),
                                      **decision.as_config()}
        body = json.dumps({"parameters": {"config": json.dumps(config)}})

        async def load(m: PoolMember) -> None:
            await self._post(m, f"/v2/repository/models/{model}/load", body)

        await self.broadcast(model, load)
        return decision

    async def _probe_batches(self, member: PoolMember, model: str, config: dict[str, Any],
                             max_batch: int) -> None:
        """A few synthetic requests per power-of-two batch size, so Triton's batch
        statistics cover the range the policy interpolates over."""
        sizes = [b for b in (1, 2, 4, 8, 16, 32, 64, 128) if b <= max_batch]
        for batch in sizes:
            body, headers = _synthetic_request(config, batch)
            for _ in range(3):
                await self._post(member, f"/v2/models/{model}/infer", body, headers)

    async def _get_json(self, member: PoolMember, path: str) -> dict[str, Any]:
        resp = await self._request(member, "GET", path)
        data: dict[str, Any] = resp.json()
        return data

    async def _post(self, member: PoolMember, path: str, body: bytes | str,
                    headers: dict[str, str] | None = None) -> None:
        await self._request(member, "POST", path, body, headers)

    async def _request(self, member: PoolMember, method: str, path: str,
                       body: bytes | str = b"", headers: dict[str, str] | None = None
                       ) -> httpx.Response:
        url = f"http://{member.spec.host}:{member.spec.http_port}{path}"
        try:
            resp = await self.client.request(method, url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            raise Unavailable(f"member {member.key} unreachable: {exc!r}") from exc
        if resp.status_code >= 400:
            raise Unavailable(f"member {member.key}: {method} {path} -> {resp.status_code} "
                              f"{resp.text[:300]}")
        return resp


def _synthetic_request(config: dict[str, Any], batch: int) -> tuple[bytes, dict[str, str]]:
    inputs, blobs = [], []
    for spec in config.get("input", []):
        datatype = spec["data_type"].removeprefix("TYPE_")
        dims = [batch] + [d if d > 0 else 8 for d in spec.get("dims", [])]
        array: np.ndarray = np.zeros(dims, dtype=NUMPY_DTYPES.get(datatype, np.float32))
        blobs.append(array.tobytes())
        inputs.append({"name": spec["name"], "shape": dims, "datatype": datatype,
                       "parameters": {"binary_data_size": array.nbytes}})
    header = json.dumps({"inputs": inputs}).encode()
    return header + b"".join(blobs), {"Inference-Header-Content-Length": str(len(header)),
                                      "Content-Type": "application/octet-stream"}
