"""Residency that loses no request (issue 34): many models, two members, each member's
memory within a budget, traffic whose popularity is flat, then steep, and moves twice;
against every model resident, the same requests in every arm.

36 MLPs made by the converter (:mod:`loadtests.residency_models`: 14 of ~1 MB of weights,
12 of ~32 MB, 10 of ~100 MB; on this host their Python-backend stubs take 31, 64 and
131 MB), one pool of two local Triton members (explicit model control), one gateway (its
default data plane). Open-loop traffic: Poisson arrivals at ``--rate`` per second over
four phases of ``--phase-s`` seconds (:data:`~loadtests.residency_trace.PHASES`):

1. **flat**: each request's model drawn by Zipf popularity, s = 0.9, over a ranking;
2. **flat, reshuffled**: the ranking turned by half (its least popular half leads);
3. **steep**: s = 1.3 over the same ranking;
4. **steep, reshuffled**: the ranking turned by half again.

Each request is HTTP/JSON or gRPC (half each, drawn by the seeded generator) with a
deadline of ``--deadline-ms`` (15 s): HTTP sends the gateway's ``X-Request-Timeout-Ms``
and gives up 1 s after it; gRPC (grpc.aio with tritonclient's protobufs) sets its own
deadline (``timeout=``, sent as ``grpc-timeout``). Every answer is checked: the model it
names, and its output against the model's weights run here in numpy.

Arms, one after the other, each on fresh members:

1. **all resident**: every model loaded on both members, no residency: the reference.
   Each model's footprint is measured here (its stub's USS on the first member, or the
   converter's figure where larger); a budget is a fraction of their sum, per member.
2. **residency, half** and **residency, quarter** (``--budgets``): the pool has
   ``residency: {memory_budget_bytes: B, min_resident_s: 5}`` (``--knob`` for more),
   every model ``on_demand``, nothing loaded when the members start. At half, the two
   members together can hold every model once; at a quarter, half of them. The traffic
   begins once the gateway has settled (:func:`settled`: no load pending, the same
   models held a poll later), as the other arms' begins once their members have loaded
   theirs: with the gateway's default ``fill_free_room`` its free room is filled by
   then, the smallest models first, knowing nothing of the traffic to come.
3. **static** (only with ``--arms ...,static``): no residency; the first models of the
   catalogue that fit *B* loaded on both members, the others refused.

A request is a **hit** when answered right without the gateway's load-wait mark
(``infergate-load-wait-ms``: an HTTP header, gRPC trailing metadata), a **miss** when
answered right with it (it waited for a load), **failed** otherwise, by cause
(:func:`~loadtests.residency_figures.cause_of`: the status and the gateway's words):
``room_full`` (the waiting room is full), ``no_room`` (no member has room now),
``deadline`` (HTTP 504 or no answer by the deadline, gRPC DEADLINE_EXCEEDED),
``load_too_long`` (the load takes longer than the request may wait), ``not_found``
(404 / NOT_FOUND: every model here is registered), ``wrong_model`` (another model's
answer), ``other`` (their words kept in the JSON).

Per arm and phase: requests, hit ratio beside the best fixed placement known in advance
(per phase, the models most requested per byte packed into the budgets; the share of that
phase's requests they would take) and, in brackets, beside the best fixed placement that
keeps one member a room for the largest model it leaves out (what a placement serving
those models too holds while that room is taken; ``residency_trace.serving_placement``),
failures by cause, hits' p99 per protocol and its
ratio to the all-resident arm's, loads and evictions per minute. Per arm: accounted
(the gateway's ``used_bytes``) and real (the member's stubs' USS, and the anonymous part
of it, which the kernel cannot drop as it can a mapped weights file's clean pages; its
process tree's RSS above idle) memory peaks against the budget, sampled every second;
recovery (seconds after each reshuffle until a 10 s window's hit ratio is back to 90 % of
the best fixed placement's on the same requests, judged until the next reshuffle). Then
the goals of issue 34, each met or missed with its figure
(:func:`~loadtests.residency_figures.arm_goals`).

This module runs the arms (members, gateway, clients, memory sampler); the trace (phases,
popularity, schedule, best fixed placement, budgets) is in
:mod:`loadtests.residency_trace`, and the outcomes, summaries, goals, tables and plot are
in :mod:`loadtests.residency_figures`.

    python -m loadtests.bench_residency [--quick] [--rate 30] [--phase-s 60]
        [--deadline-ms 15000] [--budgets half,quarter] [--arms all,residency]
        [--seed 1] [--knob NAME=VALUE] [--out results/bench_residency]

The models are built once into ``results/bench_residency/models-<catalogue>``
(``--models``; 90 s on 2 cores) and reused. On 2 shared cores ``--quick`` (20 rps, 30 s
phases: the recovery after the last reshuffle is judged within 30 s only) took 7 minutes
(2 of them members' start-ups and stops); the defaults (30 rps, 60 s phases) take about
14 (12 of traffic).
``--arms residency`` alone takes the budgets from the footprints the last all-resident
arm measured (``measured-footprints.json`` beside the models).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import httpx
import numpy as np
import onnx
import psutil
import yaml
from onnx import numpy_helper
from tritonclient.grpc import service_pb2, service_pb2_grpc

from converters.repository import existing_versions
from infergate.processes import ROOT, GatewayProcess
from infergate.triton.local import STUB_NICE, LocalTriton, TritonEndpoints, TritonSettings
from loadtests.harness import (
    RUNTIME_ENV,
    GatewayFailed,
    gateway,
    gateway_yaml,
    num,
    page,
    publish,
    reporter,
    totals,
)
from loadtests.proc_cpu import component_ticks, read_proc_stats
from loadtests.residency_figures import (
    CAUSES,
    OK_CODES,
    Arm,
    ArmRun,
    Outcome,
    Setup,
    add_p99_ratios,
    arms_of,
    hit_share,
    load_wait,
    markdown,
    messages,
    pct,
    plot,
    summarise,
)
from loadtests.residency_models import (
    INPUT_NAME,
    INPUT_WIDTH,
    BenchModel,
    build_models,
    catalogue_name,
    request_body,
)
from loadtests.residency_trace import PHASES, Arrival, budget_of, first_fit, schedule

say = reporter("bench_residency")

LOAD_WAIT_HEADER = "infergate-load-wait-ms"
DEADLINE_HEADER = "X-Request-Timeout-Ms"
POOL = "cpu"
ARMS = ("all", "static", "residency")
DEFAULT_ARMS = ("all", "residency")
BUDGETS = {"half": 0.5, "quarter": 0.25}  # a member's budget: this share of every footprint
DEFAULT_KNOBS: dict[str, Any] = {"min_resident_s": 5}  # issue 34's check
MODELS = ROOT / "results" / "bench_residency" / f"models-{catalogue_name()}"
SETTLE_LIMIT_S = 120.0  # the most a residency arm waits for its gateway to settle
FOOTPRINTS = "measured-footprints.json"  # beside the models: the stubs' USS, last measured
CLIENT_SLACK_S = 1.0  # HTTP gives up this long after its deadline


# -- answers checked ------------------------------------------------------------------

def mlp_output(weights: Sequence[np.ndarray], x: np.ndarray) -> np.ndarray:
    """``relu(relu(x W1) W2) W3``: what every benchmark model computes."""
    w1, w2, w3 = weights
    return (np.maximum(np.maximum(x @ w1, 0) @ w2, 0) @ w3).astype(np.float32)


def expected_outputs(repo: Path, models: Sequence[str], x: np.ndarray) -> dict[str, np.ndarray]:
    """Each model's answer to ``x``, from the weights of its latest version on disk."""
    out = {}
    for m in models:
        version = existing_versions(repo, m)[-1]
        graph = onnx.load(str(repo / m / str(version) / "model.onnx")).graph
        weights = {w.name: numpy_helper.to_array(w) for w in graph.initializer}
        out[m] = mlp_output([weights[k] for k in ("w1", "w2", "w3")], x)
    return out


