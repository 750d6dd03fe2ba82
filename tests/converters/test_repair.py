"""Accuracy repair: layer grouping, float-ifying layers in a QDQ graph, sensitivity
ranking on a real (small) model, and the greedy search with a stand-in measurement."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from converters.datasets import load_samples
from converters.metrics import Accuracy, AccuracyBudget, evaluate
from converters.quantize import StaticInt8Recipe, StaticQuantizer, prepare_for_quantization
from converters.repair import (
    LayerSensitivity,
    floatify,
    greedy_repair,
    k_schedule,
    layer_groups,
    output_noise,
    static_sensitivity,
)
from converters.runtime import RuntimeSettings, open_session, run_batches
from converters.spec import parse_input_spec
from tests.converters.conftest import cnn_samples, small_cnn

SPEC = parse_input_spec("input:float32[batch,3,16,16]")


@pytest.fixture()
def quantizer(tmp_path: Path) -> StaticQuantizer:
    prepared = prepare_for_quantization(small_cnn(tmp_path / "cnn.onnx"),
                                        tmp_path / "prepared.onnx")
    calibration = load_samples(cnn_samples(tmp_path / "c.npy", 16, 1), SPEC, "calibration")
    # logits rounded to 8 bits as well: every layer's output is then quantized
    return StaticQuantizer.calibrate(prepared, calibration, StaticInt8Recipe(float_outputs=False))


def test_layer_groups_fuse_activation_into_its_producer_when_quantized(
        quantizer: StaticQuantizer) -> None:
    groups = layer_groups(quantizer.base_model(), quantizer.quantize_keep_activations())
    assert ("conv1", "relu1") in groups and ("conv2", "clip2") in groups
    assert ("fc",) in groups
    assert not any(g[0] in ("relu1", "clip2") for g in groups)


def test_floatify_restores_float_weights_and_outputs_when_layer_kept_float(
        quantizer: StaticQuantizer, tmp_path: Path) -> None:
    base, analysis = quantizer.base_model(), quantizer.quantize_keep_activations()
    samples = load_samples(cnn_samples(tmp_path / "e.npy", 8, 2), SPEC, "evaluation")
    settings = RuntimeSettings()
    reference = run_batches(open_session(base.SerializeToString(), settings), samples)
    quantized = run_batches(open_session(analysis.SerializeToString(), settings), samples)
    every = [n for g in layer_groups(base, analysis) for n in g]
    floated = floatify(analysis, base, every)
    assert [o.name for o in floated.graph.output] == ["logits"]
    quantize_inputs = {n.input[0] for n in floated.graph.node if n.op_type == "QuantizeLinear"}
    assert quantize_inputs == {"input"}  # every layer output bypasses its Q/DQ pair
    assert {i.name for i in floated.graph.initializer} >= {"w1__float", "b3__float"}
    restored = run_batches(open_session(floated.SerializeToString(), settings), samples)
    # only the network input stays quantized: far closer to FP32 than the INT8 model
    assert output_noise(reference, restored) < output_noise(reference, quantized) / 10


def test_static_sensitivity_ranks_every_layer_when_measured(
        quantizer: StaticQuantizer, tmp_path: Path) -> None:
    samples = load_samples(cnn_samples(tmp_path / "s.npy", 8, 3), SPEC, "calibration")
    seen: list[float] = []
    ranking = static_sensitivity(quantizer.base_model(), quantizer.quantize_keep_activations(),
                                 samples, RuntimeSettings(), progress=seen.append)
    assert {r.layer for r in ranking} >= {"conv1", "conv2", "fc"}
    assert [r.score for r in ranking] == sorted((r.score for r in ranking), reverse=True)
    assert seen[-1] == 1.0


def test_k_schedule_grows_by_about_40_percent_up_to_the_cap() -> None:
    assert k_schedule(100, 30) == [1, 2, 3, 4, 6, 8, 11, 15, 21, 29, 30]
    assert k_schedule(3, 50) == [1, 2, 3]


def _layers(count: int) -> list[LayerSensitivity]:
    return [LayerSensitivity(f"l{i}", (f"l{i}", f"l{i}_act"), "Conv", 1.0 / (i + 1))
            for i in range(count)]


def _fake_measure(needed: int, calls: list[int],
                  stuck: bool = False) -> Callable[[tuple[str, ...]], tuple[str, Accuracy]]:
    """Out of 10 samples, ``needed - k`` disagree with k layers float (or 5 when
    ``stuck``): a 10% budget is met from ``needed - 1`` float layers on."""
    def build_and_measure(nodes: tuple[str, ...]) -> tuple[str, Accuracy]:
        layers = len(nodes) // 2
        calls.append(layers)
        wrong = 5 if stuck else min(10, max(0, needed - layers))
        reference = np.eye(10, dtype=np.float32)
        candidate = reference.copy()
        candidate[:wrong] = np.roll(candidate[:wrong], 1, axis=1)
        return f"model-{layers}", evaluate([{"y": reference}], [{"y": candidate}], "y", True)
    return build_and_measure


def test_greedy_repair_finds_smallest_float_set_when_budget_reachable() -> None:
    calls: list[int] = []
    outcome = greedy_repair(_layers(40), _fake_measure(8, calls), AccuracyBudget(0.1, None))
    assert outcome.accepted
    assert calls == [1, 2, 3, 4, 6, 8, 7]  # schedule until 8 passes, then bisect 6..8
    assert outcome.float_nodes == tuple(n for i in range(7) for n in (f"l{i}", f"l{i}_act"))
    assert outcome.result[0] == "model-7"
    assert outcome.reason.startswith("budget met with 7 of 40 layers kept float: l0, l1")


def test_greedy_repair_rejects_with_reason_when_cap_reached() -> None:
    calls: list[int] = []
    outcome = greedy_repair(_layers(10), _fake_measure(9, calls), AccuracyBudget(0.1, None),
                            max_float_fraction=0.5)
    assert not outcome.accepted and outcome.float_nodes == ()
    assert calls == [1, 2, 3, 4, 5]
    assert outcome.reason == ("INT8 rejected: the cap of 50% of 10 layers was reached; best "
                              "with 5 float: top-1 disagreement 40.00% > 10.00% (0 of 4 "
                              "changed answers are samples whose FP32 top-2 margin is under 5%)")


def test_greedy_repair_stops_early_when_more_float_layers_stop_helping() -> None:
    calls: list[int] = []
    outcome = greedy_repair(_layers(40), _fake_measure(9, calls, stuck=True),
                            AccuracyBudget(0.1, None), patience=3)
    assert not outcome.accepted
    assert calls == [1, 2, 3, 4]  # no progress after the first step, three times in a row
    assert outcome.reason.startswith("INT8 rejected: keeping up to 4 of 40 layers float "
                                     "stopped improving accuracy; best with 1 float:")
