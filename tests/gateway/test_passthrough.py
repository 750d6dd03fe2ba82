"""Through the gateway, tritonclient gets exactly what Triton and ONNX Runtime give."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from converters.samples import INPUT_NAME, OUTPUT_NAME, SAMPLE_MODEL_NAME, cat_input
from infergate.triton.local import LocalTriton
from tests.procs import GatewayProcess

pytestmark = pytest.mark.integration
CATS = range(281, 286)


def infer_http(url: str, x: np.ndarray, binary: bool = True) -> np.ndarray:
    client = httpclient.InferenceServerClient(url)
    try:
        inp = httpclient.InferInput(INPUT_NAME, list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=binary)
        out = httpclient.InferRequestedOutput(OUTPUT_NAME, binary_data=binary)
        return client.infer(SAMPLE_MODEL_NAME, [inp], outputs=[out]).as_numpy(OUTPUT_NAME)
    finally:
        client.close()


def infer_grpc(url: str, x: np.ndarray) -> np.ndarray:
    client = grpcclient.InferenceServerClient(url)
    try:
        inp = grpcclient.InferInput(INPUT_NAME, list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        return client.infer(SAMPLE_MODEL_NAME, [inp]).as_numpy(OUTPUT_NAME)
    finally:
        client.close()


def onnxruntime_reference(repo: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(
        str(repo / SAMPLE_MODEL_NAME / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    return session.run([OUTPUT_NAME], {INPUT_NAME: x})[0]


@pytest.fixture(scope="module")
def batch() -> np.ndarray:
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 0.5, size=(3, 3, 224, 224)).astype(np.float32)
    return np.concatenate([cat_input(), noise], axis=0)


def test_gateway_http_matches_triton_and_onnxruntime_when_binary_tensors(
    gateway: GatewayProcess, triton: LocalTriton, sample_repo: Path, batch: np.ndarray
) -> None:
    assert triton.endpoints is not None
    via_gateway = infer_http(gateway.http_url, batch)
    direct = infer_http(triton.endpoints.http_url, batch)
    np.testing.assert_array_equal(via_gateway, direct)
    np.testing.assert_allclose(via_gateway, onnxruntime_reference(sample_repo, batch),
                               rtol=1e-4, atol=1e-4)


def test_gateway_http_matches_triton_when_json_tensors(
    gateway: GatewayProcess, triton: LocalTriton, batch: np.ndarray
) -> None:
    assert triton.endpoints is not None
    x = batch[:1]
    np.testing.assert_array_equal(
        infer_http(gateway.http_url, x, binary=False),
        infer_http(triton.endpoints.http_url, x, binary=False),
    )


def test_gateway_grpc_matches_triton_and_onnxruntime(
    gateway: GatewayProcess, triton: LocalTriton, sample_repo: Path, batch: np.ndarray
) -> None:
    assert triton.endpoints is not None
    via_gateway = infer_grpc(gateway.grpc_url, batch)
    np.testing.assert_array_equal(via_gateway, infer_grpc(triton.endpoints.grpc_url, batch))
    np.testing.assert_allclose(via_gateway, onnxruntime_reference(sample_repo, batch),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_gateway_classifies_bundled_cat_photo_as_cat(
    gateway: GatewayProcess, protocol: str
) -> None:
    x = cat_input()
    logits = infer_http(gateway.http_url, x) if protocol == "http" else infer_grpc(
        gateway.grpc_url, x
    )
    assert int(logits[0].argmax()) in CATS
    # the top-3 are all cat classes: a real classification, not a lucky argmax
    assert set(np.argsort(logits[0])[-3:].tolist()) <= set(CATS)


def test_cat_photo_is_bundled_not_downloaded() -> None:
    import skimage

    from converters.images import sample_photo

    path = sample_photo("chelsea")
    assert Path(skimage.__file__).parent in path.parents
    assert path.stat().st_size > 10_000