def right_answer(asked: str, named: str, got: np.ndarray | None,
                 expected: np.ndarray | None) -> bool:
    """The answer names the model asked for and gives its output (its name only where
    no output is expected)."""
    if named != asked:
        return False
    if expected is None:
        return True
    return got is not None and got.size == expected.size and bool(
        np.allclose(got.reshape(expected.shape), expected, rtol=1e-3, atol=1e-3))


# -- members and their memory ---------------------------------------------------------

def stub_model(cmdline: Sequence[str]) -> str | None:
    """The model a ``triton_python_backend_stub`` runs (its first argument is
    ``<repo>/<model>/<version>/model.py``); None for any other process."""
    if len(cmdline) < 2 or not cmdline[0].endswith("triton_python_backend_stub"):
        return None
    path = Path(cmdline[1])
    return path.parent.parent.name if path.name == "model.py" else None


@dataclass(frozen=True)
class TreeMemory:
    rss: int  # tritonserver and every descendant
    stubs_uss: dict[str, int]  # model -> its stubs' unique set size
    # model -> its stubs' anonymous memory: pages with no file behind them, which the
    # kernel cannot drop (it can drop a mapped file's clean pages, and a model's weights
    # file, mapped while its session is built, is such: USS counts it, this does not)
    stubs_anon: dict[str, int] = field(default_factory=dict)


