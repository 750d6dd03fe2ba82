"""The Triton-only benchmarks' pieces (bench_batching, bench_coldstart): variants of the
sample model in a scratch repository and a closed-loop gRPC client (the rest they share
with every benchmark: :mod:`loadtests.harness`).

Variants are the same ONNX model and ``model.py`` with one config field changed, so a
side-by-side comparison isolates that field.
"""

from __future__ import annotations

import argparse
import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from converters.samples import INPUT_NAME
from loadtests.harness import copy_model, percentile, sample_model_dir

ConfigEdit = Callable[[mc.ModelConfig], None]


def write_variant(repo: Path, name: str, edit: ConfigEdit) -> None:
    """Copy the sample model to ``repo/name`` (served with today's ``model.py``) with its
    config edited by ``edit``."""
    source = sample_model_dir()
    target = copy_model(source, repo / name)
    config = text_format.Parse((source / "config.pbtxt").read_text(), mc.ModelConfig())
    config.name = name
    edit(config)
    (target / "config.pbtxt").write_text(text_format.MessageToString(config))


@dataclass(frozen=True)
class LoadResult:
    requests: int
    images: int
    seconds: float
    latencies_ms: tuple[float, ...]

    @property
    def images_per_s(self) -> float:
        return self.images / self.seconds

    @property
    def p50_ms(self) -> float:
        return percentile(list(self.latencies_ms), 50)

    @property
    def p99_ms(self) -> float:
        return percentile(list(self.latencies_ms), 99)


def infer_input(x: np.ndarray) -> grpcclient.InferInput:
    inp = grpcclient.InferInput(INPUT_NAME, list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return inp


def closed_loop(url: str, model: str, x: np.ndarray, concurrency: int,
                seconds: float, min_requests: int = 3, priority: int = 0) -> LoadResult:
    """``concurrency`` clients each send the next request when the last one returns, for
    ``seconds`` (and at least ``min_requests`` each, for slow large batches) after one
    untimed request each (connection set-up); ``priority``: Triton's per-request
    priority level (0: the model's default)."""
    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    deadline: list[float] = [0.0]
    began: list[float] = [0.0]

    def start_clock() -> None:  # runs once, before any client is released
        began[0] = time.perf_counter()
        deadline[0] = began[0] + seconds

    start_barrier = threading.Barrier(concurrency + 1, action=start_clock)
    errors: list[BaseException] = []

    def client_loop(mine: list[float]) -> None:
        client = grpcclient.InferenceServerClient(url)
        try:
            inp = infer_input(x)
            client.infer(model, [inp], priority=priority)
            start_barrier.wait(timeout=120)
            while time.perf_counter() < deadline[0] or len(mine) < min_requests:
                t0 = time.perf_counter()
                client.infer(model, [inp], priority=priority)
                mine.append((time.perf_counter() - t0) * 1000.0)
        except BaseException as err:  # noqa: BLE001 - surfaced below
            errors.append(err)
            with contextlib.suppress(threading.BrokenBarrierError):
                start_barrier.abort()
        finally:
            client.close()

    threads = [threading.Thread(target=client_loop, args=(mine,), daemon=True)
               for mine in latencies]
    for t in threads:
        t.start()
    with contextlib.suppress(threading.BrokenBarrierError):
        start_barrier.wait(timeout=180)
    for t in threads:
        t.join(timeout=seconds + 120)
    # until the last in-flight request returned: the same tail for every variant
    elapsed = time.perf_counter() - began[0]
    if errors:
        raise RuntimeError(f"{model}: {errors[0]!r}") from errors[0]
    flat = [v for mine in latencies for v in mine]
    if not flat:
        raise RuntimeError(f"{model}: no request finished within {seconds} s")
    return LoadResult(len(flat), len(flat) * x.shape[0], elapsed, tuple(flat))


def rounds_main(doc: str, run: Callable[[int, float], Sequence[dict[str, Any]]],
                markdown: Callable[[list[dict[str, Any]]], str]) -> None:
    """The command line of a benchmark of closed-loop rounds (``bench_batching``,
    ``bench_priority``): ``--rounds`` (5) of ``--seconds`` (2) each; its table printed.
    ``doc``: the module's docstring (its first paragraph is the help's description)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    print(markdown(list(run(args.rounds, args.seconds))))
