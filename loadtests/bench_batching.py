"""Dynamic batching on vs off, by client batch size and concurrency: the seed article's
"batch size impact" table, measured on the sample model in a real Triton.

Two copies of EfficientNet-Lite0 are loaded side by side in one Triton: ``*_batching``
(the sample's config: ``dynamic_batching { max_queue_delay_microseconds: 2000 }``) and
``*_nobatch`` (the same config without ``dynamic_batching``, so Triton hands the model one
request at a time). For each cell (client batch size x concurrent clients) both variants
run the same closed-loop gRPC load, interleaved, for ``rounds`` short rounds (so a burst
of load from elsewhere on the machine hits both variants alike); every figure is the
median over rounds: images/s, p50 and p99 request latency, and the on/off ratios.

    python -m loadtests.bench_batching [--rounds 5] [--seconds 2]
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient

from converters.samples import cat_input
from loadtests.benchkit import closed_loop, rounds_main, write_variant
from loadtests.harness import figure, median, table, triton

ON, OFF = "effnet_batching", "effnet_nobatch"
# (client batch size, concurrent clients): batch-size sweep at concurrency 1 (what one
# client gains by batching itself) and concurrency sweep at batch 1 (what the server's
# dynamic batcher gains by batching many clients' requests).
CELLS = ((1, 1), (1, 4), (1, 16), (8, 1), (8, 4), (32, 1))


def run(rounds: int = 5, seconds: float = 2.0,
        cells: tuple[tuple[int, int], ...] = CELLS) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        repo.mkdir()
        write_variant(repo, ON, lambda c: None)
        write_variant(repo, OFF, lambda c: c.ClearField("dynamic_batching"))
        with triton(repo, Path(tmp), (ON, OFF)) as member:
            url = member.grpc_url
            stats_client = grpcclient.InferenceServerClient(url)
            for batch, concurrency in cells:
                x = np.repeat(cat_input(), batch, axis=0)
                figures: dict[str, dict[str, list[float]]] = {
                    v: {"ips": [], "p50": [], "p99": []} for v in (ON, OFF)}
                before = {v: server_stats(stats_client, v) for v in (ON, OFF)}
                for r in range(rounds):
                    order = (ON, OFF) if r % 2 == 0 else (OFF, ON)  # interleaved
                    for variant in order:
                        result = closed_loop(url, variant, x, concurrency, seconds)
                        figures[variant]["ips"].append(result.images_per_s)
                        figures[variant]["p50"].append(result.p50_ms)
                        figures[variant]["p99"].append(result.p99_ms)
                after = {v: server_stats(stats_client, v) for v in (ON, OFF)}
                per_cell = {v: after[v].minus(before[v]) for v in (ON, OFF)}
                rows.append(_row(batch, concurrency, figures, per_cell))
                print(f"[bench_batching] batch {batch} x {concurrency} clients: "
                      f"{rows[-1]['throughput_ratio']:.2f}x throughput, "
                      f"{rows[-1]['on_images_per_execution']:.1f} images/execution", flush=True)
            stats_client.close()
    return rows


@dataclass(frozen=True)
class ServerStats:
    """Triton's cumulative counters for one model (inference statistics extension)."""

    inferences: int
    executions: int
    compute_ns: int

    def minus(self, earlier: ServerStats) -> ServerStats:
        return ServerStats(self.inferences - earlier.inferences,
                           self.executions - earlier.executions,
                           self.compute_ns - earlier.compute_ns)

    @property
    def images_per_execution(self) -> float:
        return self.inferences / max(1, self.executions)

    @property
    def compute_ms_per_image(self) -> float:
        return self.compute_ns / 1e6 / max(1, self.inferences)


def server_stats(client: grpcclient.InferenceServerClient, model: str) -> ServerStats:
    stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    compute = sum(int(b["compute_infer"]["ns"]) for b in stats.get("batch_stats", []))
    return ServerStats(int(stats.get("inference_count", 0)),
                       int(stats.get("execution_count", 0)), compute)


def _row(batch: int, concurrency: int, figures: dict[str, dict[str, list[float]]],
         server: dict[str, ServerStats]) -> dict[str, Any]:
    on = {k: median(v) for k, v in figures[ON].items()}
    off = {k: median(v) for k, v in figures[OFF].items()}
    return {
        "batch_size": batch, "concurrency": concurrency,
        # Triton's own view over the whole cell: how many images one model execution
        # carried, and model compute time per image (not disturbed by client timing)
        "on_images_per_execution": server[ON].images_per_execution,
        "off_images_per_execution": server[OFF].images_per_execution,
        "on_compute_ms_per_image": server[ON].compute_ms_per_image,
        "off_compute_ms_per_image": server[OFF].compute_ms_per_image,
        "compute_per_image_ratio": (server[ON].compute_ms_per_image
                                    / server[OFF].compute_ms_per_image),
        "on_images_per_s": on["ips"], "off_images_per_s": off["ips"],
        "on_p50_ms": on["p50"], "off_p50_ms": off["p50"],
        "on_p99_ms": on["p99"], "off_p99_ms": off["p99"],
        "throughput_ratio": on["ips"] / off["ips"],
        "p50_ratio": on["p50"] / off["p50"],
        "p99_ratio": on["p99"] / off["p99"],
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    def ratios(r: dict[str, Any], side: str) -> list[str]:
        if side != "on":
            return [""] * 4
        return [f"{r[k]:.2f}x" for k in ("throughput_ratio", "p50_ratio", "p99_ratio",
                                         "compute_per_image_ratio")]

    return table(
        ("client batch", "clients", "batching", "images/s", "p50 ms", "p99 ms",
         "images per execution", "compute ms/image", "throughput on/off", "p50 on/off",
         "p99 on/off", "compute/image on/off"),
        ([r["batch_size"], r["concurrency"], side, f"{r[f'{side}_images_per_s']:.1f}",
          f"{r[f'{side}_p50_ms']:.1f}", f"{r[f'{side}_p99_ms']:.1f}",
          f"{r[f'{side}_images_per_execution']:.2f}",
          f"{r[f'{side}_compute_ms_per_image']:.1f}", *ratios(r, side)]
         for r in rows for side in ("on", "off")))


def plot(rows: list[dict[str, Any]], out: Path) -> list[Path]:
    labels = [f"b{r['batch_size']}x{r['concurrency']}" for r in rows]
    positions = np.arange(len(rows))
    path = out / "bench_batching.png"
    with figure(path, 1, 2, figsize=(11, 4)) as (fig, (ax1, ax2)):
        for offset, side, label in ((-0.2, "on", "dynamic batching on"), (0.2, "off", "off")):
            ax1.bar(positions + offset, [float(r[f"{side}_images_per_s"]) for r in rows], 0.4,
                    label=label)
            ax2.bar(positions + offset, [float(r[f"{side}_p99_ms"]) for r in rows], 0.4,
                    label=label)
        for ax, title in ((ax1, "throughput (images/s)"), (ax2, "p99 latency (ms)")):
            ax.set_xticks(positions, labels)
            ax.set_xlabel("client batch size x concurrent clients")
            ax.set_title(title)
            ax.legend()
        fig.suptitle("EfficientNet-Lite0 on Triton (CPU): dynamic batching on vs off")
    return [path]


def main() -> None:
    rounds_main(__doc__ or "", run, markdown)


if __name__ == "__main__":
    main()
