"""The converted directories load in our real Triton (Python backend + ONNX Runtime, the
runtime venv) and answer exactly what ONNX Runtime answers for the same model file."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient

from converters.datasets import load_samples
from converters.images import EFFICIENTNET_LITE
from converters.spec import parse_input_spec
from converters.triton_config import parse_model_config
from tests.conftest import triton_settings
from tests.converters.conftest import Conversion
from tests.procs import started_triton

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _session(model_dir: Path, version: int) -> ort.InferenceSession:
    """ONNX Runtime opened as the served config says (disabled optimizers included)."""
    config = parse_model_config((model_dir / "config.pbtxt").read_text())
    disabled = config.parameters["disabled_optimizers"].string_value if \
        "disabled_optimizers" in config.parameters else ""
    return ort.InferenceSession(str(model_dir / str(version) / "model.onnx"),
                                providers=["CPUExecutionProvider"],
                                disabled_optimizers=[d for d in disabled.split(",") if d] or None)


def _infer(client: httpclient.InferenceServerClient, model: str, feeds: dict[str, np.ndarray],
           output: str) -> np.ndarray:
    inputs = []
    for name, array in feeds.items():
        tensor = httpclient.InferInput(name, list(array.shape),
                                       "FP32" if array.dtype == np.float32 else "INT64")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return client.infer(model, inputs).as_numpy(output)


def test_converted_models_answer_like_onnxruntime_when_served_by_triton(
        effnet_conversion: Conversion, minilm_conversion: Conversion,
        photo_sets: tuple[Path, Path], token_sets: tuple[Path, Path], tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    for conversion in (effnet_conversion, minilm_conversion):
        shutil.copytree(conversion.result.path, repo / conversion.result.name)
    effnet, minilm = effnet_conversion.result, minilm_conversion.result
    for result in (effnet, minilm):  # their weights beside the graph: the stub maps them
        assert (repo / result.name / str(result.version) / "model.onnx.data").is_file()
    images = load_samples(photo_sets[1], parse_input_spec("input:float32[batch,3,224,224]"),
                          "evaluation", EFFICIENTNET_LITE)
    tokens = load_samples(token_sets[1], parse_input_spec(
        "input_ids:int64[batch,sequence];attention_mask:int64[batch,sequence]"), "evaluation")
    with started_triton(triton_settings(repo, tmp_path, effnet.name, minilm.name)) as server:
        assert server.endpoints is not None
        client = httpclient.InferenceServerClient(server.endpoints.http_url)
        served = client.get_model_config(effnet.name)
        assert served["max_batch_size"] == 2 and "dynamic_batching" in served
        reference = _session(repo / effnet.name, effnet.version)
        for batch in list(images.batches(2))[:3]:
            got = _infer(client, effnet.name, batch, "logits")
            want = reference.run(["logits"], batch)[0]
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
            assert (got.argmax(1) == want.argmax(1)).all()
        reference = _session(repo / minilm.name, minilm.version)
        lengths = set()
        for batch in tokens.batches(2):
            got = _infer(client, minilm.name, batch, "embedding")
            want = reference.run(["embedding"], batch)[0]
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
            lengths.add(batch["input_ids"].shape[1])
        assert lengths == {24, 40}  # two sequence lengths through one served model
        client.close()
