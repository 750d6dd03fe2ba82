"""A tiny ONNX model (``y = 2x + 1`` over FP32 ``[batch, 16]``) served on the same CPU
path as real models. Where per-request overhead dominates (gateway benchmarks, overload
and failover tests), it shows the gateway's cost rather than the model's."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from converters.model_dir import (
    ModelArtifact,
    ModelDirectoryRequest,
    WrittenModel,
    sha256_file,
    write_model_directory,
)
from converters.repository import existing_versions
from converters.triton_config import DynamicBatching, ModelConfigSpec, TensorSpec

TINY_MODEL_NAME = "tiny"
TINY_WIDTH = 16


def tiny_onnx(path: Path, work: int = 0) -> Path:
    """``y = 2x + 1``; ``work`` > 0 adds a ``work`` x ``work`` matrix product computed
    from the input and multiplied by zero (the same answer, a service time of its own:
    about 2 * work**3 floating-point operations per batch, which ONNX Runtime cannot
    fold away since it depends on the input)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", TINY_WIDTH])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", TINY_WIDTH])
    two = helper.make_tensor("two", TensorProto.FLOAT, [1], [2.0])
    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    nodes = [helper.make_node("Mul", ["x", "two"], ["x2"])]
    initializers = [two, one]
    if work > 0:
        initializers += [helper.make_tensor("square", TensorProto.INT64, [2], [work, work]),
                         helper.make_tensor("zero", TensorProto.FLOAT, [1], [0.0])]
        nodes += [helper.make_node("ReduceMean", ["x"], ["level"]),
                  helper.make_node("Expand", ["level", "square"], ["m"]),
                  helper.make_node("MatMul", ["m", "m"], ["p"]),
                  helper.make_node("ReduceMean", ["p"], ["pm"]),
                  helper.make_node("Mul", ["pm", "zero"], ["nothing"]),
                  helper.make_node("Add", ["x2", "nothing"], ["x2w"])]
    nodes.append(helper.make_node("Add", ["x2w" if work > 0 else "x2", "one"], ["y"]))
    graph = helper.make_graph(nodes, "tiny", [x], [y], initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def tiny_config(name: str = TINY_MODEL_NAME, max_queue_delay_us: int = 0,
                instance_count: int = 1, queue_timeout_us: int = 0,
                priority_levels: int = 0) -> ModelConfigSpec:
    """``queue_timeout_us`` > 0: Triton's queue drops what waited that long (and a
    request's own shorter ``timeout``); ``priority_levels`` > 0: Triton's own levels (the
    last one the default)."""
    return ModelConfigSpec(
        name=name,
        target="cpu",
        max_batch_size=64,
        inputs=(TensorSpec("x", "FP32", (TINY_WIDTH,)),),
        outputs=(TensorSpec("y", "FP32", (TINY_WIDTH,)),),
        dynamic_batching=DynamicBatching(max_queue_delay_us=max_queue_delay_us,
                                         default_timeout_us=queue_timeout_us,
                                         priority_levels=priority_levels),
        instance_count=instance_count,
        parameters={"intra_op_threads": "1"},
    )


def build_tiny_model(repo: Path, name: str = TINY_MODEL_NAME, work: int = 0,
                     **config: int) -> WrittenModel | None:
    """``config``: :func:`tiny_config`'s (queue delay, instances, queue timeout);
    ``work``: :func:`tiny_onnx`'s."""
    if existing_versions(repo, name):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        path = tiny_onnx(Path(tmp) / "model.onnx", work)
        sample = np.linspace(-1, 1, TINY_WIDTH, dtype=np.float32)[None]
        return write_model_directory(
            ModelDirectoryRequest(
                repo=repo,
                config=tiny_config(name, **config),
                artifact=ModelArtifact({"model.onnx": path}, sha256_file(path)),
                warmup_inputs={1: {"x": sample}},
                metadata={"precision": "fp32", "source": "converters/tiny.py"},
            )
        )
