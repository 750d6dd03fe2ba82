"""The generic ONNX Runtime model batches concurrent requests and splits results back."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import httpx
import numpy as np
import onnxruntime as ort
import psutil
import pytest
import tritonclient.http as httpclient
from google.protobuf import text_format
from tritonclient.grpc import service_pb2

from converters.model_dir import PYTHON_BACKEND_MODEL
from converters.samples import INPUT_NAME, OUTPUT_NAME, SAMPLE_MODEL_NAME
from converters.tiny import TINY_MODEL_NAME, TINY_WIDTH
from converters.triton_config import parse_model_config
from infergate.triton.local import (
    STUB_NICE,
    LocalTriton,
    locate_tritonserver,
    may_raise_priority,
)
from tests.conftest import RUNTIME_ENV, triton_settings
from tests.procs import started_triton, wait_until

pytestmark = pytest.mark.integration


def _nice(thread_id: int = 0) -> int:
    """A thread's nice value (Linux keeps one per thread; 0: the calling thread's)."""
    return os.getpriority(os.PRIO_PROCESS, thread_id or threading.get_native_id())


@pytest.fixture(scope="module")
def model_py() -> Iterator[ModuleType]:
    """The model as the stub imports it, beside Triton's own (pure Python)
    ``triton_python_backend_utils`` from the runtime's wheel."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(locate_tritonserver(RUNTIME_ENV)[1] / "python"))
        spec = importlib.util.spec_from_file_location("infergate_model_py",
                                                      PYTHON_BACKEND_MODEL)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
        sys.modules.pop("triton_python_backend_utils", None)


def test_load_is_built_on_a_thread_of_its_own_at_lower_priority(model_py: ModuleType) -> None:
    mine = _nice()
    seen = model_py._built_apart(mine + 5, lambda: (threading.get_native_id(), _nice()))
    assert seen[0] != threading.get_native_id()
    assert seen[1] == min(mine + 5, 19)
    assert _nice() == mine  # the caller (the stub's main thread, which serves) keeps its own
    # nothing to lower: built on the caller's thread
    assert model_py._built_apart(None, threading.get_native_id) == threading.get_native_id()
    # where the stub already runs lowered (a thread of this test): the lower of the two
    seen_there: list[tuple[int, int, int]] = []

    def lowered_caller() -> None:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), min(mine + 3, 19))
        seen_there.append((_nice(), model_py._built_apart(mine + 5, _nice),
                           model_py._built_apart(mine + 1, _nice)))

    caller = threading.Thread(target=lowered_caller)
    caller.start()
    caller.join()
    assert seen_there == [(min(mine + 3, 19), min(mine + 5, 19), min(mine + 3, 19))]


def test_threads_stop_spinning_once_a_run_ends_unless_the_config_asks(
        model_py: ModuleType) -> None:
    """ONNX Runtime's intra-op threads spin on after every run by default (about 40 ms of
    a core here, whatever the model); the model's session stops them once a run ends,
    and keeps ONNX Runtime's default only for ``spin_between_runs`` 1. Its threads are
    its own pool's (a process's global pool would ignore the setting)."""
    def options(**params: str) -> ort.SessionOptions:
        return model_py._options(
            {"parameters": {k: {"string_value": v} for k, v in params.items()}})

    stopped = options(intra_op_threads="2")
    assert stopped.get_session_config_entry("session.force_spinning_stop") == "1"
    assert stopped.intra_op_num_threads == 2 and stopped.inter_op_num_threads == 1
    assert stopped.use_per_session_threads
    assert options(spin_between_runs="0").get_session_config_entry(
        "session.force_spinning_stop") == "1"
    spinning = options(spin_between_runs="1")
    with pytest.raises(RuntimeError, match="does not have configuration"):
        spinning.get_session_config_entry("session.force_spinning_stop")
    assert spinning.intra_op_num_threads == 0


