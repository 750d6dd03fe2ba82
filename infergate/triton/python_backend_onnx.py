"""Generic ONNX Runtime model for Triton's Python backend.

Copied as ``<model>/<version>/model.py`` next to ``model.onnx`` by the converter, so each
version carries the exact runtime code it was verified with. A large model's weights are
in ``model.onnx.data`` beside it (``converters.model_dir.write_onnx``): the session, opened
by the model's path, maps them. Runs inside the Triton
Python-backend stub (numpy<2, onnxruntime); it must not import anything from infergate.

- Input/output names and dtypes come from the model config (config.pbtxt).
- A dynamic batch (several requests) is executed in one ONNX Runtime call: requests whose
  non-batch shapes agree are concatenated along axis 0, run once, and split back.
- A client's mistake is answered ``INVALID_ARG`` (400 / ``INVALID_ARGUMENT``), never
  Triton's default ``INTERNAL``: a tensor whose rank is not the config's, a batch of no
  rows (Triton 2.51 passes ``[0, 16]`` with a one-row body on: it sizes a zero batch as
  one row), and whatever ONNX Runtime itself calls an invalid argument.
- Config parameters: ``intra_op_threads`` (0 = ONNX Runtime's default),
  ``onnx_model_filename`` (default ``model.onnx``), ``disabled_optimizers``
  (comma-separated ONNX Runtime graph optimizers to turn off; the converter sets
  ``WeightBiasQuantization`` for mixed-precision INT8 models, whose float layers that
  pass would otherwise re-quantize); ``load_nice`` (0-19, default 10): how far below
  inference the model's load runs on the CPU (:func:`_built_apart`);
  ``spin_between_runs`` (default ``0``): ONNX Runtime's intra-op threads spin for work
  while a run lasts and stop once it ends. ``1`` keeps ONNX Runtime's own default, where
  they spin on after every run (about 40 ms of a core on this project's host, whatever
  the model: three times an EfficientNet-Lite0 request's own CPU, taken from every other
  model and process on the member's cores) for a next request that would otherwise
  wake them (:func:`_session`).
- A stub its member started below the server's CPU priority (``INFERGATE_STUB_NICE``,
  ``infergate/triton/local.py``: its start and imports then run below inference too)
  raises its threads back to the server's once the model is built (:func:`_serve_at`).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils
from onnxruntime.capi import _pybind_state as ort_state

# the default of the load_nice parameter (0: the load runs at inference's priority)
LOAD_NICE = 10


def _param(config: dict[str, Any], key: str, default: str) -> str:
    value = config.get("parameters", {}).get(key, {}).get("string_value")
    return value if value not in (None, "") else default


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        # Not default_model_filename: Triton fills that with "model.py" for this backend.
        filename = _param(config, "onnx_model_filename", "model.onnx")
        nice = min(max(int(_param(config, "load_nice", str(LOAD_NICE))), 0), 19)
        # inference runs at the server's priority; a member may have started this stub
        # below it (its start, imports and this build are the load's)
        serving = _server_priority()
        disabled = [o.strip() for o in _param(config, "disabled_optimizers", "").split(",")]
        self.session = _session(os.path.join(version_dir, filename), _options(config),
                                {o for o in disabled if o}, serving + nice if nice else None)
        self.batched = int(config.get("max_batch_size", 0)) > 0
        self.inputs = [
            (i["name"], pb_utils.triton_string_to_numpy(i["data_type"])) for i in config["input"]
        ]
        # rank each input must have (the batch dimension counted when batching)
        self.ranks = {i["name"]: len(i.get("dims", [])) + self.batched for i in config["input"]}
        self.outputs = [
            (o["name"], pb_utils.triton_string_to_numpy(o["data_type"])) for o in config["output"]
        ]
        session_inputs = {i.name for i in self.session.inputs_meta}
        missing = [name for name, _ in self.inputs if name not in session_inputs]
        if missing:
            raise pb_utils.TritonModelException(
                f"config inputs {missing} are not inputs of {filename} "
                f"(model has {sorted(session_inputs)})"
            )
        _serve_at(serving)

    def execute(self, requests: list[Any]) -> list[Any]:
        responses: list[Any] = [None] * len(requests)
        groups: dict[tuple[Any, ...], list[tuple[int, dict[str, np.ndarray]]]] = defaultdict(list)
        for index, request in enumerate(requests):
            feeds, declared = {}, {}
            for name, dtype in self.inputs:
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                feeds[name] = tensor.as_numpy().astype(dtype, copy=False)
                declared[name] = [int(d) for d in tensor.shape()]
            mistake = self._mistake(feeds, declared)
            if mistake:
                responses[index] = _invalid(mistake)
                continue
            key = tuple((n, a.shape[1:] if self.batched else a.shape) for n, a in feeds.items())
            groups[key if self.batched else (index,)].append((index, feeds))
        for members in groups.values():
            self._run_group(members, responses)
        return responses

    def _mistake(self, feeds: dict[str, np.ndarray], declared: dict[str, list[int]]) -> str:
        """What is wrong with one request's tensors ('' when nothing is)."""
        for name, array in feeds.items():
            shape, rank = declared[name], self.ranks[name]
            if self.batched and shape[:1] == [0]:
                return (f"input '{name}' has shape {shape}: a batch of 0 rows; send at "
                        "least one")
            if len(shape) != rank or array.ndim != rank:
                # Triton 2.51 passes a request shaped [0, ...] (with one row's bytes) on
                # without its batch dimension
                hint = (" (batch dimension first): a batch dimension of 0 arrives so; "
                        "send at least one row" if self.batched and len(shape) == rank - 1
                        else "")
                return (f"input '{name}' arrived with shape {shape}; the model takes rank "
                        f"{rank}{hint}")
        return ""

    def _run_group(
        self, members: list[tuple[int, dict[str, np.ndarray]]], responses: list[Any]
    ) -> None:
        names = [name for name, _ in self.inputs]
        if len(members) == 1:
            feeds = members[0][1]
        else:
            feeds = {n: np.concatenate([m[1][n] for m in members], axis=0) for n in names}
        try:
            results = self.session.run([name for name, _ in self.outputs], feeds, None)
        except Exception as exc:  # noqa: BLE001 - reported to the client, not raised
            invalid = type(exc).__name__ == "InvalidArgument"  # onnxruntime's own verdict
            for index, _ in members:
                responses[index] = (_invalid(f"onnxruntime: {exc}") if invalid else
                                    pb_utils.InferenceResponse(
                                        output_tensors=[],
                                        error=pb_utils.TritonError(f"onnxruntime: {exc}")))
            return
        offset = 0
        for index, feeds_one in members:
            size = next(iter(feeds_one.values())).shape[0] if self.batched else 0
            tensors = []
            for (name, dtype), value in zip(self.outputs, results, strict=True):
                part = value[offset : offset + size] if self.batched else value
                tensors.append(pb_utils.Tensor(name, np.ascontiguousarray(part, dtype=dtype)))
            offset += size
            responses[index] = pb_utils.InferenceResponse(output_tensors=tensors)

    def finalize(self) -> None:
        self.session = None