def private_and_anonymous(pid: int) -> tuple[int, int]:
    """A process's unique set size (its private pages, as psutil's ``uss``) and its
    anonymous memory, bytes, from ``/proc/PID/smaps_rollup``."""
    kib = {}
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup:
            key, _, rest = line.partition(":")
            if key in ("Private_Clean", "Private_Dirty", "Private_Hugetlb", "Anonymous"):
                kib[key] = int(rest.split()[0])
    private = kib.get("Private_Clean", 0) + kib.get("Private_Dirty", 0) + kib.get(
        "Private_Hugetlb", 0)
    return private * 1024, kib.get("Anonymous", 0) * 1024


def tree_memory(pid: int) -> TreeMemory:
    root = psutil.Process(pid)
    rss, stubs, anon = 0, dict[str, int](), dict[str, int]()
    for proc in (root, *root.children(recursive=True)):
        with contextlib.suppress(psutil.Error, OSError):
            rss += proc.memory_info().rss
            model = stub_model(proc.cmdline())
            if model is not None:
                private, anonymous = private_and_anonymous(proc.pid)
                stubs[model] = stubs.get(model, 0) + private
                anon[model] = anon.get(model, 0) + anonymous
    return TreeMemory(rss, stubs, anon)


@dataclass
class Member:
    server: LocalTriton
    idle_rss: int = 0  # its tree's RSS with no model loaded

    @property
    def endpoints(self) -> TritonEndpoints:
        assert self.server.endpoints is not None
        return self.server.endpoints

    def memory(self) -> TreeMemory:
        assert self.server.pid is not None
        return tree_memory(self.server.pid)

    def load(self, models: Sequence[str]) -> None:
        with httpx.Client(base_url=f"http://{self.endpoints.http_url}", timeout=600,
                          trust_env=False) as c:
            for m in models:
                r = c.post(f"/v2/repository/models/{m}/load")
                if r.status_code != 200:
                    raise RuntimeError(f"loading {m} on {self.endpoints.http_url}: "
                                       f"{r.status_code} {r.text}")


@contextlib.contextmanager
def members(repo: Path, folder: Path, loaded: Sequence[str], count: int = 2,
            stub_nice: int = STUB_NICE) -> Iterator[list[Member]]:
    """``count`` Tritons over ``repo`` (explicit model control), each measured idle, then
    with ``loaded`` loaded (on every member at once); stopped on exit."""
    started: list[Member] = []
    try:
        for i in range(count):
            server = LocalTriton(TritonSettings(
                model_repository=repo, runtime_env=RUNTIME_ENV,
                log_file=folder / f"triton-{i}.log", startup_timeout_s=600,
                stub_nice=stub_nice))
            server.start()
            started.append(Member(server))
        for m in started:
            m.idle_rss = m.memory().rss
        errors: list[BaseException] = []

        def load(member: Member) -> None:
            try:
                member.load(loaded)
            except BaseException as err:  # noqa: BLE001 - raised below
                errors.append(err)

        threads = [threading.Thread(target=load, args=(m,)) for m in started]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        yield started
    finally:
        stops = [threading.Thread(target=m.server.stop) for m in started]
        for t in stops:
            t.start()
        for t in stops:
            t.join()


def member_view(view: Sequence[Mapping[str, Any]], member: TritonEndpoints
                ) -> Mapping[str, Any] | None:
    """The gateway's entry (``GET /v1/residency``) of ``member``: its key names the
    member's gRPC or HTTP address (``host:port``, perhaps after ``pool/``)."""
    for entry in view:
        key = str(entry.get("key", "")).rsplit("/", 1)[-1]
        if key in (member.grpc_url, member.http_url):
            return entry
    return None


