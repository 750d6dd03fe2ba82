"""Loads on one member: what they do to HTTP inference there, and how many at once it
takes before each load gets slower (issue 34).

One Triton (explicit model control) serves ``tiny`` to a steady open-loop stream of
HTTP/JSON inference requests (``--rate`` per second, spread round-robin over
``--connections`` keep-alive connections, one each, as HAProxy's pool toward a member
holds several). Meanwhile, in four interleaved arms of ``--phase-s`` each:

- ``none``: nothing else happens (the baseline);
- ``http``: other models are loaded and unloaded one after another over Triton's HTTP
  repository API (``POST /v2/repository/models/{m}/load``, one keep-alive client, as the
  gateway's admin client did);
- ``http_new``: the same, each call on a connection of its own (opened for it);
- ``grpc``: the same over its gRPC repository API (``RepositoryModelLoad``, one channel).

Each arm's p50 / p99 / max of the inference requests, medians over rounds. Triton's HTTP
server (libevhtp) binds each connection to one of its worker threads, and the load
handler holds its thread for the whole load: the requests on connections bound to that
thread wait for the load.

Then the loads alone: ``k`` = 1..4 same-size models loaded at once over gRPC, each load
timed; the median seconds of one load at each ``k``, its ratio to one at a time, and the
member's CPU seconds per load (tritonserver and its stubs, from ``/proc``). The
largest ``k`` whose load is at most ``--slower`` times one alone is the recommended
``loads_per_member``. The models: ``residency_models``' MLPs (``--size-mb`` of weights,
100 MB: its largest class) written as the converter's ``cpu`` target would (a
Python-backend stub running ONNX Runtime, warm-up at batch 1), without its profiling.

Loopback addresses only; every process started is stopped on the way out.

    python -m loadtests.bench_member_loads [--quick] [--rounds 3] [--phase-s 20]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import tempfile
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from converters.model_dir import (
    ModelArtifact,
    ModelDirectoryRequest,
    sha256_file,
    write_model_directory,
)
from converters.repository import existing_versions
from converters.tiny import TINY_MODEL_NAME, TINY_WIDTH, build_tiny_model
from converters.triton_config import ModelConfigSpec, TensorSpec
from infergate.triton.local import LocalTriton, TritonEndpoints, TritonSettings
from loadtests.harness import ROOT, RUNTIME_ENV, median, num, percentile, reporter, table
from loadtests.proc_cpu import read_proc_stats, tree_ticks
from loadtests.residency_models import (
    INPUT_NAME,
    INPUT_WIDTH,
    MAX_BATCH,
    OUTPUT_NAME,
    OUTPUT_WIDTH,
    SizeClass,
    mlp_onnx,
)

# how the other models are loaded during the stream: not at all, over HTTP (one
# keep-alive connection; a new connection each), over gRPC
ARMS = ("none", "http", "http_new", "grpc")
AT_ONCE = (1, 2, 3, 4)
MODELS = ROOT / "results" / "bench_member_loads" / "models"  # written once, reused
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
say = reporter("bench_member_loads")


@dataclass(frozen=True)
class Setup:
    rate: float  # inference requests per second
    connections: int  # keep-alive connections they are spread over
    phase_s: float  # one arm, one round
    rounds: int
    load_rounds: int  # rounds of each k of the loads alone
    slower: float  # a load this many times one alone's is "slower"


# -- the figures (pure) ---------------------------------------------------------------

def stream_figures(latencies_ms: Sequence[float]) -> dict[str, float]:
    """p50 / p99 / max of one arm's inference requests (nan when none ended)."""
    if not latencies_ms:
        return {"p50_ms": float("nan"), "p99_ms": float("nan"), "max_ms": float("nan")}
    return {"p50_ms": percentile(latencies_ms, 50), "p99_ms": percentile(latencies_ms, 99),
            "max_ms": max(latencies_ms)}


def arm_order(round_index: int, arms: Sequence[str] = ARMS) -> list[str]:
    """The arms rotated by the round, so none always runs first (a warmer cache, a
    neighbour's burst)."""
    shift = round_index % len(arms)
    return [*arms[shift:], *arms[:shift]]


def stall_rows(rounds: Sequence[Mapping[str, Mapping[str, float]]]) -> list[dict[str, Any]]:
    """Per arm: the medians over rounds of its p50 / p99 / max (and of its loads, where
    it ran any), and its p99 against the baseline's."""
    rows = []
    for arm in ARMS:
        runs = [r[arm] for r in rounds if arm in r]
        if not runs:
            continue
        row: dict[str, Any] = {"arm": arm, "rounds": len(runs)}
        for key in ("p50_ms", "p99_ms", "max_ms", "requests", "loads"):
            row[key] = median(r.get(key, 0.0) for r in runs)
        rows.append(row)
    base = next((r["p99_ms"] for r in rows if r["arm"] == "none"), None)
    for row in rows:
        row["p99_vs_none"] = row["p99_ms"] / base if base else float("nan")
    return rows