def test_the_sessions_threads_are_made_at_the_callers_priority_though_built_below(
        model_py: ModuleType, tmp_path: Path) -> None:
    """The session's pool is made by the thread that makes the session: ``_session``
    makes it on the caller's thread (the stub's main one, which serves) and builds it
    (optimizing, packing weights) on a lowered one, so the threads inference runs on
    keep the caller's priority without a privilege to bring them back."""
    from converters.tiny import tiny_onnx

    mine = _nice()
    path = tiny_onnx(tmp_path / "tiny.onnx")
    options = model_py._options({"parameters": {"intra_op_threads": {"string_value": "3"}}})
    before = set(os.listdir("/proc/self/task"))
    built_at: list[int] = []
    initialize = model_py._built_apart

    def watched(nice: int | None, build: Any) -> Any:
        return initialize(nice, lambda: (built_at.append(_nice()), build())[1])

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(model_py, "_built_apart", watched)
        session = model_py._session(str(path), options, set(), min(mine + 5, 19))
    assert built_at == [min(mine + 5, 19)]

    def made() -> dict[int, int]:  # the threads made since, by id: their nice values
        out = {}
        for tid in set(os.listdir("/proc/self/task")) - before:
            with contextlib.suppress(OSError):  # gone meanwhile
                out[int(tid)] = _nice(int(tid))
        return out

    # the lowered build thread, joined, may still be leaving /proc for a moment (a full
    # suite once found it there); the pool's threads stay, at the caller's priority
    assert wait_until(lambda: set(made().values()) == {mine}, 10), made()
    # the pool's two workers (the caller is its third), and whatever else ONNX Runtime
    # starts with a process's first session
    assert len(made()) >= 2, made()
    x = np.ones((2, TINY_WIDTH), np.float32)
    (y,) = session.run(["y"], {"x": x}, None)
    assert y.shape[0] == 2


def test_a_stub_started_below_the_server_serves_at_the_servers_priority(
        model_py: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """``_serve_at`` brings every thread above the server's nice value down to it (the
    stub's threads started below it: ``stub_nice.sh``), and leaves the others; the
    server's is its parent's where the member started it low, else its own."""
    mine = _nice()
    monkeypatch.delenv("INFERGATE_STUB_NICE", raising=False)
    assert model_py._server_priority() == mine
    monkeypatch.setenv("INFERGATE_STUB_NICE", "10")
    assert model_py._server_priority() == os.getpriority(os.PRIO_PROCESS, os.getppid())
    if not may_raise_priority():
        pytest.skip("lowering a nice value needs CAP_SYS_NICE, which this test lacks")
    lowered, release, seen = threading.Event(), threading.Event(), []

    def low() -> None:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), min(mine + 7, 19))
        lowered.set()
        release.wait(10)
        seen.append(_nice())

    thread = threading.Thread(target=low)
    thread.start()
    assert lowered.wait(10)
    model_py._serve_at(mine)
    release.set()
    thread.join()
    assert seen == [mine] and _nice() == mine


def test_load_error_raised_on_the_callers_thread(model_py: ModuleType) -> None:
    def fail() -> None:
        raise ValueError("model.onnx is not a model")

    with pytest.raises(ValueError, match="not a model"):
        model_py._built_apart(5, fail)


def test_stubs_serve_at_their_own_priority_after_a_lowered_load(triton: LocalTriton) -> None:
    """Every thread of every stub (ONNX Runtime's pool of the sample, which takes the
    default thread count, too) is at the server's priority once loaded: the thread that
    built the session was lowered, and is gone; the stub, started below the server
    where this host allows it back (``stub_nice.sh``), was brought back."""
    assert triton.pid is not None
    server = psutil.Process(triton.pid)
    stubs = [c for c in server.children()
             if "triton_python_backend_stub" in " ".join(c.cmdline())]
    assert len(stubs) >= 2
    threads = [t.id for stub in stubs for t in stub.threads()]
    assert threads and {_nice(t) for t in threads} == {_nice(triton.pid)}


def test_a_stub_starts_below_its_server_and_serves_at_its_priority(
        sample_repo: Path, tmp_path: Path) -> None:
    """A model loaded on a member whose stubs start below it (``stub_nice.sh``): while
    it loads, its stub's main thread is seen at ``STUB_NICE`` below the server; once
    loaded, every thread of it is back at the server's."""
    if not may_raise_priority():
        pytest.skip("lowering a nice value needs CAP_SYS_NICE, which this test lacks")
    with started_triton(triton_settings(sample_repo, tmp_path)) as server:
        assert server.pid is not None and server.endpoints is not None
        seen: set[int] = set()
        loaded = threading.Event()

        def watch() -> None:
            while not loaded.is_set():
                for child in psutil.Process(server.pid).children():
                    with contextlib.suppress(psutil.Error, OSError):
                        if "triton_python_backend_stub" in " ".join(child.cmdline()):
                            seen.add(_nice(child.pid))
                loaded.wait(0.005)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            answer = httpx.post(f"http://{server.endpoints.http_url}/v2/repository/models/"
                                f"{TINY_MODEL_NAME}/load", timeout=120)
        finally:
            loaded.set()
            watcher.join()
        assert answer.status_code == 200, answer.text
        base = _nice(server.pid)
        assert min(base + STUB_NICE, 19) in seen, seen
        stub = next(c for c in psutil.Process(server.pid).children()
                    if "triton_python_backend_stub" in " ".join(c.cmdline()))
        assert {_nice(t.id) for t in stub.threads()} == {base}