def counters(text: str) -> dict[str, float]:
    """The gateway's loads and evictions so far, from its Prometheus page."""
    return {"loads": sum(totals(text, "infergate_model_loads", "reason").values()),
            "evictions": sum(totals(text, "infergate_model_evictions", "reason").values())}


class Sampler:
    """In a thread, every ``interval_s``: each member's memory, the gateway's view
    (``GET /v1/residency``: its used bytes) and the member's own (its stubs' USS, its
    tree's RSS above idle); at each of ``marks`` (monotonic seconds), the gateway's
    loads and evictions. Times in seconds after ``t0``, the schedule's start."""

    def __init__(self, url: str, members: Sequence[Member], t0: float,
                 marks: Sequence[float], interval_s: float = 1.0) -> None:
        self.url, self.members, self.t0, self.interval_s = url, members, t0, interval_s
        self.marks = list(marks)
        self.samples: list[dict[str, Any]] = []
        self.moves: list[dict[str, float]] = []  # at each mark
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _gateway_view(self, client: httpx.Client) -> list[dict[str, Any]]:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            r = client.get(f"{self.url}/v1/residency")
            if r.status_code == 200:
                return [m for p in r.json().get("pools", []) for m in p.get("members", [])]
        return []

    def _run(self) -> None:
        with httpx.Client(timeout=5, trust_env=False) as client:
            while not self._stop.is_set():
                if len(self.moves) < len(self.marks) and time.monotonic() >= self.marks[
                        len(self.moves)]:
                    with contextlib.suppress(httpx.HTTPError):
                        self.moves.append(counters(client.get(f"{self.url}/metrics").text))
                t = round(time.monotonic() - self.t0, 2)
                view = self._gateway_view(client)
                for i, m in enumerate(self.members):
                    with contextlib.suppress(psutil.Error):
                        mem = m.memory()
                        seen = member_view(view, m.endpoints) or {}
                        self.samples.append({
                            "t": t, "member": i, "stubs_uss": sum(mem.stubs_uss.values()),
                            "stubs_anon": sum(mem.stubs_anon.values()),
                            "rss_above_idle": mem.rss - m.idle_rss,
                            "used_bytes": seen.get("used_bytes"),
                            "models": len(mem.stubs_uss)})
                self._stop.wait(self.interval_s)


# -- the traffic ----------------------------------------------------------------------

@dataclass(frozen=True)
class Reply:
    code: str
    load_wait_ms: float | None
    message: str = ""
    named: str = ""  # the model the answer names
    output: np.ndarray | None = None


async def _http(session: aiohttp.ClientSession, url: str, body: bytes, model: str,
                deadline_ms: int) -> Reply:
    try:
        async with session.post(
                f"{url}/v2/models/{model}/infer", data=body,
                headers={"content-type": "application/json", DEADLINE_HEADER: str(deadline_ms)},
                timeout=aiohttp.ClientTimeout(total=deadline_ms / 1e3 + CLIENT_SLACK_S)
        ) as resp:
            raw = await resp.read()
            wait = load_wait(resp.headers.get(LOAD_WAIT_HEADER))
            if resp.status != 200:
                return Reply(str(resp.status), wait, raw[:300].decode(errors="replace"))
            data = json.loads(raw)
            output = np.asarray(data["outputs"][0]["data"], dtype=np.float32)
            return Reply("200", wait, "", str(data.get("model_name", "")), output)
    except TimeoutError:
        return Reply("timeout", None, f"no answer within {deadline_ms} ms + "
                                      f"{CLIENT_SLACK_S:g} s (the client gave up)")
    except (aiohttp.ClientError, ValueError, KeyError, IndexError) as exc:
        return Reply("error", None, f"{type(exc).__name__}: {exc}"[:300])


def metadata_wait(*metadata: Any) -> float | None:
    """The load-wait mark in gRPC metadata (trailing, then initial)."""
    for md in metadata:
        for key, value in md or ():
            if key == LOAD_WAIT_HEADER:
                return load_wait(value)
    return None


def grpc_request(model: str, x: np.ndarray) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model)
    tensor = request.inputs.add()
    tensor.name, tensor.datatype = INPUT_NAME, "FP32"
    tensor.shape.extend([1, INPUT_WIDTH])
    request.raw_input_contents.append(x.astype(np.float32).tobytes())
    return request