def load_rows(seconds: Mapping[int, Sequence[float]], slower: float,
              cpu_s: Mapping[int, Sequence[float]] | None = None) -> list[dict[str, Any]]:
    """Per number of loads at once: the median seconds of one load, its ratio to one at
    a time, whether it is within ``slower`` of it; with ``cpu_s`` (the member's CPU
    seconds per batch of loads), the CPU seconds of one load and the cores a batch kept
    busy."""
    alone = median(seconds[1]) if seconds.get(1) else float("nan")
    rows = []
    for k in sorted(seconds):
        one = median(seconds[k])
        ratio = one / alone
        row = {"at_once": k, "loads": len(seconds[k]), "load_s": one, "vs_one": ratio,
               "loads_per_s": k / one, "within": bool(ratio <= slower)}
        if cpu_s and cpu_s.get(k):
            row["cpu_s_per_load"] = median(cpu_s[k]) / k
            row["cores_busy"] = median(cpu_s[k]) / one
        rows.append(row)
    return rows


def recommended_at_once(rows: Sequence[Mapping[str, Any]]) -> int:
    """The largest number of loads at once before which none got slower (1 at least)."""
    best = 1
    for row in sorted(rows, key=lambda r: r["at_once"]):
        if not row["within"]:
            break
        best = row["at_once"]
    return best


def markdown(stall: Sequence[Mapping[str, Any]], loads: Sequence[Mapping[str, Any]],
             setup: Setup) -> str:
    lines = [f"HTTP inference on one member at {setup.rate:g} rps over "
             f"{setup.connections} keep-alive connections, while other models load "
             f"(medians of {setup.rounds} rounds of {setup.phase_s:g} s):", "",
             table(("loads over", "loads", "p50 ms", "p99 ms", "max ms", "p99 / none"),
                   ((r["arm"], f"{r['loads']:.0f}", num(r["p50_ms"], ".1f"),
                     num(r["p99_ms"], ".1f"), num(r["max_ms"], ".1f"),
                     num(r["p99_vs_none"], ".2f") + "x") for r in stall))]
    if loads:
        best = recommended_at_once(loads)
        lines += ["", f"One load's seconds by loads at once on the member (over gRPC; "
                      f"{os.cpu_count()} cores here):", "",
                  table(("at once", "loads timed", "one load s", "vs one alone",
                         "loads / s", "CPU s per load", "cores busy"),
                        ((r["at_once"], r["loads"], num(r["load_s"], ".2f"),
                          num(r["vs_one"], ".2f") + "x", num(r["loads_per_s"], ".2f"),
                          num(r.get("cpu_s_per_load"), ".2f"), num(r.get("cores_busy"), ".1f"))
                         for r in loads)),
                  "", f"Loads at once before each gets more than {setup.slower:g}x "
                      f"slower: {best} (recommended loads_per_member)."]
        alone = loads[0].get("cores_busy")
        if alone:
            lines.append(f"One load alone keeps {alone:.1f} cores busy: a member with C "
                         f"cores to spare takes about C / {alone:.1f} loads at once.")
    return "\n".join(lines)


# -- the models -----------------------------------------------------------------------

def load_model_names(count: int, size_mb: int) -> list[str]:
    return [f"load{i:02d}_{size_mb}mb" for i in range(count)]


def build_models(repo: Path, names: Sequence[str], size_mb: int) -> None:
    """``tiny`` (the one inference goes to) and an MLP of ``size_mb`` MB of weights per
    name, each with weights of its own; a model already there is kept."""
    build_tiny_model(repo)
    hidden = SizeClass(f"{size_mb}MB", size_mb * 1_000_000, 1).hidden
    for index, name in enumerate(names):
        if existing_versions(repo, name):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "model.onnx"
            mlp_onnx(path, hidden, seed=5000 + index)
            write_model_directory(ModelDirectoryRequest(
                repo=repo, config=ModelConfigSpec(
                    name=name, target="cpu", max_batch_size=MAX_BATCH,
                    inputs=(TensorSpec(INPUT_NAME, "FP32", (INPUT_WIDTH,)),),
                    outputs=(TensorSpec(OUTPUT_NAME, "FP32", (OUTPUT_WIDTH,)),),
                    parameters={"intra_op_threads": "1"}),
                artifact=ModelArtifact({"model.onnx": path}, sha256_file(path)),
                warmup_inputs={1: {INPUT_NAME: np.zeros((1, INPUT_WIDTH), np.float32)}}))
        say(f"wrote {name} (H={hidden})")


# -- the member's clients -------------------------------------------------------------

