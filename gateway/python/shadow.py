"""The shadow step's comparison of two answers to the same request: stable's (the
user's) and the candidate's (the mirror's), decoded to numpy with tritonclient's own
helpers (HTTP: JSON or JSON + binary tensors; gRPC: ``ModelInferResponse``), compared
per sample on the first output as :func:`gateway.policy.rollout.agreement_of` does.

Decoding happens in the mirror's task, after the user has stable's answer."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Literal

import numpy as np
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.grpc import service_pb2

from gateway.control.grpc_app import RelayedError
from gateway.errors import outcome_of_answer
from gateway.policy.rollout import agreement_of
from gateway.upstream.http import UpstreamResponse

log = logging.getLogger(__name__)
Metric = Literal["top1", "cosine"]
Outputs = dict[str, np.ndarray]


def _rows(array: np.ndarray) -> list[np.ndarray]:
    array = np.asarray(array)
    if array.dtype == np.object_:  # BYTES: compared as text, one row
        return [np.frombuffer(b"".join(x if isinstance(x, bytes) else str(x).encode()
                                       for x in array.ravel()), np.uint8)]
    if array.ndim == 0:
        return [array.reshape(1)]
    return list(array.reshape(len(array), -1))


def agreement(stable: Outputs, candidate: Outputs, metric: Metric) -> float | None:
    """Both answers' agreement on stable's first output (None: not comparable)."""
    if not stable:
        return None
    name = next(iter(stable))
    if name not in candidate:
        return 0.0
    a, b = _rows(stable[name]), _rows(candidate[name])
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b, strict=True)):
        return 0.0
    return agreement_of(a, b, metric)


def http_outputs(resp: UpstreamResponse) -> Outputs:
    """An HTTP infer answer's outputs in answer order."""
    length = None
    for key, value in resp.headers:
        if key.lower() == b"inference-header-content-length":
            length = int(value)
    result = triton_http.InferenceServerClient.parse_response_body(resp.body,
                                                                   header_length=length)
    names = [o["name"] for o in result.get_response().get("outputs", [])]
    return {n: result.as_numpy(n) for n in names}


def grpc_outputs(message: bytes) -> Outputs:
    """A ``ModelInferResponse``'s outputs in answer order."""
    response = service_pb2.ModelInferResponse.FromString(message)
    result = triton_grpc.InferResult(response)
    return {o.name: result.as_numpy(o.name) for o in response.outputs}


def _compared(decode: Callable[[], tuple[Outputs, Outputs]], metric: Metric) -> float | None:
    try:
        stable, candidate = decode()
        return agreement(stable, candidate, metric)
    except Exception:  # noqa: BLE001 - undecodable: not compared, not the candidate's fault
        log.warning("shadow: answers not compared", exc_info=True)
        return None


def compare_http(stable: UpstreamResponse, metric: Metric
                 ) -> Callable[[UpstreamResponse], tuple[str, float | None]]:
    """The mirror's answer against ``stable`` (the user's): its outcome, the agreement
    when both are 200."""
    def compare(candidate: UpstreamResponse) -> tuple[str, float | None]:
        outcome = outcome_of_answer(candidate.status)
        if outcome != "success" or stable.status != 200:
            return outcome, None
        return outcome, _compared(lambda: (http_outputs(stable), http_outputs(candidate)),
                                  metric)
    return compare


def compare_grpc(stable: bytes | RelayedError, metric: Metric
                 ) -> Callable[[bytes | RelayedError], tuple[str, float | None]]:
    def compare(candidate: bytes | RelayedError) -> tuple[str, float | None]:
        if isinstance(candidate, RelayedError):
            return outcome_of_answer(200, candidate.code.value[0]), None
        if isinstance(stable, RelayedError):
            return "success", None
        return "success", _compared(lambda: (grpc_outputs(stable), grpc_outputs(candidate)),
                                    metric)
    return compare