async def _grpc(stub: service_pb2_grpc.GRPCInferenceServiceStub,
                request: service_pb2.ModelInferRequest, deadline_ms: int) -> Reply:
    call = stub.ModelInfer(request, timeout=deadline_ms / 1e3)
    try:
        resp = await call
    except grpc.aio.AioRpcError as err:
        return Reply(err.code().name, metadata_wait(err.trailing_metadata(),
                                                    err.initial_metadata()),
                     (err.details() or "")[:300])
    wait = metadata_wait(await call.trailing_metadata(), await call.initial_metadata())
    output = (np.frombuffer(resp.raw_output_contents[0], dtype=np.float32)
              if resp.raw_output_contents else None)
    return Reply("OK", wait, "", resp.model_name, output)


def input_of(body: bytes) -> np.ndarray:
    """The input row a JSON request body carries (as the server reads it)."""
    return np.asarray(json.loads(body)["inputs"][0]["data"], dtype=np.float32)[None, :]


async def _drive(url: str, grpc_url: str, arrivals: Sequence[Arrival], deadline_ms: int,
                 t0: float, expected: Mapping[str, np.ndarray]) -> list[Outcome]:
    body = request_body()
    x = input_of(body)
    requests = {m: grpc_request(m, x) for m in {a.model for a in arrivals}}
    options = [("grpc.enable_http_proxy", 0)]
    connector = aiohttp.TCPConnector(limit=0)
    async with (aiohttp.ClientSession(connector=connector) as session,
                grpc.aio.insecure_channel(grpc_url, options=options) as channel):
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        loop = asyncio.get_running_loop()

        async def one(a: Arrival) -> Outcome:
            due = t0 + a.t
            await asyncio.sleep(max(0.0, due - loop.time()))
            reply = (await _http(session, url, body, a.model, deadline_ms)
                     if a.protocol == "http" else
                     await _grpc(stub, requests[a.model], deadline_ms))
            right = reply.code not in OK_CODES or right_answer(
                a.model, reply.named, reply.output, expected.get(a.model))
            # from the scheduled time: a late client's lag is the user's wait too
            return Outcome(round(a.t, 4), a.model, a.phase, a.protocol, reply.code,
                           round((loop.time() - due) * 1e3, 3), reply.load_wait_ms,
                           reply.message, right)

        return list(await asyncio.gather(*(one(a) for a in arrivals)))


def drive(url: str, grpc_url: str, arrivals: Sequence[Arrival], deadline_ms: int,
          t0: float, expected: Mapping[str, np.ndarray]) -> list[Outcome]:
    """Send ``arrivals`` open loop, each at ``t0`` (monotonic) plus its time whatever
    the answers do, over HTTP or gRPC as each says."""
    return asyncio.run(_drive(url, grpc_url, arrivals, deadline_ms, t0, expected))


# -- an arm ---------------------------------------------------------------------------

def arm_config(path: Path, arm: Arm, member_list: Sequence[Member], setup: Setup,
               budget: int | None) -> Path:
    pools = {POOL: [m.endpoints for m in member_list]}
    if arm.kind != "residency":
        return gateway_yaml(path, pools)
    gateway_yaml(path, pools, lifecycle=setup.repo,
                 models={m: {"on_demand": True} for m in setup.names})
    data = yaml.safe_load(path.read_text())
    data["pools"][0]["residency"] = {"memory_budget_bytes": budget, **setup.residency}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@contextlib.contextmanager
def started_gateway(config: Path, log_dir: Path, tries: int = 3,
                    source: Path | None = None) -> Iterator[GatewayProcess]:
    """:func:`gateway`, started again when it fails to start (on a shared host another
    process may take its free port between the pick and the bind)."""
    for attempt in range(1, tries + 1):
        with contextlib.ExitStack() as stack:
            try:
                gw = stack.enter_context(gateway(config, log_dir, source=source))
            except GatewayFailed as err:
                if attempt == tries:
                    raise
                say(f"the gateway did not start ({err}): once more")
                continue
            yield gw
            return