class Repository:
    """Load / unload over one transport: Triton's HTTP API (one keep-alive client) or
    its gRPC one (one channel)."""

    def __init__(self, member: TritonEndpoints, transport: str) -> None:
        self.member, self.transport = member, transport
        self.http = httpx.AsyncClient(
            base_url=f"http://{member.http_url}", timeout=300, trust_env=False,
            # http_new: no connection kept, each call opens one
            limits=httpx.Limits(max_keepalive_connections=0 if transport == "http_new"
                                else None))
        self.channel = grpc.aio.insecure_channel(member.grpc_url)
        self.stub = pb_grpc.GRPCInferenceServiceStub(self.channel)

    async def load(self, model: str) -> float:
        """Seconds the load took."""
        began = time.perf_counter()
        if self.transport.startswith("http"):
            answer = await self.http.post(f"/v2/repository/models/{model}/load")
            if answer.status_code != 200:
                raise RuntimeError(f"loading {model}: {answer.text[:300]}")
        else:
            await self.stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(
                model_name=model), timeout=300)
        return time.perf_counter() - began

    async def unload(self, model: str) -> None:
        if self.transport.startswith("http"):
            await self.http.post(f"/v2/repository/models/{model}/unload")
        else:
            await self.stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(
                model_name=model), timeout=60)

    async def settled(self, timeout_s: float = 60.0) -> None:
        """Until no model of the member is loading or unloading (a stub still exiting
        takes CPU from the next measure)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            index = await self.stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=10)
            if not any(m.state in ("LOADING", "UNLOADING") for m in index.models):
                return
            await asyncio.sleep(0.1)

    async def close(self) -> None:
        await self.http.aclose()
        await self.channel.close()


@contextlib.asynccontextmanager
async def repository(member: TritonEndpoints, transport: str) -> AsyncIterator[Repository]:
    client = Repository(member, transport)
    try:
        yield client
    finally:
        await client.close()


def infer_body() -> bytes:
    x = np.linspace(-1, 1, TINY_WIDTH, dtype=np.float32)
    return json.dumps({"inputs": [{"name": "x", "shape": [1, TINY_WIDTH], "datatype": "FP32",
                                   "data": [float(v) for v in x]}]}).encode()


async def inference_stream(member: TritonEndpoints, setup: Setup, stop: asyncio.Event,
                           latencies_ms: list[float]) -> int:
    """Open loop at ``setup.rate`` over ``setup.connections`` clients of one connection
    each, round-robin, until ``stop``; each request's latency appended; the failures."""
    clients = [httpx.AsyncClient(base_url=f"http://{member.http_url}", timeout=30,
                                 trust_env=False, limits=httpx.Limits(max_connections=1))
               for _ in range(setup.connections)]
    body, path = infer_body(), f"/v2/models/{TINY_MODEL_NAME}/infer"
    failures = [0]

    async def one(client: httpx.AsyncClient) -> None:
        began = time.perf_counter()
        try:
            answer = await client.post(path, content=body)
            if answer.status_code != 200:
                failures[0] += 1
                return
        except httpx.HTTPError:
            failures[0] += 1
            return
        latencies_ms.append((time.perf_counter() - began) * 1000.0)

    tasks: set[asyncio.Task[None]] = set()
    try:
        await asyncio.gather(*(c.post(path, content=body) for c in clients))  # connect
        loop, sent = asyncio.get_running_loop(), 0
        began = loop.time()
        while not stop.is_set():
            task = asyncio.create_task(one(clients[sent % len(clients)]))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            sent += 1
            await asyncio.sleep(max(0.0, began + sent / setup.rate - loop.time()))
        if tasks:
            await asyncio.wait(tasks, timeout=30)
    finally:
        for task in tasks:
            task.cancel()
        for client in clients:
            await client.aclose()
    return failures[0]


# -- the arms -------------------------------------------------------------------------

async def cycle_loads(repo: Repository, models: Sequence[str], stop: asyncio.Event) -> int:
    """Load and unload ``models`` one after another until ``stop``; loads done."""
    done = 0
    while not stop.is_set():
        model = models[done % len(models)]
        await repo.load(model)
        await repo.unload(model)
        await repo.settled()
        done += 1
    return done


async def one_arm(member: TritonEndpoints, arm: str, models: Sequence[str],
                  setup: Setup) -> dict[str, float]:
    stop, latencies = asyncio.Event(), list[float]()
    async with repository(member, "grpc" if arm == "none" else arm) as repo:
        stream = asyncio.create_task(inference_stream(member, setup, stop, latencies))
        await asyncio.sleep(1.0)  # connections open and warm
        latencies.clear()
        loads = asyncio.create_task(cycle_loads(repo, models, stop)) if arm != "none" \
            else None
        await asyncio.sleep(setup.phase_s)
        stop.set()
        failures = await stream
        done = await loads if loads is not None else 0
        await repo.settled()
    return {**stream_figures(latencies), "requests": float(len(latencies)),
            "failures": float(failures), "loads": float(done)}