def _options(config: dict[str, Any]) -> ort.SessionOptions:
    """The session's options from the model's config parameters: ``intra_op_threads`` in
    a pool of the session's own (one stub, one instance, one session), one inter-op
    thread, and whether that pool spins on between runs (``spin_between_runs``)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = int(_param(config, "intra_op_threads", "0"))
    options.inter_op_num_threads = 1
    if _param(config, "spin_between_runs", "0") != "1":
        # honoured by a session's own pools only (a process's global pool ignores it)
        options.add_session_config_entry("session.force_spinning_stop", "1")
    return options


def _session(path: str, options: ort.SessionOptions, disabled_optimizers: set[str],
             nice: int | None) -> Any:
    """ONNX Runtime's session of the model at ``path``, built (its graph optimized, its
    weights packed: nearly all of the session's cost) at ``nice`` (:func:`_built_apart`)
    and made here.

    Made here because the session's own thread pool is made with it, by the thread that
    makes it, and inherits that thread's CPU priority: made on the lowered build thread,
    the threads inference runs on would be below inference, where only a privilege could
    bring them back. So the session is made (its pool and the model's graph read, a few
    milliseconds) on this thread, and only ``initialize_session`` runs apart: the two
    steps ``onnxruntime.InferenceSession`` takes in one, through the same binding (this
    runtime's onnxruntime is pinned, ``infergate/triton/runtime-requirements.txt``)."""
    session = ort_state.InferenceSession(options, path, True, False)
    _built_apart(nice, lambda: session.initialize_session(
        ["CPUExecutionProvider"], [{}], disabled_optimizers))
    return session


def _server_priority() -> int:
    """The nice value inference runs at: where the member started this stub below the
    server (``INFERGATE_STUB_NICE`` in its environment), the server's (its parent's);
    else this thread's own."""
    if os.environ.get("INFERGATE_STUB_NICE"):
        with contextlib.suppress(OSError):
            return os.getpriority(os.PRIO_PROCESS, os.getppid())
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


# A member starts a stub below the server (infergate/triton/stub_nice.sh) only for a
# model.py that names INFERGATE_STUB_NICE, as this one does: one that would not bring its
# threads back to the server's priority would serve below it.
def _serve_at(serving: int) -> None:
    """Every thread of this stub whose nice value is above ``serving`` brought down to it:
    a stub started below the server (``INFERGATE_STUB_NICE``) serves at the server's
    priority. Lowering a nice value needs CAP_SYS_NICE, which the member checked before
    it started the stub low; where it is refused all the same the stub serves where it
    is, and says so in Triton's log."""
    refused = []
    for tid in os.listdir("/proc/self/task"):
        try:
            if os.getpriority(os.PRIO_PROCESS, int(tid)) > serving:
                os.setpriority(os.PRIO_PROCESS, int(tid), serving)
        except OSError as exc:  # a thread that ended meanwhile, or refused
            if not isinstance(exc, ProcessLookupError):
                refused.append(f"{tid}: {exc}")
    if refused:
        pb_utils.Logger.log_warn(
            f"this stub's threads could not be raised to the server's CPU priority "
            f"({serving}); they serve below it: {'; '.join(refused)}")


def _built_apart(nice: int | None, build: Callable[[], Any]) -> Any:
    """What ``build`` returns, built on a thread of its own whose CPU nice value is
    ``nice`` (None: built here), or this thread's where that is higher (the stub started
    below the server).

    A load's CPU is mostly ONNX Runtime reading the model and packing its weights (about
    0.3 CPU-s of a 100 MB MLP's 0.5). On a member whose cores also serve inference, a
    load at the same priority takes a core from the models already serving: their
    requests wait behind it. On Linux a thread's nice value is its own, and raising it
    needs no privilege (lowering it again would), so the build gets a thread that is
    dropped afterwards, and this stub's main thread, which runs ``execute``, keeps its
    priority. Where the cores are idle a nice value changes nothing; where inference
    wants them, the load takes what inference leaves."""
    if nice is None:
        return build()
    built: dict[str, Any] = {}

    def run() -> None:
        try:
            try:
                me = threading.get_native_id()  # (its nice value the caller's)
                os.setpriority(os.PRIO_PROCESS, me,
                               min(max(os.getpriority(os.PRIO_PROCESS, me), nice), 19))
            except OSError:  # refused (a seccomp profile, say): built at this priority
                pass
            built["value"] = build()
        except BaseException as exc:  # noqa: BLE001 - raised again on the caller's thread
            built["error"] = exc

    thread = threading.Thread(target=run, name="infergate-load")
    thread.start()
    thread.join()
    if "error" in built:
        raise built["error"]
    return built["value"]


def _invalid(message: str) -> Any:
    """A client's mistake: Triton answers it 400 / INVALID_ARGUMENT."""
    return pb_utils.InferenceResponse(
        output_tensors=[], error=pb_utils.TritonError(message, pb_utils.TritonError.INVALID_ARG))
