"""Soak: N minutes of mixed good and bad traffic against a gateway, sampling its memory,
open files and latency over time.

Traffic (closed loop, ``--concurrency`` tasks): good HTTP JSON and gRPC ``ModelInfer``
requests to the tiny model, interleaved with client mistakes (malformed JSON, a wrong
shape, an unknown model, unparseable gRPC bytes, an output ``name`` that is an object).
Every ``--interval`` seconds a sample: RSS and open file descriptors of the gateway's
process tree (the Python process and HAProxy), p50/p99 of the good requests answered in
that window, requests per second, and answers that were server faults (5xx /
INTERNAL / UNKNOWN: there must be none). Written as ``soak.csv``, ``soak.json`` (the
samples and a summary: RSS and fds first/last/max, growth over the second half) and
``soak.png`` (three panels over time).

    python -m loadtests.soak [--minutes 2] [--out results/soak] [--data-plane haproxy]
    python -m loadtests.soak --http 127.0.0.1:8000 --grpc 127.0.0.1:8001 --pid PID

Without ``--http``, it starts a Triton with the tiny model and a gateway of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import json
import random
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc
import httpx
import numpy as np
import psutil
from tritonclient.grpc import service_pb2

from converters.tiny import TINY_MODEL_NAME, TINY_WIDTH
from loadtests import harness
from loadtests.harness import figure, stack

GRPC_INFER = "/inference.GRPCInferenceService/ModelInfer"
GRPC_FAULTS = ("INTERNAL", "UNKNOWN", "DATA_LOSS")
X = np.ones((1, TINY_WIDTH), np.float32)
GOOD_JSON = {"inputs": [{"name": "x", "shape": [1, TINY_WIDTH], "datatype": "FP32",
                         "data": X.ravel().tolist()}]}
BAD_HTTP: list[tuple[str, bytes]] = [
    (TINY_MODEL_NAME, b"{not json"),
    (TINY_MODEL_NAME, json.dumps({**GOOD_JSON, "outputs": [{"name": {"a": 1}}]}).encode()),
    (TINY_MODEL_NAME, json.dumps({"inputs": [{**GOOD_JSON["inputs"][0],
                                              "shape": [1, TINY_WIDTH + 1]}]}).encode()),
    ("no_such_model", json.dumps(GOOD_JSON).encode()),
]
BAD_GRPC = [b"\x0a\x04tiny\xff\xff\xff", b"\x0a\x02\xff\xfe", b"\x0a\x04tiny\x1a\x10\x0a"]


# -- pure parts (tests/loadtests/test_soak.py) ----------------------------------------
def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]); 0 for no values."""
    return float(harness.percentile(values, q)) if values else 0.0


def is_fault(answer: str) -> bool:
    """A server fault: an HTTP 5xx or a gRPC INTERNAL / UNKNOWN / DATA_LOSS."""
    return (answer.isdigit() and int(answer) >= 500) or answer in GRPC_FAULTS


@dataclass
class Window:
    """What the traffic saw between two samples."""

    latencies_s: list[float] = field(default_factory=list)  # good requests answered OK
    requests: int = 0
    faults: int = 0
    unexpected: int = 0  # a good request not answered OK, a bad one answered OK
    answers: Counter[str] = field(default_factory=Counter)

    def record(self, good: bool, answer: str, latency_s: float) -> None:
        self.requests += 1
        self.answers[f"{'good' if good else 'bad'} {answer}"] += 1
        ok = answer in ("200", "OK")
        if good and ok:
            self.latencies_s.append(latency_s)
        self.faults += is_fault(answer)
        self.unexpected += good != ok


@dataclass(frozen=True)
class Sample:
    t_s: float
    rss_mb: float
    open_fds: int
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    faults: int
    unexpected: int


def sample(t_s: float, window: Window, interval_s: float, rss_bytes: int, fds: int) -> Sample:
    return Sample(round(t_s, 1), round(rss_bytes / 2**20, 1), fds,
                  round(window.requests / interval_s, 1),
                  round(percentile(window.latencies_s, 50) * 1e3, 2),
                  round(percentile(window.latencies_s, 99) * 1e3, 2),
                  window.faults, window.unexpected)