async def loads_at_once(member: TritonEndpoints, server_pid: int, models: Sequence[str],
                        setup: Setup) -> tuple[dict[int, list[float]], dict[int, list[float]]]:
    """Per k: the seconds of each load of ``k`` loaded at once over gRPC, and the CPU
    seconds the member (tritonserver and its stubs) spent on each batch."""
    seconds: dict[int, list[float]] = {k: [] for k in AT_ONCE}
    cpu_s: dict[int, list[float]] = {k: [] for k in AT_ONCE}
    async with repository(member, "grpc") as repo:
        for r in range(setup.load_rounds):
            for k in AT_ONCE if r % 2 == 0 else tuple(reversed(AT_ONCE)):
                batch = [models[(r + i) % len(models)] for i in range(k)]
                before = tree_ticks(server_pid, read_proc_stats())
                took = await asyncio.gather(*(repo.load(m) for m in batch))
                cpu_s[k].append((tree_ticks(server_pid, read_proc_stats()) - before)
                                / CLOCK_TICKS)
                seconds[k] += took
                await asyncio.gather(*(repo.unload(m) for m in batch))
                await repo.settled()
                say(f"round {r + 1}: {k} at once: " + ", ".join(f"{s:.2f}" for s in took)
                    + f" s, {cpu_s[k][-1]:.2f} CPU s")
    return seconds, cpu_s


async def measure(member: TritonEndpoints, server_pid: int, models: Sequence[str],
                  setup: Setup, arms: Sequence[str]) -> tuple[list[dict[str, Any]],
                                                              list[dict[str, Any]]]:
    rounds: list[dict[str, dict[str, float]]] = []
    for r in range(setup.rounds):
        figures = {}
        for arm in arm_order(r, arms):
            figures[arm] = await one_arm(member, arm, models, setup)
            f = figures[arm]
            say(f"round {r + 1} {arm}: {f['loads']:.0f} loads, {f['requests']:.0f} requests "
                f"({f['failures']:.0f} failed), p50 {f['p50_ms']:.1f} ms, p99 "
                f"{f['p99_ms']:.1f} ms, max {f['max_ms']:.1f} ms")
        rounds.append(figures)
    if not setup.load_rounds:
        return stall_rows(rounds), []
    seconds, cpu_s = await loads_at_once(member, server_pid, models, setup)
    return stall_rows(rounds), load_rows(seconds, setup.slower, cpu_s)


def run(setup: Setup, models_dir: Path = MODELS, size_mb: int = 100,
        arms: Sequence[str] = ARMS) -> str:
    names = load_model_names(max(AT_ONCE) + 1, size_mb)
    build_models(models_dir, names, size_mb)
    log = models_dir.parent / "triton.log"  # kept: what a member that died said
    with LocalTriton(TritonSettings(  # stopped on the way out, however it goes
            model_repository=models_dir, runtime_env=RUNTIME_ENV, log_file=log,
            models=(TINY_MODEL_NAME,))) as server:
        member = server.endpoints
        assert member is not None and server.pid is not None
        say(f"Triton at {member.http_url} (HTTP), {member.grpc_url} (gRPC), log {log}")
        try:
            stall, loads = asyncio.run(measure(member, server.pid, names, setup, arms))
        except Exception:
            say(f"failed; Triton {'runs' if server.running() else 'has exited'}, its log "
                f"ends:\n{server.log_tail()}")
            raise
    return markdown(stall, loads, setup)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="one round of 6 s per arm, one round of loads (a smoke run)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--phase-s", type=float, default=20.0)
    parser.add_argument("--load-rounds", type=int, default=5)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--slower", type=float, default=1.25)
    parser.add_argument("--size-mb", type=int, default=100,
                        help="MB of weights per loaded model (residency_models' largest)")
    parser.add_argument("--arms", default=",".join(ARMS), help="any of " + ",".join(ARMS))
    parser.add_argument("--models", type=Path, default=MODELS,
                        help="the models' repository (written there once, then reused)")
    args = parser.parse_args(argv)
    quick = args.quick
    setup = Setup(rate=args.rate, connections=args.connections,
                  phase_s=6.0 if quick else args.phase_s, rounds=1 if quick else args.rounds,
                  load_rounds=1 if quick else args.load_rounds, slower=args.slower)
    arms = [a for a in args.arms.split(",") if a]
    unknown = sorted(set(arms) - set(ARMS))
    if unknown:
        parser.error(f"unknown arms {unknown}: any of {', '.join(ARMS)}")
    print(run(setup, args.models, args.size_mb, arms))


if __name__ == "__main__":
    main()
