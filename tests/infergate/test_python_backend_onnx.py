"""The generic ONNX Runtime model batches concurrent requests and splits results back."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient
from google.protobuf import text_format
from tritonclient.grpc import service_pb2

from converters.samples import INPUT_NAME, OUTPUT_NAME, SAMPLE_MODEL_NAME
from converters.tiny import TINY_MODEL_NAME, TINY_WIDTH
from converters.triton_config import parse_model_config
from infergate.triton.local import LocalTriton
from tests.conftest import triton_settings
from tests.procs import started_triton, wait_until

pytestmark = pytest.mark.integration


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