def run_arm(arm: Arm, setup: Setup, folder: Path, budget: int | None, loaded: Sequence[str],
            expected: Mapping[str, np.ndarray]) -> ArmRun:
    folder.mkdir(parents=True, exist_ok=True)
    arrivals = schedule(setup.names, setup.rate, setup.phase_s, setup.seed)
    say(f"{arm.title}: starting 2 members ({len(loaded)} models loaded on each)")
    with members(setup.repo, folder, loaded, stub_nice=setup.stub_nice) as group:
        config = arm_config(folder / "gateway.yaml", arm, group, setup, budget)
        with started_gateway(config, folder / "gateway", source=arm.source) as gw:
            url = f"http://{gw.http_url}"
            settle = settled(url) if arm.kind == "residency" else None
            if settle is not None:
                say(f"{arm.title}: settled in {settle[0]:.1f} s, {settle[1]} models held")
            say(f"{arm.title}: {len(arrivals)} requests over "
                f"{len(PHASES) * setup.phase_s:g} s")
            t0 = time.monotonic() + 1.0
            marks = [t0 + k * setup.phase_s for k in range(len(PHASES))]
            pids = (gw.proc.pid, [m.server.pid or 0 for m in group], os.getpid())
            before, started = component_ticks(read_proc_stats(), *pids), time.monotonic()
            with Sampler(url, group, t0, marks) as sampler:
                outcomes = drive(url, gw.grpc_url, arrivals, setup.deadline_ms, t0, expected)
            after, seconds = component_ticks(read_proc_stats(), *pids), \
                time.monotonic() - started
            moves = [*sampler.moves, counters(page(f"{url}/metrics"))]
            keep_record(folder, url, outcomes)
            stubs = group[0].memory().stubs_uss
        return ArmRun(outcomes, sampler.samples, moves, stubs, cores(before, after, seconds),
                      settle)


def settled(url: str, limit_s: float = SETTLE_LIMIT_S, every_s: float = 1.5
            ) -> tuple[float, int]:
    """Wait until the residency has settled: no holding queued, loading or warming, and
    the same holdings a poll later (``every_s``: longer than a round, so a fill's next
    load would show), at most ``limit_s``. Seconds it took, and the models held then."""
    start, before = time.monotonic(), None
    while True:
        report = httpx.get(f"{url}/v1/residency", timeout=10).json()
        now = sorted((m["key"], h["model"], h["state"]) for p in report["pools"]
                     for m in p["members"] for h in m["models"])
        if now == before and all(state == "resident" for *_, state in now) \
                or time.monotonic() - start > limit_s:
            return time.monotonic() - start, len(now)
        before = now
        time.sleep(every_s)


def cores(before: Mapping[str, int], after: Mapping[str, int], seconds: float
          ) -> dict[str, float]:
    """What each part spent between two readings of :func:`component_ticks`, in cores
    (CPU seconds per second of the arm)."""
    per_s = os.sysconf("SC_CLK_TCK") * max(seconds, 1e-9)
    return {k: round((after[k] - before.get(k, 0)) / per_s, 3) for k in after}


def keep_record(folder: Path, url: str, outcomes: Sequence[Outcome]) -> None:
    """Every request's outcome, the failures' words by cause and the gateway's last word
    on residency, in the arm's folder (for a look at what went wrong)."""
    with (folder / "requests.jsonl").open("w") as f:
        f.writelines(json.dumps(asdict(o)) + "\n" for o in outcomes)
    (folder / "failures.json").write_text(json.dumps(
        {c: messages(outcomes, c) for c in CAUSES}, indent=1) + "\n")
    with contextlib.suppress(httpx.HTTPError):
        (folder / "residency.json").write_text(httpx.get(f"{url}/v1/residency",
                                                         timeout=10).text)


# -- the run --------------------------------------------------------------------------

def known_footprints(models: Sequence[BenchModel], measured_file: Path) -> dict[str, int]:
    """Each model's footprint: the converter's figure (its weights' size where it has
    none), or what an earlier all-resident arm measured on a member where larger."""
    measured: dict[str, int] = {}
    with contextlib.suppress(OSError, ValueError):
        measured = {k: int(v) for k, v in json.loads(measured_file.read_text()).items()}
    return {m.name: max(m.footprint_bytes or m.weight_bytes, measured.get(m.name, 0))
            for m in models}


