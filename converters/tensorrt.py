"""TensorRT engines from the verified ONNX variants, where TensorRT exists.

Engines are tied to a GPU architecture and a TensorRT version. Each engine is written as
``model_sm<XY>.plan`` (Triton's ``cc_model_filenames`` maps compute capability ``X.Y``
to it) with a tag beside it (``model_sm<XY>.plan.json``: TensorRT version, compute
capability, precision, optimisation profile). :func:`load_engine` refuses an engine
whose tag names another architecture or TensorRT version before TensorRT sees it.

- FP16 engines from the FP32 ONNX model (builder flag FP16); INT8 engines from the
  symmetric S8S8 QDQ model (explicit quantization: TensorRT 10 deprecates implicit INT8
  calibrators), with FP16 allowed for the layers left in float.
- one optimisation profile (min/opt/max) per dynamic input; a timing cache shared by all
  builds of a conversion (and reusable across conversions on the same GPU).
- verified through a pycuda runner against the FP32 reference on the evaluation set.

Nothing here imports ``tensorrt``/``pycuda`` at module import: the pure parts (profiles,
tags, refusal) run and are tested on hosts without a GPU.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from converters.errors import EngineMismatch, StepSkipped, TargetUnavailable
from converters.spec import InputSpec, is_dynamic

Shape = tuple[int, ...]


def tensorrt_available() -> bool:
    return importlib.util.find_spec("tensorrt") is not None


def require_tensorrt() -> None:
    if not tensorrt_available():
        raise StepSkipped("TensorRT not installed")


@dataclass(frozen=True)
class InputProfile:
    name: str
    min: Shape
    opt: Shape
    max: Shape


@dataclass(frozen=True)
class OptimizationProfile:
    inputs: tuple[InputProfile, ...]

    def to_dict(self) -> dict[str, Any]:
        return {p.name: {"min": list(p.min), "opt": list(p.opt), "max": list(p.max)}
                for p in self.inputs}


def optimization_profile(
    spec: InputSpec,
    max_batch: int,
    opt_batch: int,
    observed: Mapping[str, Sequence[Shape]] = {},  # noqa: B006 - read only
) -> OptimizationProfile:
    """Batch axis: 1 / ``opt_batch`` / ``max_batch``. Other dynamic axes: the smallest,
    median and largest length seen in the samples (1 / 64 / 512 when none were seen)."""
    if not 1 <= opt_batch <= max_batch:
        raise ValueError(f"opt batch {opt_batch} must lie in 1..{max_batch}")
    profiles = []
    for tensor in spec.inputs:
        shapes = observed.get(tensor.name, ())
        low, mid, high = [], [], []
        for axis, dim in enumerate(tensor.shape):
            if axis == 0 and tensor.batched:
                low.append(1)
                mid.append(opt_batch)
                high.append(max_batch)
            elif is_dynamic(dim):
                seen = sorted(s[axis] for s in shapes) if shapes else []
                low.append(seen[0] if seen else 1)
                mid.append(seen[len(seen) // 2] if seen else 64)
                high.append(seen[-1] if seen else 512)
            else:
                low.append(int(dim))
                mid.append(int(dim))
                high.append(int(dim))
        profiles.append(InputProfile(tensor.name, tuple(low), tuple(mid), tuple(high)))
    return OptimizationProfile(tuple(profiles))


@dataclass(frozen=True)
class EngineTag:
    tensorrt_version: str
    compute_capability: str  # "8.0"
    precision: str
    profile: Mapping[str, Any]

    @property
    def filename(self) -> str:
        return engine_filename(self.compute_capability)

    def write(self, plan: Path) -> Path:
        path = plan.with_name(plan.name + ".json")
        path.write_text(json.dumps(asdict(self), indent=2, sort_keys=True))
        return path

    @classmethod
    def read(cls, plan: Path) -> EngineTag:
        path = plan.with_name(plan.name + ".json")
        if not path.is_file():
            raise EngineMismatch(
                f"engine {plan.name} has no tag ({path.name}): its TensorRT version and GPU "
                "architecture are unknown; rebuild it with the converter"
            )
        return cls(**json.loads(path.read_text()))


def engine_filename(compute_capability: str) -> str:
    return f"model_sm{compute_capability.replace('.', '')}.plan"


def check_engine(tag: EngineTag, tensorrt_version: str, compute_capability: str) -> None:
    """Refuse an engine built for another GPU architecture or TensorRT version."""
    if tag.compute_capability != compute_capability:
        raise EngineMismatch(
            f"engine {tag.filename} was built for GPU compute capability "
            f"{tag.compute_capability}, this GPU is {compute_capability}: TensorRT engines "
            "only run on the architecture they were built on; rebuild on this GPU"
        )
    if tag.tensorrt_version != tensorrt_version:
        raise EngineMismatch(
            f"engine {tag.filename} was built with TensorRT {tag.tensorrt_version}, this "
            f"host runs TensorRT {tensorrt_version}: engines are not portable across "
            "TensorRT versions; rebuild with this version"
        )


def cc_model_filenames(tags: Sequence[EngineTag]) -> dict[str, str]:
    return {t.compute_capability: t.filename for t in tags}


# --- the GPU half: runs only where tensorrt (and pycuda) import ---------------------


def device_compute_capability() -> str:
    import pycuda.autoinit  # noqa: F401 - creates the CUDA context
    import pycuda.driver as cuda

    major, minor = cuda.Device(0).compute_capability()
    return f"{major}.{minor}"


def build_engine(
    onnx_path: Path,
    precision: str,
    profile: OptimizationProfile,
    timing_cache: Path,
    workspace_bytes: int = 1 << 30,
) -> bytes:
    """Serialized engine; ``timing_cache`` is read if present and updated."""
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise TargetUnavailable(f"TensorRT cannot parse {onnx_path.name}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes)
    if precision in ("fp16", "int8"):
        config.set_flag(trt.BuilderFlag.FP16)
    if precision == "int8":
        config.set_flag(trt.BuilderFlag.INT8)  # honours the QDQ nodes (explicit quantization)
    trt_profile = builder.create_optimization_profile()
    for item in profile.inputs:
        trt_profile.set_shape(item.name, item.min, item.opt, item.max)
    config.add_optimization_profile(trt_profile)
    cache = config.create_timing_cache(timing_cache.read_bytes() if timing_cache.is_file() else b"")
    config.set_timing_cache(cache, ignore_mismatch=False)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise TargetUnavailable(f"TensorRT failed to build a {precision} engine from "
                                f"{onnx_path.name} (see the TensorRT log above)")
    timing_cache.write_bytes(bytes(config.get_timing_cache().serialize()))
    return bytes(serialized)


def load_engine(plan: Path) -> Any:
    """Deserialize ``plan`` after checking its tag against this host."""
    import tensorrt as trt

    check_engine(EngineTag.read(plan), trt.__version__, device_compute_capability())
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    engine = runtime.deserialize_cuda_engine(plan.read_bytes())
    if engine is None:
        raise EngineMismatch(f"TensorRT could not deserialize {plan.name}")
    return engine


class PycudaRunner:
    """Runs a TensorRT engine on numpy batches (TensorRT 10 tensor-address API)."""

    def __init__(self, engine: Any) -> None:
        import pycuda.autoinit  # noqa: F401
        import pycuda.driver as cuda
        import tensorrt as trt

        self._trt, self._cuda = trt, cuda
        self.engine = engine
        self.context = engine.create_execution_context()
        self.stream = cuda.Stream()
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        self.inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if n not in self.inputs]

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        trt, cuda = self._trt, self._cuda
        keep = []
        for name in self.inputs:
            array = np.ascontiguousarray(
                feeds[name], dtype=trt.nptype(self.engine.get_tensor_dtype(name)))
            self.context.set_input_shape(name, array.shape)
            device = cuda.mem_alloc(max(array.nbytes, 1))
            cuda.memcpy_htod_async(device, array, self.stream)
            self.context.set_tensor_address(name, int(device))
            keep.append(device)
        results = {}
        for name in self.outputs:
            shape = tuple(self.context.get_tensor_shape(name))
            host = np.empty(shape, dtype=trt.nptype(self.engine.get_tensor_dtype(name)))
            device = cuda.mem_alloc(max(host.nbytes, 1))
            self.context.set_tensor_address(name, int(device))
            results[name] = (host, device)
            keep.append(device)
        if not self.context.execute_async_v3(self.stream.handle):
            raise RuntimeError("TensorRT execution failed")
        for host, device in results.values():
            cuda.memcpy_dtoh_async(host, device, self.stream)
        self.stream.synchronize()
        return {name: host for name, (host, _) in results.items()}
