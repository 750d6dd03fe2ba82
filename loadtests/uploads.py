"""Uploads for the lifecycle benchmarks (bench_rollout, bench_failover): their tokens,
the tiny model's upload spec, an evaluation set, an upload with a rollout policy, and a
wait for a job's end that says where it stood when it did not come."""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from converters.tiny import TINY_WIDTH
from gateway.lifecycle.client import JobTimeout, LifecycleClient, LifecycleError

TOKENS = {"upload": "bench-upload-token-0123456789", "admin": "bench-admin-token-0123456789"}
TINY_SPEC = {"inputs": [{"name": "x", "datatype": "FP32", "shape": ["batch", TINY_WIDTH]}],
             "max_batch_size": 8, "profile_iterations": 3, "intra_op_threads": 1}
JOB_TIMEOUT_S = 300.0


def npz(arrays: Mapping[str, np.ndarray]) -> bytes:
    out = io.BytesIO()
    np.savez(out, **arrays)  # type: ignore[arg-type]
    return out.getvalue()


def evaluation_set(calm: bool) -> bytes:
    rng = np.random.default_rng(2)
    x = rng.uniform(0, 0.8, (32, TINY_WIDTH)) if calm else rng.normal(size=(32, TINY_WIDTH))
    return npz({"x": x.astype(np.float32)})


def upload(client: LifecycleClient, model: str, onnx_path: Path, rollout: Mapping[str, Any],
           evaluation: bytes, extra: Mapping[str, Any] | None = None) -> str:
    """The job id of an upload of ``onnx_path`` with ``rollout`` (and ``extra`` spec
    fields)."""
    spec = {**TINY_SPEC, **(extra or {}), "rollout": dict(rollout)}
    try:
        job = client.upload(model, onnx_path, spec, evaluation=evaluation)
    except LifecycleError as err:
        raise RuntimeError(f"upload of {model} answered {err.status}: "
                           f"{str(err.message)[:500]}") from err
    return str(job["id"])


def wait_job(client: LifecycleClient, job_id: str, states: Sequence[str]) -> dict[str, Any]:
    try:
        return client.wait(job_id, states, JOB_TIMEOUT_S, 0.1)
    except JobTimeout as late:
        job = late.job
        rollout = job.get("rollout") or {}
        raise RuntimeError(
            f"job {job_id} not {'/'.join(states)} within {JOB_TIMEOUT_S:g} s: state "
            f"{job.get('state')}, last step {json.dumps((job.get('steps') or [None])[-1])}, "
            f"rollout {rollout.get('state')} at {rollout.get('percent')} %, last decisions "
            f"{json.dumps(rollout.get('decisions', [])[-3:])[:1500]}") from None
