"""A rollout's replayed sample: the owner's evaluation set (the synthetic inputs the
converter verified on, when the upload had none) sent to both versions as deployed, by
version, through one member of the model's pools (:class:`Replay`):

- :meth:`Replay.probe`, the gate's: each sample a request of its own, the versions
  interleaved, in rounds until the candidate has ``P99_MIN_ANSWERS`` answers or
  ``min(step_seconds, GATE_PROBE_MAX_S)`` have passed: both versions' windows over the
  same requests and the agreement of their outputs (:class:`Probe`); failures are
  counted, not raised;
- :meth:`Replay.agreement`, at each step's end: the sample in the model's batches, the
  agreement of both versions' outputs; a failed request fails the rollout.

The agreement is the share of equal top-1 classes when the model's latest upload budgeted
top-1, else the mean cosine of the first output (:func:`agreement_metric`). The requests
count as ``traffic="rollout"``.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import tritonclient.http as triton_http
from tritonclient.grpc import model_config_pb2 as mc

from converters.spec import TRITON_TO_NUMPY
from converters.triton_config import parse_model_config
from gateway.config.rollout import RolloutSpec
from gateway.errors import DeployFailed, GatewayError, ModelNotFound
from gateway.lifecycle.records.store import RecordStore
from gateway.lifecycle.warmup.deploy import Deployer
from gateway.policy.rollout import P99_MIN_ANSWERS, Window, agreement_of
from gateway.pools import PoolMember

GATE_PROBE_MAX_S = 30.0  # the gate's latency probe runs at most this long (and step_seconds)


@dataclass
class Probe:
    """The gate's replay: both versions' windows over the same requests, and the
    agreement of their outputs (None: no sample both answered)."""

    samples: int
    stable: Window
    candidate: Window
    agreement: float | None


@dataclass
class Replay:
    """The replayed sample sent to a rollout's versions, through ``deployer``'s members."""

    deployer: Deployer
    store: RecordStore

    async def agreement(self, model: str, stable: int, candidate: int, samples: Path,
                        spec: RolloutSpec) -> float:
        """The evaluation sample replayed to both versions as deployed (a member of the
        model's pools, by version): the share of equal top-1 classes when the owner's
        budget speaks of top-1, else the mean cosine of the first output."""
        config = version_config(self.store, model, candidate)
        with np.load(samples) as data:
            arrays = {name: data[name] for name in data.files}
        metric = agreement_metric(self.store, model)
        member = self.deployer.members(model)[0]
        outputs = [await self._replay(model, version, config, arrays, member)
                   for version in (stable, candidate)]
        return agreement_of(outputs[0], outputs[1], metric)

    async def probe(self, model: str, stable: int, candidate: int, samples: Path,
                    spec: RolloutSpec) -> Probe:
        """The gate's replay: each sample a request of its own to both versions as
        deployed (a member of the model's pools, by version), the versions interleaved
        (which goes first alternates), in rounds until the candidate has
        ``P99_MIN_ANSWERS`` answers or ``min(step_seconds, GATE_PROBE_MAX_S)`` passed
        (one round at least). Failures are counted, not raised: they are the verdict's."""
        config = version_config(self.store, model, candidate)
        with np.load(samples) as data:
            arrays = {name: data[name] for name in data.files}
        count = len(next(iter(arrays.values()))) if arrays else 0
        member = self.deployer.members(model)[0]
        bodies = [_body(config, arrays, i, i + 1) for i in range(count)]
        output = config.output[0].name
        answers: dict[int, list[tuple[bool, float]]] = {stable: [], candidate: []}
        outputs: dict[int, list[np.ndarray | None]] = {stable: [None] * count,
                                                        candidate: [None] * count}
        ends = time.monotonic() + min(spec.step_seconds, GATE_PROBE_MAX_S)
        rounds = 0
        while True:
            for i, (body, headers) in enumerate(bodies):
                first_stable = (i + rounds) % 2 == 0
                for version in (stable, candidate) if first_stable else (candidate, stable):
                    began = time.perf_counter()
                    status, answer = await self._send(model, version, member, body, headers)
                    answers[version].append((status == 200, time.perf_counter() - began))
                    if rounds == 0 and status == 200:
                        with contextlib.suppress(Exception):  # undecodable: not compared
                            outputs[version][i] = np.asarray(
                                triton_http.InferenceServerClient.parse_response_body(
                                    answer).as_numpy(output))
            rounds += 1
            if not count or len(answers[candidate]) >= P99_MIN_ANSWERS or \
                    time.monotonic() >= ends:
                break
        pairs = [(a, b) for a, b in zip(outputs[stable], outputs[candidate], strict=True)
                 if a is not None and b is not None]
        agreement = agreement_of(
            [row for a, _ in pairs for row in a.reshape(len(a), -1)],
            [row for _, b in pairs for row in b.reshape(len(b), -1)],
            agreement_metric(self.store, model)) if pairs else None
        return Probe(count, Window.of(answers[stable]), Window.of(answers[candidate]),
                     agreement)

    async def _send(self, model: str, version: int, member: PoolMember, body: bytes,
                    headers: dict[str, str]) -> tuple[int, bytes]:
        admin = self.deployer.admin

        async def call(m: PoolMember) -> tuple[int, bytes]:
            return await admin.infer(m, model, version, body, headers)

        try:
            return await self.deployer.core.telemetry.synthetic(
                model, member, call, protocol="http", traffic="rollout",
                outcome=lambda r: "success" if r[0] == 200 else "upstream_error")
        except GatewayError as err:  # the member did not answer: a failure of this version
            return 503, err.message.encode()

    async def _replay(self, model: str, version: int, config: mc.ModelConfig,
                      arrays: dict[str, np.ndarray], member: PoolMember) -> list[np.ndarray]:
        count = len(next(iter(arrays.values())))
        step = max(1, config.max_batch_size)
        per_sample: list[np.ndarray] = []
        admin = self.deployer.admin
        for start in range(0, count, step):
            body, headers = _body(config, arrays, start, start + step)

            async def call(m: PoolMember, body: bytes = body,
                           headers: dict[str, str] = headers) -> tuple[int, bytes]:
                return await admin.infer(m, model, version, body, headers)

            status, answer = await self.deployer.core.telemetry.synthetic(
                model, member, call, protocol="http", traffic="rollout",
                outcome=lambda r: "success" if r[0] == 200 else "upstream_error")
            if status != 200:
                raise DeployFailed(f"replaying the evaluation sample to version {version} "
                                   f"answered {status}: {answer[:2000].decode(errors='replace')}")
            output = triton_http.InferenceServerClient.parse_response_body(answer).as_numpy(
                config.output[0].name)
            per_sample.extend(np.asarray(output).reshape(len(output), -1))
        return per_sample


def version_config(store: RecordStore, model: str, version: int) -> mc.ModelConfig:
    """The config ``version`` of ``model`` was published with."""
    target = store.version(model, version)
    if target is None:
        raise ModelNotFound(f"model {model!r} has no version {version}")
    return parse_model_config(target.config)


def _body(config: mc.ModelConfig, arrays: dict[str, np.ndarray], start: int,
          end: int) -> tuple[bytes, dict[str, str]]:
    """An infer request of samples ``start:end`` (binary tensors in, the first output
    as JSON out: the answer is one JSON object, no binary part to frame)."""
    inputs = []
    for tensor in config.input:
        batch = arrays[tensor.name][start:end]
        datatype = mc.DataType.Name(tensor.data_type).removeprefix("TYPE_")
        item = triton_http.InferInput(tensor.name, list(batch.shape), datatype)
        item.set_data_from_numpy(batch.astype(TRITON_TO_NUMPY[datatype]), binary_data=True)
        inputs.append(item)
    wanted = [triton_http.InferRequestedOutput(config.output[0].name, binary_data=False)]
    body, json_size = triton_http.InferenceServerClient.generate_request_body(
        inputs, outputs=wanted)
    headers = {"Content-Type": "application/octet-stream"}
    if json_size is not None:
        headers["Inference-Header-Content-Length"] = str(json_size)
    return body, headers


def agreement_metric(store: RecordStore, model: str) -> Literal["top1", "cosine"]:
    """top-1 when the model's latest upload budgeted top-1, else cosine."""
    for job in store.jobs(model, limit=5):
        budget = (job.spec or {}).get("accuracy_budget") or {}
        if budget.get("max_top1_drop") is not None:
            return "top1"
        if job.spec:
            break
    return "cosine"
