"""Cold start: the first request after a model load against the steady p50, with and
without Triton's ``model_warmup``.

Two copies of EfficientNet-Lite0 sit in one scratch repository: ``effnet_warmup`` (the
sample's config: warm-up requests at batch 1 and 8 with a real photo) and
``effnet_nowarmup`` (the same config without ``model_warmup``). Triton starts with no
model loaded; each round loads one variant through the repository API (timed), sends
the first request the moment it is READY (timed), then ``steady`` more requests (p50),
and unloads it. Variants alternate, rounds repeat, every figure is a median over rounds.
The warm-up moves the first-inference cost into the load, before the model reports
READY (and, with --strict-readiness, before a pod receives traffic): the seed's advice
"use warm-up requests" measured.

    python -m loadtests.bench_coldstart [--rounds 5] [--steady 20]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import tritonclient.grpc as grpcclient

from converters.samples import cat_input
from loadtests.benchkit import infer_input, write_variant
from loadtests.harness import figure, median, percentile, table, triton

WARM, COLD = "effnet_warmup", "effnet_nowarmup"


def _measure_once(client: grpcclient.InferenceServerClient, model: str,
                  steady: int) -> dict[str, float]:
    inp = infer_input(cat_input())
    t0 = time.perf_counter()
    client.load_model(model)  # returns once the model is loaded (and warmed up)
    load_s = time.perf_counter() - t0
    if not client.is_model_ready(model):
        raise RuntimeError(f"{model} not ready after load")
    t1 = time.perf_counter()
    client.infer(model, [inp])
    first_ms = (time.perf_counter() - t1) * 1000.0
    latencies = []
    for _ in range(steady):
        t2 = time.perf_counter()
        client.infer(model, [inp])
        latencies.append((time.perf_counter() - t2) * 1000.0)
    client.unload_model(model)
    deadline = time.monotonic() + 60
    while client.is_model_ready(model) and time.monotonic() < deadline:
        time.sleep(0.1)
    return {"load_s": load_s, "first_ms": first_ms, "steady_p50_ms": percentile(latencies, 50)}


def run(rounds: int = 5, steady: int = 20) -> list[dict[str, Any]]:
    samples: dict[str, list[dict[str, float]]] = {WARM: [], COLD: []}
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        repo.mkdir()
        write_variant(repo, WARM, lambda c: None)
        write_variant(repo, COLD, lambda c: c.ClearField("model_warmup"))
        with triton(repo, Path(tmp), ()) as member:
            client = grpcclient.InferenceServerClient(member.grpc_url)
            try:
                for r in range(rounds):
                    for model in (WARM, COLD) if r % 2 == 0 else (COLD, WARM):
                        samples[model].append(_measure_once(client, model, steady))
                        s = samples[model][-1]
                        print(f"[bench_coldstart] round {r + 1} {model}: load {s['load_s']:.2f} s,"
                              f" first {s['first_ms']:.0f} ms, steady p50 "
                              f"{s['steady_p50_ms']:.1f} ms", flush=True)
            finally:
                client.close()
    rows = []
    for model, warmup in ((WARM, True), (COLD, False)):
        load_s = median([s["load_s"] for s in samples[model]])
        first = median([s["first_ms"] for s in samples[model]])
        p50 = median([s["steady_p50_ms"] for s in samples[model]])
        rows.append({
            "variant": model, "model_warmup": warmup, "load_s": load_s,
            "first_request_ms": first, "steady_p50_ms": p50,
            "first_to_steady_ratio": median([s["first_ms"] / s["steady_p50_ms"]
                                             for s in samples[model]]),
        })
    firsts = {m: median([s["first_ms"] for s in samples[m]]) for m in (WARM, COLD)}
    loads = {m: median([s["load_s"] for s in samples[m]]) for m in (WARM, COLD)}
    rows[0]["cold_to_warm_first_request_ratio"] = firsts[COLD] / firsts[WARM]
    rows[0]["warm_to_cold_load_time_ratio"] = loads[WARM] / loads[COLD]
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [table(
        ("variant", "model_warmup", "load s", "first request ms", "steady p50 ms",
         "first / steady p50"),
        ((r["variant"], "yes" if r["model_warmup"] else "no", f"{r['load_s']:.2f}",
          f"{r['first_request_ms']:.1f}", f"{r['steady_p50_ms']:.1f}",
          f"{r['first_to_steady_ratio']:.2f}x") for r in rows))]
    warm = rows[0]
    lines += [
        "",
        f"Without warm-up the first request is {warm['cold_to_warm_first_request_ratio']:.2f}x "
        f"slower than with it; warm-up makes the load {warm['warm_to_cold_load_time_ratio']:.2f}x "
        "as long (the cost moves before READY).",
    ]
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], out: Path) -> list[Path]:
    labels = [f"{'with' if r['model_warmup'] else 'without'} model_warmup" for r in rows]
    firsts = [float(r["first_request_ms"]) for r in rows]
    steadies = [float(r["steady_p50_ms"]) for r in rows]
    xs = range(len(rows))
    path = out / "bench_coldstart.png"
    with figure(path, figsize=(6, 4)) as (_, ax):
        ax.bar([x - 0.2 for x in xs], firsts, 0.4, label="first request after load")
        ax.bar([x + 0.2 for x in xs], steadies, 0.4, label="steady p50")
        ax.set_xticks(list(xs), labels)
        ax.set_ylabel("latency (ms)")
        ax.set_title("EfficientNet-Lite0 on Triton (CPU): cold start")
        ax.legend()
    return [path]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steady", type=int, default=20)
    args = parser.parse_args()
    print(markdown(run(args.rounds, args.steady)))


if __name__ == "__main__":
    main()
