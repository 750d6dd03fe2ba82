"""Gateway overhead: the same client against direct Triton and against the gateway,
interleaved in one run.

For each model (the tiny ``y = 2x + 1`` model, where per-request overhead dominates, and
EfficientNet-Lite0) and each protocol (gRPC, HTTP binary tensors):

- added p50 latency at concurrency 1 (gateway p50 - direct p50, medians over rounds);
- throughput ratio at concurrency 16 (gateway / direct, median over rounds).

The client is deliberately lean (pre-serialised requests over grpc.aio / one aiohttp
session), so that the figures show server-side cost, not client-side Python.

    python -m loadtests.bench_gateway [--rounds 5] [--seconds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import grpc
import numpy as np

from converters.samples import SAMPLE_MODEL_NAME, build_sample_model, cat_input
from converters.tiny import TINY_MODEL_NAME, TINY_WIDTH, build_tiny_model
from loadtests.h2load import INFER, grpc_request_bytes
from loadtests.harness import stack as gateway_stack
from loadtests.harness import table


@dataclass(frozen=True)
class Target:
    name: str
    grpc: str
    http: str


async def closed_loop(
    call: Callable[[], Awaitable[None]], concurrency: int, seconds: float
) -> tuple[list[float], float]:
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            await call()
            latencies.append(time.perf_counter() - t0)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, len(latencies) / (time.perf_counter() - started)


class Client:
    def __init__(self, model: str, x: np.ndarray, input_name: str, output_name: str) -> None:
        self.grpc_body = grpc_request_bytes(model, x, input_name)
        header = json.dumps({
            "inputs": [{"name": input_name, "shape": list(x.shape), "datatype": "FP32",
                        "parameters": {"binary_data_size": x.nbytes}}],
            "outputs": [{"name": output_name, "parameters": {"binary_data": True}}],
        }).encode()
        self.http_body = header + x.astype(np.float32).tobytes()
        self.http_headers = {
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(len(header)),
        }
        self.model = model
        self.channels: dict[str, grpc.aio.Channel] = {}
        self.session: aiohttp.ClientSession | None = None

    async def grpc_call(self, target: str) -> Callable[[], Awaitable[None]]:
        channel = self.channels.get(target)
        if channel is None:
            channel = self.channels[target] = grpc.aio.insecure_channel(target)
        method = channel.unary_unary(INFER)

        async def call() -> None:
            await method(self.grpc_body)

        return call

    async def http_call(self, target: str) -> Callable[[], Awaitable[None]]:
        if self.session is None:
            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=64), auto_decompress=False
            )
        url = f"http://{target}/v2/models/{self.model}/infer"
        session = self.session

        async def call() -> None:
            async with session.post(url, data=self.http_body, headers=self.http_headers) as r:
                await r.read()
                if r.status != 200:
                    raise RuntimeError(f"HTTP {r.status}")

        return call

    async def close(self) -> None:
        for channel in self.channels.values():
            await channel.close()
        if self.session is not None:
            await self.session.close()


async def measure(client: Client, protocol: str, direct: Target, gateway: Target,
                  rounds: int, seconds: float) -> dict[str, float]:
    make = client.grpc_call if protocol == "grpc" else client.http_call
    calls = {}
    for t in (direct, gateway):
        calls[t.name] = await make(t.grpc if protocol == "grpc" else t.http)
        await closed_loop(calls[t.name], 4, 0.5)  # warm connections and caches
    p50: dict[str, list[float]] = {t: [] for t in calls}
    tput: dict[str, list[float]] = {t: [] for t in calls}
    for r in range(rounds):
        order = list(calls) if r % 2 == 0 else list(reversed(list(calls)))
        for name in order:
            lat, _ = await closed_loop(calls[name], 1, seconds / 2)
            p50[name].append(statistics.median(lat))
        for name in order:
            _, rps = await closed_loop(calls[name], 16, seconds)
            tput[name].append(rps)
    d50, g50 = statistics.median(p50["direct"]), statistics.median(p50["gateway"])
    dt, gt = statistics.median(tput["direct"]), statistics.median(tput["gateway"])
    return {
        "direct_p50_ms": d50 * 1e3,
        "gateway_p50_ms": g50 * 1e3,
        "added_p50_ms": (g50 - d50) * 1e3,
        "direct_rps_c16": dt,
        "gateway_rps_c16": gt,
        "throughput_ratio": gt / dt,
    }


@contextlib.contextmanager
def stack(workdir: Path, gateway_args: tuple[str, ...] = ()) -> Iterator[tuple[Target, Target]]:
    repo = workdir / "model_repo"
    build_sample_model(repo)
    build_tiny_model(repo)
    with gateway_stack(workdir, repo, (SAMPLE_MODEL_NAME, TINY_MODEL_NAME),
                       *gateway_args) as st:
        yield (Target("direct", st.member.grpc_url, st.member.http_url),
               Target("gateway", st.gateway.grpc_url, st.gateway.http_url))


def run(rounds: int = 5, seconds: float = 3.0, protocols: tuple[str, ...] = ("grpc", "http"),
        gateway_args: tuple[str, ...] = ()) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    models = {
        TINY_MODEL_NAME: (np.ones((1, TINY_WIDTH), np.float32), "x", "y"),
        SAMPLE_MODEL_NAME: (cat_input(), "input", "logits"),
    }
    with tempfile.TemporaryDirectory() as tmp, stack(Path(tmp), gateway_args) as (direct, gw):

        async def main() -> None:
            for model, (x, inp, out) in models.items():
                client = Client(model, x, inp, out)
                try:
                    for protocol in protocols:
                        figures = await measure(client, protocol, direct, gw, rounds, seconds)
                        rows.append({"model": model, "protocol": protocol, **figures})
                finally:
                    await client.close()

        asyncio.run(main())
    return rows


def markdown(rows: list[dict[str, object]]) -> str:
    return table(
        ("model", "protocol", "direct p50 ms", "gateway p50 ms", "added p50 ms",
         "direct rps c16", "gateway rps c16", "throughput ratio"),
        ((r["model"], r["protocol"], f"{r['direct_p50_ms']:.2f}", f"{r['gateway_p50_ms']:.2f}",
          f"{r['added_p50_ms']:+.2f}", f"{r['direct_rps_c16']:.0f}",
          f"{r['gateway_rps_c16']:.0f}", f"{r['throughput_ratio']:.2f}x") for r in rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--protocols", default="grpc,http")
    parser.add_argument("--gateway-arg", action="append", default=[],
                        help="extra argument for 'python -m gateway serve'")
    args = parser.parse_args()
    rows = run(args.rounds, args.seconds, tuple(args.protocols.split(",")),
               tuple(args.gateway_arg))
    print(markdown(rows))


if __name__ == "__main__":
    main()
