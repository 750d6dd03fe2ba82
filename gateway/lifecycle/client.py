"""A client of the gateway's lifecycle API (``/v1/models...``, ``/v1/jobs/{id}``, served by
:mod:`gateway.control.lifecycle_http`; and ``/v1/residency``, where models live, served by
:mod:`gateway.control.residency_http`): the one the ``infergate models`` CLI, the
lifecycle tests and the benchmarks call.

    with LifecycleClient("http://127.0.0.1:8000", token) as client:
        job = client.upload("tiny", ("model.onnx", onnx_bytes), spec, evaluation=npz)
        done = client.wait(job["id"])

An answer of 400 or more raises :class:`LifecycleError` (the HTTP status and the
gateway's ``error``); every other answer is its JSON body.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any, cast

import httpx

TERMINAL = ("succeeded", "failed")
# a part of an upload: its content, or (file name, content); the name's suffix says the
# format (.onnx, .pt2, .pt; .npz, .npy or an archive)
Content = bytes | str | IO[bytes]
Part = Content | tuple[str, Content]
DEFAULT_NAMES = {"model": "model.onnx", "calibration": "calibration.npz",
                 "evaluation": "evaluation.npz"}
# an ONNX file larger than this holds its weights (a graph kept apart from them is kilobytes
# to a few megabytes): not parsed to find out
GRAPH_ALONE_BYTES = 64 << 20


class LifecycleError(RuntimeError):
    """The gateway refused a call: ``status`` (HTTP) and ``message`` (its ``error``)."""

    def __init__(self, status: int, message: Any) -> None:
        super().__init__(f"error {status}: {message}")
        self.status, self.message = status, message


class JobTimeout(TimeoutError):
    """A job did not reach the states waited for in time; ``job``: the last one seen."""

    def __init__(self, job: dict[str, Any], states: Collection[str], timeout_s: float) -> None:
        super().__init__(f"job {job.get('id')} not {'/'.join(states)} within {timeout_s:g} s: "
                         f"{json.dumps(job)[:2000]}")
        self.job = job


def answer(resp: httpx.Response) -> Any:
    """The JSON body of an answer (``{"error": text}`` when it is not JSON); raises
    :class:`LifecycleError` for a status of 400 or more."""
    try:
        body = resp.json()
    except ValueError:
        body = {"error": resp.text}
    if resp.status_code >= 400:
        raise LifecycleError(resp.status_code,
                             body.get("error") if isinstance(body, dict) else body)
    return body


def file_part(kind: str, part: Part | Path) -> tuple[str, Content]:
    """(file name, content) of an upload's part; a path is read (a model's as
    :func:`model_as_one_file` sends it), plain content gets the kind's usual name."""
    if isinstance(part, Path):
        inlined = model_as_one_file(part) if kind == "model" else None
        return part.name, part.read_bytes() if inlined is None else inlined
    if isinstance(part, tuple):
        return part
    return DEFAULT_NAMES[kind], part


def model_as_one_file(path: Path) -> bytes | None:
    """An ONNX model that keeps its weights in files beside it (as the converter publishes
    a large one: ``model.onnx`` and ``model.onnx.data``), as one file with its weights
    inlined: an upload's model is one file. None: ``path`` is one file already (or not an
    ONNX model; a file over :data:`GRAPH_ALONE_BYTES` is taken as one holding its weights,
    and sent as it is, streamed, without being read here). ValueError: its weights are
    missing, or more than one file takes (2 GB, protobuf's bound)."""
    if path.suffix != ".onnx" or path.stat().st_size > GRAPH_ALONE_BYTES:
        return None
    import onnx  # (only here: the CLI's other commands start without it)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # noqa: BLE001 - not an ONNX model: sent as it is, and the
        return None  # gateway's conversion says what it is
    if not any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
        return None
    try:
        onnx.load_external_data_for_model(model, str(path.parent))
        return model.SerializeToString()
    except Exception as exc:  # noqa: BLE001 - onnx's ValidationError, OSError, ValueError
        raise ValueError(f"{path} keeps its weights in files beside it, and cannot be sent "
                         f"as one file: {exc}") from None


class LifecycleClient:
    """The lifecycle calls of one gateway, as one token (``None``: no token)."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 60.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout,
                                 trust_env=False, transport=transport)

    def __enter__(self) -> LifecycleClient:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        return cast(dict[str, Any], answer(self.http.request(method, path, **kwargs)))

    # -- versions and jobs ------------------------------------------------------------

    def upload(self, name: str, model: Part | Path, spec: Mapping[str, Any] | bytes, *,
               evaluation: Part | Path | None = None, calibration: Part | Path | None = None,
               timeout: float = 600.0) -> dict[str, Any]:
        """Upload a version of ``name``: its job (converting in the gateway). ``spec``: the
        JSON spec, as data or as the file's bytes."""
        files: dict[str, tuple[str, Content]] = {"model": file_part("model", model)}
        files["spec"] = ("spec.json", spec if isinstance(spec, bytes) else json.dumps(spec))
        for kind, part in (("evaluation", evaluation), ("calibration", calibration)):
            if part is not None:
                files[kind] = file_part(kind, part)
        return self._call("POST", f"/v1/models/{name}/versions", files=files,
                          timeout=timeout)

    def job(self, job_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{job_id}")

    def wait(self, job_id: str, states: Collection[str] = TERMINAL,
             timeout_s: float | None = None, poll_s: float = 0.5,
             seen: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """The job once in one of ``states`` (by default until it ends), polled every
        ``poll_s``; ``seen`` is shown each poll. Raises :class:`JobTimeout` after
        ``timeout_s`` (None: waits as long as it takes)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            job = self.job(job_id)
            if seen is not None:
                seen(job)
            if job.get("state") in states:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise JobTimeout(job, states, timeout_s or 0.0)
            time.sleep(poll_s)

    def delete(self, name: str, version: int) -> dict[str, Any]:
        """Delete a version that is not serving."""
        return self._call("DELETE", f"/v1/models/{name}/versions/{version}")

    # -- models -----------------------------------------------------------------------

    def models(self) -> dict[str, Any]:
        """``{"models": [...]}``: every model the gateway manages."""
        return self._call("GET", "/v1/models")

    def model(self, name: str) -> dict[str, Any]:
        """One model: its versions and recent jobs."""
        return self._call("GET", f"/v1/models/{name}")

    def rollback(self, name: str, version: int | None = None,
                 timeout: float = 600.0) -> dict[str, Any]:
        """Serve the previous (or a given) version again; the model afterwards."""
        return self._call("POST", f"/v1/models/{name}/rollback",
                          json={"version": version}, timeout=timeout)

    def rollout(self, name: str) -> dict[str, Any]:
        """The model's progressive rollout: its steps, state and every verdict."""
        return self._call("GET", f"/v1/models/{name}/rollout")

    def rollout_action(self, name: str, action: str) -> dict[str, Any]:
        """``pause``, ``resume`` or ``abort`` the model's rollout (admin scope)."""
        return self._call("POST", f"/v1/models/{name}/rollout/{action}")

    # -- residency --------------------------------------------------------------------

    def residency(self, model: str | None = None) -> dict[str, Any]:
        """Where models live in pools with residency: ``GET /v1/residency`` (``enabled``,
        ``pools`` with each member's models and memory, ``models``), or one model's entry
        (``GET /v1/residency/{model}``: pool, footprint and its source, demand, members,
        waiting requests)."""
        if model is None:
            return self._call("GET", "/v1/residency")
        return self._call("GET", f"/v1/residency/{model}")