def summarize(samples: Sequence[Sample]) -> dict[str, object]:
    """First/last/max of RSS and fds, their growth over the second half (a leak shows as
    steady growth there, after warm-up), p99 range, totals."""
    if not samples:
        return {}
    half = samples[len(samples) // 2:]
    return {
        "samples": len(samples),
        "duration_s": samples[-1].t_s,
        "rss_mb": {"first": samples[0].rss_mb, "last": samples[-1].rss_mb,
                   "max": max(s.rss_mb for s in samples),
                   "second_half_growth": round(half[-1].rss_mb - half[0].rss_mb, 1)},
        "open_fds": {"first": samples[0].open_fds, "last": samples[-1].open_fds,
                     "max": max(s.open_fds for s in samples),
                     "second_half_growth": half[-1].open_fds - half[0].open_fds},
        "p99_ms": {"min": min(s.p99_ms for s in samples),
                   "median": percentile([s.p99_ms for s in samples], 50),
                   "max": max(s.p99_ms for s in samples)},
        "requests": int(sum(s.requests_per_s for s in samples[1:]) *
                        (samples[-1].t_s / max(1, len(samples) - 1))),
        "faults": sum(s.faults for s in samples),
        "unexpected": sum(s.unexpected for s in samples),
    }


def write_csv(path: Path, samples: Sequence[Sample]) -> None:
    with path.open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=list(Sample.__dataclass_fields__))
        writer.writeheader()
        writer.writerows(asdict(s) for s in samples)


def plot(path: Path, samples: Sequence[Sample], title: str) -> None:
    t = [s.t_s / 60 for s in samples]
    with figure(path, 3, 1, dpi=100, figsize=(8, 7), sharex=True) as (_, axes):
        axes[0].plot(t, [s.rss_mb for s in samples])
        axes[0].set_ylabel("RSS (MiB)")
        axes[1].plot(t, [s.open_fds for s in samples])
        axes[1].set_ylabel("open fds")
        axes[2].plot(t, [s.p99_ms for s in samples], label="p99")
        axes[2].plot(t, [s.p50_ms for s in samples], label="p50")
        axes[2].set_ylabel("latency (ms)")
        axes[2].set_xlabel("minutes")
        axes[2].legend()
        axes[0].set_title(title)


def footprint(pid: int) -> tuple[int, int]:
    """RSS bytes and open fds of ``pid`` and its descendants."""
    root = psutil.Process(pid)
    rss = fds = 0
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            rss += proc.memory_info().rss
            fds += proc.num_fds()
    return rss, fds


# -- traffic ---------------------------------------------------------------------------
class Traffic:
    def __init__(self, http: str, grpc_target: str, bad_share: float, seed: int,
                 bad_grpc: bool = True) -> None:
        self.http, self.grpc_target = http, grpc_target
        self.bad_grpc = bad_grpc
        self.bad_share = bad_share
        self.rng = random.Random(seed)
        self.window = Window()
        request = service_pb2.ModelInferRequest(model_name=TINY_MODEL_NAME)
        request.inputs.add(name="x", datatype="FP32", shape=[1, TINY_WIDTH])
        request.raw_input_contents.append(X.tobytes())
        self.good_grpc = request.SerializeToString()

    async def worker(self, stop: asyncio.Event) -> None:
        async with httpx.AsyncClient(base_url=f"http://{self.http}", timeout=30,
                                     trust_env=False) as client, \
                grpc.aio.insecure_channel(self.grpc_target) as channel:
            infer = channel.unary_unary(GRPC_INFER)
            while not stop.is_set():
                good = self.rng.random() >= self.bad_share
                started = time.monotonic()
                if self.rng.random() < 0.5:
                    model, body = ((TINY_MODEL_NAME, json.dumps(GOOD_JSON).encode()) if good
                                   else self.rng.choice(BAD_HTTP))
                    try:
                        resp = await client.post(f"/v2/models/{model}/infer", content=body,
                                                 headers={"content-type": "application/json"})
                        answer = str(resp.status_code)
                    except httpx.HTTPError as exc:
                        answer = type(exc).__name__
                else:
                    good = good or not self.bad_grpc
                    message = self.good_grpc if good else self.rng.choice(BAD_GRPC)
                    try:
                        await infer(message, timeout=30)
                        answer = "OK"
                    except grpc.aio.AioRpcError as exc:
                        answer = exc.code().name
                self.window.record(good, answer, time.monotonic() - started)

    def take_window(self) -> Window:
        window, self.window = self.window, Window()
        return window