def _stats(client: httpclient.InferenceServerClient) -> tuple[int, int]:
    stats = client.get_inference_statistics(SAMPLE_MODEL_NAME)["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"])


@pytest.fixture(scope="module")
def own_triton(sample_repo: Path, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[LocalTriton]:
    """A Triton of its own: the statistics below must count this test's requests only.

    Its copy of the sample model waits up to 2 s to fill a batch (the sample's own 2 ms
    is shorter than the gap between two requests on a loaded machine), so concurrent
    requests are merged however slowly they arrive."""
    tmp = tmp_path_factory.mktemp("batching")
    repo = tmp / "model_repo"
    shutil.copytree(sample_repo / SAMPLE_MODEL_NAME, repo / SAMPLE_MODEL_NAME)
    config_path = repo / SAMPLE_MODEL_NAME / "config.pbtxt"
    config = parse_model_config(config_path.read_text())
    config.dynamic_batching.max_queue_delay_microseconds = 2_000_000
    config_path.write_text(text_format.MessageToString(config))
    with started_triton(triton_settings(repo, tmp, SAMPLE_MODEL_NAME)) as server:
        yield server


def test_python_backend_splits_dynamic_batch_per_request_when_requests_concurrent(
    own_triton: LocalTriton, sample_repo: Path
) -> None:
    triton = own_triton
    assert triton.endpoints is not None
    rng = np.random.default_rng(1)
    # different batch sizes per request, so a wrong split shows up as a shape/value error
    inputs = [rng.normal(size=(1 + i % 3, 3, 224, 224)).astype(np.float32) for i in range(12)]
    session = ort.InferenceSession(
        str(sample_repo / SAMPLE_MODEL_NAME / "1" / "model.onnx"),
        providers=["CPUExecutionProvider"],
    )
    expected = [session.run([OUTPUT_NAME], {INPUT_NAME: x})[0] for x in inputs]
    client = httpclient.InferenceServerClient(triton.endpoints.http_url, concurrency=12)
    before = _stats(client)

    def send(x: np.ndarray) -> httpclient.InferAsyncRequest:
        inp = httpclient.InferInput(INPUT_NAME, list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        return client.async_infer(SAMPLE_MODEL_NAME, [inp])

    pending = [send(x) for x in inputs]  # all in flight at once (gevent pool of 12)
    results = [p.get_result().as_numpy(OUTPUT_NAME) for p in pending]
    sent = sum(x.shape[0] for x in inputs)
    # Triton updates its statistics just after answering: let the last ones land
    wait_until(lambda: _stats(client)[0] - before[0] >= sent, 10)
    after = _stats(client)
    client.close()
    for got, want in zip(results, expected, strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    inferences, executions = after[0] - before[0], after[1] - before[1]
    assert inferences == sent
    # the dynamic batcher merged requests: fewer model executions than requests
    assert executions < len(inputs)


def test_zero_row_batch_is_the_clients_mistake_when_triton_passes_it_on(
        triton: LocalTriton) -> None:
    """Triton 2.51 sizes a ``[0, 16]`` tensor as one row and hands the model a rank-1
    tensor; ONNX Runtime's refusal used to come back as INTERNAL."""
    assert triton.endpoints is not None
    request = service_pb2.ModelInferRequest(model_name=TINY_MODEL_NAME)
    request.inputs.add(name="x", datatype="FP32", shape=[0, TINY_WIDTH])
    request.raw_input_contents.append(np.ones(TINY_WIDTH, np.float32).tobytes())
    with grpc.insecure_channel(triton.endpoints.grpc_url) as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as info:
            infer(request.SerializeToString(), timeout=30)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "batch dimension of 0" in (info.value.details() or "")
        request.inputs[0].shape[0] = 1  # the same bytes as one row: served
        answer = service_pb2.ModelInferResponse.FromString(
            infer(request.SerializeToString(), timeout=30))
    assert np.allclose(np.frombuffer(answer.raw_output_contents[0], np.float32), 3.0)
