"""Typed description of a Triton model configuration, rendered with Triton's own protobuf.

The message type is ``inference.ModelConfig`` from ``tritonclient.grpc.model_config_pb2``
and the text is produced by protobuf's ``text_format``: what we write is exactly what
Triton parses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

Target = Literal["cpu", "onnxruntime", "tensorrt"]

# numpy dtype name -> Triton data type name (without the TYPE_ prefix)
NUMPY_TO_TRITON = {
    "float32": "FP32",
    "float16": "FP16",
    "float64": "FP64",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "uint8": "UINT8",
    "bool": "BOOL",
}


@dataclass(frozen=True)
class TensorSpec:
    """One input or output. ``dims`` excludes the batch dimension; -1 is dynamic."""

    name: str
    datatype: str  # Triton name: FP32, INT64, ...
    dims: tuple[int, ...]


@dataclass(frozen=True)
class DynamicBatching:
    """Triton's ``dynamic_batching``. With ``default_timeout_us`` the queue policy drops
    what waited that long (``timeout_action: REJECT``: Triton answers "Request timeout
    expired", the gateway 504 / DEADLINE_EXCEEDED), or sooner when a request's own
    ``timeout`` says so (Triton takes it only when it is shorter than a non-zero default).

    Off unless asked (:meth:`for_slo`): a non-zero default timeout makes Triton's dynamic
    batcher lose throughput under deep queues until the model is reloaded
    (triton-inference-server/server#8870, open; measured here on 2.51: 1,097 then 402
    requests/s at 64 in flight against 2,211 and 2,504 without a policy)."""

    max_queue_delay_us: int = 0
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_size: int = 0
    priority_levels: int = 0
    default_priority_level: int = 0
    default_timeout_us: int = 0
    allow_timeout_override: bool = True

    @classmethod
    def for_slo(cls, max_queue_delay_us: int, latency_slo_ms: float | None,
                drop_expired: bool = False) -> DynamicBatching:
        """Batching whose queue drops a request that waited the model's SLO, when the
        owner asked for it (``drop_expired``) and the model has one."""
        timeout = (max(1, int(latency_slo_ms * 1e3))
                   if drop_expired and latency_slo_ms is not None else 0)
        return cls(max_queue_delay_us=max_queue_delay_us, default_timeout_us=timeout)


@dataclass(frozen=True)
class WarmupSample:
    """A warm-up request: ``files`` maps input name to a raw little-endian data file
    (relative to the model's ``warmup/`` folder); ``dims`` gives concrete non-batch dims
    for inputs whose config dims are dynamic."""

    batch_size: int
    files: Mapping[str, str]
    dims: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    count: int = 1


@dataclass(frozen=True)
class ModelConfigSpec:
    name: str
    target: Target
    max_batch_size: int
    inputs: Sequence[TensorSpec]
    outputs: Sequence[TensorSpec]
    dynamic_batching: DynamicBatching | None = DynamicBatching()
    instance_count: int = 1
    gpus: tuple[int, ...] = ()
    warmup: Sequence[WarmupSample] = ()
    parameters: Mapping[str, str] = field(default_factory=dict)
    trt_precision_mode: str | None = None  # onnxruntime target: "FP16" / "INT8"
    cc_model_filenames: Mapping[str, str] = field(default_factory=dict)
    version_policy_latest: int = 1


def build_model_config(spec: ModelConfigSpec) -> mc.ModelConfig:
    config = mc.ModelConfig(name=spec.name, max_batch_size=spec.max_batch_size)
    if spec.target == "cpu":
        config.backend = "python"
    elif spec.target == "onnxruntime":
        config.platform = "onnxruntime_onnx"
    else:
        config.platform = "tensorrt_plan"
    for tensor, target in ((t, config.input.add()) for t in spec.inputs):
        _fill_tensor(target, tensor)
    for tensor, target in ((t, config.output.add()) for t in spec.outputs):
        _fill_tensor(target, tensor)
    if spec.dynamic_batching is not None and spec.max_batch_size > 0:
        _fill_batching(config.dynamic_batching, spec.dynamic_batching)
    group = config.instance_group.add(count=spec.instance_count)
    if spec.target == "cpu":
        group.kind = mc.ModelInstanceGroup.KIND_CPU
    else:
        group.kind = mc.ModelInstanceGroup.KIND_GPU
        group.gpus.extend(spec.gpus)
    for sample in spec.warmup:
        _fill_warmup(config.model_warmup.add(), sample, spec.inputs)
    for key, value in spec.parameters.items():
        config.parameters[key].string_value = value
    if spec.trt_precision_mode and spec.target == "onnxruntime":
        accel = config.optimization.execution_accelerators.gpu_execution_accelerator.add(
            name="tensorrt"
        )
        accel.parameters["precision_mode"] = spec.trt_precision_mode
        accel.parameters["max_workspace_size_bytes"] = str(1 << 30)
    for cc, filename in spec.cc_model_filenames.items():
        config.cc_model_filenames[cc] = filename
    config.version_policy.latest.num_versions = spec.version_policy_latest
    return config


def render_model_config(spec: ModelConfigSpec) -> str:
    return text_format.MessageToString(build_model_config(spec))


def parse_model_config(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


def _fill_tensor(target: mc.ModelInput | mc.ModelOutput, tensor: TensorSpec) -> None:
    target.name = tensor.name
    target.data_type = mc.DataType.Value(f"TYPE_{tensor.datatype}")
    target.dims.extend(tensor.dims)


def _fill_batching(target: mc.ModelDynamicBatching, policy: DynamicBatching) -> None:
    target.max_queue_delay_microseconds = policy.max_queue_delay_us
    target.preferred_batch_size.extend(policy.preferred_batch_sizes)
    if policy.priority_levels:
        target.priority_levels = policy.priority_levels
        target.default_priority_level = policy.default_priority_level or policy.priority_levels
    queue = target.default_queue_policy
    if policy.max_queue_size or policy.default_timeout_us:
        queue.max_queue_size = policy.max_queue_size
        queue.default_timeout_microseconds = policy.default_timeout_us
        queue.allow_timeout_override = policy.allow_timeout_override
        queue.timeout_action = mc.ModelQueuePolicy.REJECT
    else:
        target.ClearField("default_queue_policy")


def _fill_warmup(
    target: mc.ModelWarmup, sample: WarmupSample, inputs: Sequence[TensorSpec]
) -> None:
    target.name = f"warmup_batch_{sample.batch_size}"
    target.batch_size = sample.batch_size
    target.count = sample.count
    for tensor in inputs:
        warm_input = target.inputs[tensor.name]
        warm_input.data_type = mc.DataType.Value(f"TYPE_{tensor.datatype}")
        warm_input.dims.extend(sample.dims.get(tensor.name, tensor.dims))
        warm_input.input_data_file = sample.files[tensor.name]
