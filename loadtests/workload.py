"""What the load tests send: a weighted mix of models, and request payloads built once per
model from the model's own metadata (so any model the gateway serves can be load-tested).

Payloads are deterministic (seeded) and pre-serialised: the client spends its time
sending, not encoding, so the latency measured is the server's.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

DEFAULT_MODEL = "efficientnet_lite0"

# KServe v2 datatype -> numpy dtype
NUMPY_DTYPES = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32,
    "UINT64": np.uint64, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32,
    "INT64": np.int64, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
    "BYTES": np.object_,
}


@dataclass(frozen=True)
class ModelMix:
    """Weighted models, e.g. ``efficientnet_lite0:3,tiny:1``."""

    weights: tuple[tuple[str, float], ...]

    @classmethod
    def parse(cls, text: str) -> ModelMix:
        weights = []
        for part in filter(None, (p.strip() for p in text.split(","))):
            name, _, weight = part.partition(":")
            value = float(weight) if weight else 1.0
            if value < 0:
                raise ValueError(f"negative weight for {name}")
            weights.append((name, value))
        if not weights or sum(w for _, w in weights) <= 0:
            raise ValueError(f"no model with a positive weight in {text!r}")
        return cls(tuple(weights))

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.weights)

    def choose(self, rng: random.Random) -> str:
        names, weights = zip(*self.weights, strict=True)
        return rng.choices(names, weights=weights)[0]

    def favouring(self, index: int, factor: float = 3.0) -> ModelMix:
        """The same models with the ``index``-th (mod count) weighted ``factor`` times."""
        favoured = index % len(self.weights)
        return ModelMix(tuple(
            (name, weight * factor if i == favoured else weight)
            for i, (name, weight) in enumerate(self.weights)
        ))


@dataclass(frozen=True)
class TensorMeta:
    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class ModelMeta:
    name: str
    inputs: tuple[TensorMeta, ...]
    outputs: tuple[TensorMeta, ...]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelMeta:
        def tensors(items: list[dict[str, Any]]) -> tuple[TensorMeta, ...]:
            return tuple(
                TensorMeta(t["name"], t["datatype"], tuple(int(d) for d in t["shape"]))
                for t in items
            )

        return cls(data["name"], tensors(data["inputs"]), tensors(data.get("outputs", [])))


def grpc_metadata(client: grpcclient.InferenceServerClient) -> Callable[[str], ModelMeta]:
    def fetch(model: str) -> ModelMeta:
        return ModelMeta.from_json(client.get_model_metadata(model, as_json=True))

    return fetch


def example_inputs(meta: ModelMeta, batch_size: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs; a dynamic first dimension is the batch, other dynamic dims are 1."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for tensor in meta.inputs:
        shape = [batch_size if (i == 0 and d < 0) else max(d, 1)
                 for i, d in enumerate(tensor.shape)]
        dtype = NUMPY_DTYPES[tensor.datatype]
        if tensor.datatype == "BYTES":
            arrays[tensor.name] = np.full(shape, b"infergate", dtype=np.object_)
        elif np.issubdtype(dtype, np.floating):
            arrays[tensor.name] = rng.normal(0, 1, size=shape).astype(dtype)
        else:
            arrays[tensor.name] = np.zeros(shape, dtype=dtype)
    return arrays


@dataclass(frozen=True)
class HttpPayload:
    body: bytes
    headers: dict[str, str]


def http_json_payload(meta: ModelMeta, arrays: dict[str, np.ndarray]) -> HttpPayload:
    inputs = [
        {"name": t.name, "shape": list(arrays[t.name].shape), "datatype": t.datatype,
         "data": _json_data(arrays[t.name])}
        for t in meta.inputs
    ]
    body = json.dumps({"inputs": inputs}).encode()
    return HttpPayload(body, {"Content-Type": "application/json"})


def _json_data(array: np.ndarray) -> list[Any]:
    if array.dtype == np.object_:
        return [v.decode() if isinstance(v, bytes) else str(v) for v in array.ravel()]
    return list(array.ravel().tolist())


def http_binary_payload(meta: ModelMeta, arrays: dict[str, np.ndarray]) -> HttpPayload:
    """The binary-tensor extension: a JSON header, then raw tensor bytes."""
    inputs = []
    for tensor in meta.inputs:
        inp = httpclient.InferInput(tensor.name, list(arrays[tensor.name].shape), tensor.datatype)
        inp.set_data_from_numpy(arrays[tensor.name], binary_data=True)
        inputs.append(inp)
    outputs = [httpclient.InferRequestedOutput(o.name, binary_data=True) for o in meta.outputs]
    body, json_size = httpclient.InferenceServerClient.generate_request_body(
        inputs, outputs=outputs
    )
    headers = {"Content-Type": "application/octet-stream"}
    if json_size is not None:
        headers["Inference-Header-Content-Length"] = str(json_size)
    return HttpPayload(body, headers)


def grpc_inputs(meta: ModelMeta, arrays: dict[str, np.ndarray]) -> list[grpcclient.InferInput]:
    inputs = []
    for tensor in meta.inputs:
        inp = grpcclient.InferInput(tensor.name, list(arrays[tensor.name].shape), tensor.datatype)
        inp.set_data_from_numpy(arrays[tensor.name])
        inputs.append(inp)
    return inputs


@dataclass
class PayloadCache:
    """Payloads per (model, kind), built on first use from the model's metadata."""

    metadata: Callable[[str], ModelMeta]
    batch_size: int = 1
    _built: dict[tuple[str, str], Any] = field(default_factory=dict)
    _meta: dict[str, ModelMeta] = field(default_factory=dict)

    def meta(self, model: str) -> ModelMeta:
        if model not in self._meta:
            self._meta[model] = self.metadata(model)
        return self._meta[model]

    def get(self, model: str, kind: str) -> Any:
        key = (model, kind)
        if key not in self._built:
            meta = self.meta(model)
            arrays = example_inputs(meta, self.batch_size)
            build = {"json": http_json_payload, "binary": http_binary_payload,
                     "grpc": grpc_inputs}[kind]
            self._built[key] = build(meta, arrays)
        return self._built[key]