def run(rate: float = 30.0, phase_s: float = 60.0, seed: int = 1, deadline_ms: int = 15_000,
        kinds: Sequence[str] = DEFAULT_ARMS, budgets: Sequence[str] = tuple(BUDGETS),
        out: Path | None = None, repo: Path = MODELS,
        knobs: Mapping[str, Any] | None = None,
        source: Path | None = None, stub_nice: int = STUB_NICE,
        source_last: bool = False) -> list[dict[str, Any]]:
    out = out or ROOT / "results" / "bench_residency"
    models = build_models(repo, say=say)
    setup = Setup(models, repo, rate, phase_s, seed, deadline_ms,
                  {**DEFAULT_KNOBS, **(knobs or {})}, stub_nice)
    names = setup.names
    expected = expected_outputs(repo, names, input_of(request_body()))
    footprints = known_footprints(models, repo / FOOTPRINTS)
    scratch = out / "runs" / time.strftime("%Y%m%d-%H%M%S")
    rows: list[dict[str, Any]] = []
    for arm in arms_of(kinds, budgets, source, source_last):
        budget = None if arm.budget is None else budget_of(footprints, BUDGETS[arm.budget])
        loaded = (names if arm.kind == "all" else [] if arm.kind == "residency"
                  else first_fit(names, footprints, budget or 0))
        result = run_arm(arm, setup, scratch / arm.folder, budget, loaded, expected)
        if arm.kind == "all":
            footprints = {m: max(footprints[m], result.stubs_uss.get(m, 0)) for m in names}
            (repo / FOOTPRINTS).write_text(json.dumps(result.stubs_uss, indent=1) + "\n")
            say(f"measured footprints: {sum(result.stubs_uss.values()) / 1e6:.0f} MB of "
                f"stubs' USS for {len(result.stubs_uss)} models")
        rows.append(summarise(arm, result, setup, budget, footprints))
        r = rows[-1]
        say(f"{r['arm']}: hits {pct(hit_share(result.outcomes))}, failed {r['failed']} "
            f"{r['causes']}, hits p99 HTTP {num(r['hits_p99_ms']['http'], '.1f')} ms, "
            f"gRPC {num(r['hits_p99_ms']['grpc'], '.1f')} ms")
    add_p99_ratios(rows)
    return rows


def parse_knob(text: str) -> tuple[str, Any]:
    """``NAME=VALUE`` with VALUE read as YAML (a number, a mapping...)."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=VALUE")
    return name.strip(), yaml.safe_load(value)


def _names(text: str, known: Sequence[str], what: str,
           parser: argparse.ArgumentParser) -> list[str]:
    chosen = [a.strip() for a in text.split(",") if a.strip()]
    unknown = set(chosen) - set(known)
    if unknown:
        parser.error(f"unknown {what} {sorted(unknown)}: choose from {', '.join(known)}")
    return chosen


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="20 rps, 30 s phases")
    parser.add_argument("--rate", type=float, default=None, help="requests per second (30)")
    parser.add_argument("--phase-s", type=float, default=None, help="seconds per phase (60)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--deadline-ms", type=int, default=15_000)
    parser.add_argument("--arms", default=",".join(DEFAULT_ARMS),
                        help="any of all,static,residency")
    parser.add_argument("--budgets", default=",".join(BUDGETS),
                        help="a member's budget, of every footprint together: half,quarter")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bench_residency")
    parser.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE",
                        help="a residency knob of the pool (default min_resident_s=5; for "
                             "example waiting_room={max_requests: 128}); repeatable")
    parser.add_argument("--source", type=Path, default=None,
                        help="another checkout (git worktree add DIR REV): its residency "
                             "runs beside this one's at each budget, before and after")
    parser.add_argument("--source-last", action="store_true",
                        help="with --source: this checkout's arm first, the other's after "
                             "it (to see whether the arms' order moves the figures)")
    parser.add_argument("--models", type=Path, default=MODELS,
                        help="the models' repository (built there once, then reused)")
    parser.add_argument("--stub-nice", type=int, default=STUB_NICE,
                        help="how far below its member's server each Python-backend stub "
                             f"starts, where the host allows it back (default {STUB_NICE}; "
                             "0: at the server's priority, as before)")
    args = parser.parse_args(argv)
    kinds = _names(args.arms, ARMS, "arms", parser)
    budgets = _names(args.budgets, tuple(BUDGETS), "budgets", parser)
    rate = args.rate or (20.0 if args.quick else 30.0)
    phase_s = args.phase_s or (30.0 if args.quick else 60.0)
    knobs = dict(parse_knob(k) for k in args.knob)
    rows = run(rate, phase_s, args.seed, args.deadline_ms, kinds, budgets, args.out,
               args.models, knobs, args.source, args.stub_nice, args.source_last)
    publish(rows, markdown, plot, args.out, "bench_residency", say)


if __name__ == "__main__":
    main()