async def soak(http: str, grpc_target: str, pid: int, minutes: float, interval_s: float,
               concurrency: int, bad_share: float, bad_grpc: bool = True) -> list[Sample]:
    traffic = Traffic(http, grpc_target, bad_share, seed=1, bad_grpc=bad_grpc)
    stop = asyncio.Event()
    workers = [asyncio.create_task(traffic.worker(stop)) for _ in range(concurrency)]
    samples: list[Sample] = []
    start = time.monotonic()
    try:
        while time.monotonic() - start < minutes * 60:
            await asyncio.sleep(interval_s)
            rss, fds = footprint(pid)
            samples.append(sample(time.monotonic() - start, traffic.take_window(),
                                  interval_s, rss, fds))
            s = samples[-1]
            print(f"{s.t_s:7.1f}s rss {s.rss_mb:7.1f} MiB fds {s.open_fds:4} "
                  f"{s.requests_per_s:7.1f} req/s p99 {s.p99_ms:7.2f} ms "
                  f"faults {s.faults} unexpected {s.unexpected}", flush=True)
    finally:
        stop.set()
        await asyncio.gather(*workers, return_exceptions=True)
    return samples


@contextlib.contextmanager
def own_gateway(data_plane: str) -> Iterator[tuple[str, str, int]]:
    """A Triton with the tiny model and a gateway over it (stopped on exit)."""
    from converters.tiny import build_tiny_model

    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        root = Path(tmp)
        build_tiny_model(root / "model_repo")
        with stack(root, root / "model_repo", (TINY_MODEL_NAME,),
                   data_plane=data_plane) as st:
            yield st.gateway.http_url, st.gateway.grpc_url, st.gateway.proc.pid


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=2.0)
    parser.add_argument("--interval", type=float, default=5.0, help="seconds per sample")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--bad-share", type=float, default=0.3)
    parser.add_argument("--no-bad-grpc", action="store_true",
                        help="client mistakes over HTTP only")
    parser.add_argument("--out", type=Path, default=Path("results/soak"))
    parser.add_argument("--data-plane", default="haproxy")
    parser.add_argument("--http", help="a running gateway's HTTP address (host:port)")
    parser.add_argument("--grpc", help="its gRPC address")
    parser.add_argument("--pid", type=int, help="its process id (RSS and fds of its tree)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        if args.http:
            if not (args.grpc and args.pid):
                parser.error("--http needs --grpc and --pid")
            http, grpc_target, pid = args.http, args.grpc, args.pid
            label = f"gateway at {http}"
        else:
            http, grpc_target, pid = stack.enter_context(own_gateway(args.data_plane))
            label = f"gateway ({args.data_plane} data plane)"
        samples = asyncio.run(soak(http, grpc_target, pid, args.minutes, args.interval,
                                   args.concurrency, args.bad_share, not args.no_bad_grpc))
    summary = summarize(samples)
    write_csv(args.out / "soak.csv", samples)
    (args.out / "soak.json").write_text(json.dumps(
        {"target": label, "minutes": args.minutes, "concurrency": args.concurrency,
         "bad_share": args.bad_share, "bad_grpc": not args.no_bad_grpc, "summary": summary,
         "samples": [asdict(s) for s in samples]}, indent=2))
    plot(args.out / "soak.png", samples,
         f"soak: {label}, {args.concurrency} in flight, {args.bad_share:.0%} bad")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
