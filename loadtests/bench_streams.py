"""Streams: time to first response and the gap between responses, through the gateway
(HAProxy data plane, Python data plane) against straight to Triton, on the decoupled
test model (``converters/decoupled.py``).

One Triton serves the model; two gateways sit in front of it. Each round sends, on every
target in turn (interleaved, so each comparison shares the moment's machine load),
``requests`` requests one after another, each asking for ``count`` responses
``delay_ms`` apart, over gRPC ``ModelStreamInfer`` (tritonclient.grpc, one stream per
round) and HTTP ``generate_stream`` (server-sent events). Per response the client
timestamps its arrival: time to first response (request sent -> first response) and
inter-response gaps. Figures are medians over rounds of per-round p50 / p99; the ratios
are gateway / direct, and ``added`` is gateway - direct in milliseconds.

    python -m loadtests.bench_streams [--rounds 3] [--requests 20] [--count 16] [--delay-ms 2]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import queue
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import tritonclient.grpc as grpcclient

from converters.decoupled import DECOUPLED_MODEL_NAME, build_decoupled_model
from loadtests.harness import gateway, gateway_yaml, median, percentile, table, triton

MODEL = DECOUPLED_MODEL_NAME
PLANES = ("haproxy", "python")


def _inputs(count: int, delay_ms: int) -> list[grpcclient.InferInput]:
    inputs = []
    for name, value, datatype in (
        ("text_input", np.array([b"bench"], dtype=np.object_), "BYTES"),
        ("count", np.array([count], dtype=np.int32), "INT32"),
        ("delay_ms", np.array([delay_ms], dtype=np.int32), "INT32"),
    ):
        tensor = grpcclient.InferInput(name, [1], datatype)
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    return inputs


def grpc_round(url: str, requests: int, count: int, delay_ms: int) -> list[list[float]]:
    """Per request: [sent, arrival of each response...] (perf_counter seconds)."""
    arrivals: queue.Queue[tuple[float, Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: arrivals.put(
        (time.perf_counter(), result, error)))
    timings = []
    try:
        inputs = _inputs(count, delay_ms)
        for i in range(requests):
            sent = time.perf_counter()
            client.async_stream_infer(MODEL, inputs, request_id=str(i),
                                      enable_empty_final_response=True)
            times = [sent]
            while True:
                at, result, error = arrivals.get(timeout=60)
                if error is not None:
                    raise RuntimeError(f"stream error from {url}: {error}")
                response = result.get_response()
                if response.outputs:
                    times.append(at)
                if response.parameters["triton_final_response"].bool_param:
                    break
            timings.append(times)
    finally:
        client.stop_stream()
        client.close()
    return timings


def sse_round(url: str, requests: int, count: int, delay_ms: int) -> list[list[float]]:
    timings = []
    body = {"text_input": "bench", "count": count, "delay_ms": delay_ms}
    with httpx.Client(base_url=f"http://{url}", timeout=60) as client:
        for _ in range(requests):
            sent = time.perf_counter()
            times = [sent]
            with client.stream("POST", f"/v2/models/{MODEL}/generate_stream",
                               content=json.dumps(body)) as resp:
                for line in resp.iter_lines():
                    if line.startswith("data: "):
                        times.append(time.perf_counter())
            if len(times) != count + 1:
                raise RuntimeError(f"{url}: {len(times) - 1} events, expected {count}")
            timings.append(times)
    return timings


def summarise(timings: list[list[float]]) -> dict[str, float]:
    ttfr = [(t[1] - t[0]) * 1e3 for t in timings]
    gaps = [(b - a) * 1e3 for t in timings for a, b in zip(t[1:], t[2:], strict=False)]
    return {"ttfr_p50_ms": percentile(ttfr, 50), "ttfr_p99_ms": percentile(ttfr, 99),
            "gap_p50_ms": percentile(gaps, 50), "gap_p99_ms": percentile(gaps, 99)}


@contextlib.contextmanager
def _stack(tmp: Path) -> Iterator[dict[str, tuple[str, str]]]:
    """Targets: name -> (gRPC url, HTTP url)."""
    repo = tmp / "repo"
    build_decoupled_model(repo)
    with triton(repo, tmp, (MODEL,)) as member, contextlib.ExitStack() as stack:
        targets = {"direct": (member.grpc_url, member.http_url)}
        pools = gateway_yaml(tmp / "pools.yaml", {"bench": [member]})
        for plane in PLANES:
            gw = stack.enter_context(gateway(pools, tmp / plane, data_plane=plane))
            targets[plane] = (gw.grpc_url, gw.http_url)
        yield targets


def run(rounds: int = 3, requests: int = 20, count: int = 16,
        delay_ms: int = 2) -> list[dict[str, Any]]:
    per: dict[tuple[str, str], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-streams-") as tmp, _stack(Path(tmp)) as targets:
        for grpc_url, http_url in targets.values():  # warm every path once
            grpc_round(grpc_url, 2, count, 0)
            sse_round(http_url, 2, count, 0)
        for _ in range(rounds):
            for name, (grpc_url, http_url) in targets.items():
                per.setdefault((name, "grpc_stream"), []).append(
                    summarise(grpc_round(grpc_url, requests, count, delay_ms)))
                per.setdefault((name, "generate_stream"), []).append(
                    summarise(sse_round(http_url, requests, count, delay_ms)))
    rows = []
    for (name, protocol), samples in per.items():
        figures = {k: median([s[k] for s in samples]) for k in samples[0]}
        row: dict[str, Any] = {"target": name, "protocol": protocol, "count": count,
                               "delay_ms": delay_ms, **figures}
        if name != "direct":
            direct = {k: median([s[k] for s in per[("direct", protocol)]]) for k in figures}
            row["ttfr_ratio"] = figures["ttfr_p50_ms"] / direct["ttfr_p50_ms"]
            row["gap_ratio"] = figures["gap_p50_ms"] / direct["gap_p50_ms"]
            row["ttfr_added_ms"] = figures["ttfr_p50_ms"] - direct["ttfr_p50_ms"]
            row["gap_added_ms"] = figures["gap_p50_ms"] - direct["gap_p50_ms"]
        rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    def versus_direct(r: dict[str, Any]) -> list[str]:
        if "ttfr_ratio" not in r:
            return ["-"] * 4
        return [f"{r['ttfr_ratio']:.2f}x", f"{r['gap_ratio']:.2f}x",
                f"{r['ttfr_added_ms']:+.2f}", f"{r['gap_added_ms']:+.2f}"]

    return table(("target", "protocol", "TTFR p50 ms", "TTFR p99 ms", "gap p50 ms",
                  "gap p99 ms", "TTFR ratio", "gap ratio", "TTFR added ms", "gap added ms"),
                 ([r["target"], r["protocol"],
                   *(f"{r[k]:.2f}" for k in ("ttfr_p50_ms", "ttfr_p99_ms", "gap_p50_ms",
                                             "gap_p99_ms")),
                   *versus_direct(r)] for r in rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--count", type=int, default=16)
    parser.add_argument("--delay-ms", type=int, default=2)
    args = parser.parse_args()
    rows = run(args.rounds, args.requests, args.count, args.delay_ms)
    print(markdown(rows))


if __name__ == "__main__":
    main()
