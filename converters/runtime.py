"""ONNX Runtime sessions opened exactly as the served model opens them.

Verification, accuracy repair and profiling all measure a variant through
:func:`open_session` with the variant's :class:`RuntimeSettings`; the same settings are
written into ``config.pbtxt`` parameters and read back by
``infergate/triton/python_backend_onnx.py``. What was verified is what is served.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from converters.datasets import SampleSet

# ORT's WeightBiasQuantization pass re-quantizes the float weights of a node that sits
# between DequantizeLinear/QuantizeLinear nodes, per tensor. For a mixed-precision model
# (sensitive nodes deliberately kept float) that undoes the repair: measured on
# EfficientNet-Lite0 with its depthwise convs kept float, top-1 agreement fell from 0.87
# to 0.58. Mixed-precision variants are served with the pass disabled.
MIXED_PRECISION_DISABLED_OPTIMIZERS = ("WeightBiasQuantization",)


@dataclass(frozen=True)
class RuntimeSettings:
    intra_op_threads: int = 0  # 0 = ONNX Runtime's default (all cores)
    disabled_optimizers: tuple[str, ...] = ()
    providers: tuple[str, ...] = ("CPUExecutionProvider",)

    def config_parameters(self) -> dict[str, str]:
        """The Triton config parameters the Python-backend model reads."""
        params = {"intra_op_threads": str(self.intra_op_threads)}
        if self.disabled_optimizers:
            params["disabled_optimizers"] = ",".join(self.disabled_optimizers)
        return params


def available_providers() -> tuple[str, ...]:
    import onnxruntime as ort

    return tuple(ort.get_available_providers())


def providers_for(target: str) -> tuple[str, ...]:
    """Measure where the model will run: CUDA for GPU targets when this host has it (the
    report names the provider actually used), else the CPU."""
    if target != "cpu" and "CUDAExecutionProvider" in available_providers():
        return ("CUDAExecutionProvider", "CPUExecutionProvider")
    return ("CPUExecutionProvider",)


def open_session(model: Path | bytes, settings: RuntimeSettings) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = settings.intra_op_threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    source = model if isinstance(model, bytes) else str(model)
    return ort.InferenceSession(
        source,
        options,
        providers=list(settings.providers),
        disabled_optimizers=list(settings.disabled_optimizers) or None,
    )


def run_batches(
    session: Any, samples: SampleSet, batch_size: int = 8, outputs: Sequence[str] | None = None
) -> list[dict[str, np.ndarray]]:
    names = list(outputs) if outputs else [o.name for o in session.get_outputs()]
    results = []
    for feeds in samples.batches(batch_size):
        values = session.run(names, feeds)
        results.append(dict(zip(names, values, strict=True)))
    return results


def feeds_for(session: Any, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    wanted = {i.name for i in session.get_inputs()}
    return {k: v for k, v in batch.items() if k in wanted}


@functools.cache
def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
