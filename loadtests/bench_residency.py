"""Residency that loses no request (issue 34): many models, two members, each member's
memory within a budget, traffic whose popularity is flat, then steep, and moves twice;
against every model resident, the same requests in every arm.

36 MLPs made by the converter (:mod:`loadtests.residency_models`: 14 of ~1 MB of weights,
12 of ~32 MB, 10 of ~100 MB; on this host their Python-backend stubs take 31, 64 and
131 MB), one pool of two local Triton members (explicit model control), one gateway (its
default data plane). Open-loop traffic: Poisson arrivals at ``--rate`` per second over
four phases of ``--phase-s`` seconds (:data:`PHASES`):

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
   every model ``on_demand``, nothing loaded at start. At half, the two members together
   can hold every model once; at a quarter, half of them.
3. **static** (only with ``--arms ...,static``): no residency; the first models of the
   catalogue that fit *B* loaded on both members, the others refused.

A request is a **hit** when answered right without the gateway's load-wait mark
(``infergate-load-wait-ms``: an HTTP header, gRPC trailing metadata), a **miss** when
answered right with it (it waited for a load), **failed** otherwise, by cause
(:func:`cause_of`: the status and the gateway's words): ``room_full`` (the waiting room
is full), ``no_room`` (no member has room now), ``deadline`` (HTTP 504 or no answer by the
deadline, gRPC DEADLINE_EXCEEDED), ``load_too_long`` (the load takes longer than the
request may wait), ``not_found`` (404 / NOT_FOUND: every model here is registered),
``wrong_model`` (another model's answer), ``other`` (their words kept in the JSON).

Per arm and phase: requests, hit ratio beside the best fixed placement known in advance
(per phase, the models most requested per byte packed into the budgets; the share of that
phase's requests they would take), failures by cause, hits' p99 per protocol and its
ratio to the all-resident arm's, loads and evictions per minute. Per arm: accounted
(the gateway's ``used_bytes``) and real (the member's stubs' USS; its process tree's RSS
above idle) memory peaks against the budget, sampled every second; recovery (seconds
after each reshuffle until a 10 s window's hit ratio is back to 90 % of the best fixed
placement's on the same requests, judged until the next reshuffle). Then the goals of
issue 34, each met or missed with its figure (:func:`goals`).

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
import bisect
import contextlib
import json
import math
import threading
import time
from collections import Counter
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
from infergate.triton.local import LocalTriton, TritonEndpoints, TritonSettings
from loadtests.harness import (
    RUNTIME_ENV,
    GatewayFailed,
    figure,
    gateway,
    gateway_yaml,
    num,
    page,
    percentile,
    publish,
    reporter,
    table,
    totals,
)
from loadtests.residency_models import (
    INPUT_NAME,
    INPUT_WIDTH,
    BenchModel,
    build_models,
    catalogue_name,
    request_body,
)

say = reporter("bench_residency")

LOAD_WAIT_HEADER = "infergate-load-wait-ms"
DEADLINE_HEADER = "X-Request-Timeout-Ms"
POOL = "cpu"
FLAT_S, STEEP_S = 0.9, 1.3
PROTOCOLS = ("http", "grpc")
ARMS = ("all", "static", "residency")
DEFAULT_ARMS = ("all", "residency")
BUDGETS = {"half": 0.5, "quarter": 0.25}  # a member's budget: this share of every footprint
DEFAULT_KNOBS: dict[str, Any] = {"min_resident_s": 5}  # issue 34's check
MODELS = ROOT / "results" / "bench_residency" / f"models-{catalogue_name()}"
FOOTPRINTS = "measured-footprints.json"  # beside the models: the stubs' USS, last measured
CAUSES = ("room_full", "no_room", "deadline", "load_too_long", "not_found", "wrong_model",
          "other")
OK_CODES = ("200", "OK")
WINDOW_S = 10.0  # the recovery's window
HELD_MS = 1000.0  # a failure answered later than this was held before it was refused
CLIENT_SLACK_S = 1.0  # HTTP gives up this long after its deadline
GOAL_FAILED, GOAL_HIT_GAP, GOAL_P99_X = 0.01, 0.02, 1.2
GOAL_REAL_X, GOAL_RECOVERY_S, GOAL_RECOVERED = 1.05, 60.0, 0.90


# -- the schedule (pure) --------------------------------------------------------------

@dataclass(frozen=True)
class Phase:
    label: str
    s: float  # Zipf exponent
    ranking: int  # which popularity order: a new one is a reshuffle


PHASES = (Phase("flat", FLAT_S, 0), Phase("flat, reshuffled", FLAT_S, 1),
          Phase("steep", STEEP_S, 1), Phase("steep, reshuffled", STEEP_S, 2))


def zipf_weights(n: int, s: float) -> np.ndarray:
    """Probability of each rank 1..n under Zipf's law with exponent ``s``."""
    w = np.arange(1, n + 1, dtype=np.float64) ** -s
    return w / w.sum()


def rankings(models: Sequence[str], seed: int, count: int) -> list[list[str]]:
    """``count`` popularity orders: a shuffle of ``models``, then each the last turned by
    half (its least popular half leads, each half shuffled again): every reshuffle puts
    models that were unpopular on top."""
    rng = np.random.default_rng([seed, 1])  # apart from the arrivals' generator
    order = [models[i] for i in rng.permutation(len(models))]
    out = [order]
    for _ in range(count - 1):
        half = len(order) // 2
        top, bottom = order[:half], order[half:]
        order = ([bottom[i] for i in rng.permutation(len(bottom))]
                 + [top[i] for i in rng.permutation(len(top))])
        out.append(order)
    return out


def popularity(models: Sequence[str], seed: int,
               phases: Sequence[Phase] = PHASES) -> list[dict[str, float]]:
    """Per phase, each model's probability of being asked for."""
    orders = rankings(models, seed, max(p.ranking for p in phases) + 1)
    return [dict(zip(orders[p.ranking], zipf_weights(len(models), p.s), strict=True))
            for p in phases]


def reshuffles(phase_s: float, phases: Sequence[Phase] = PHASES) -> list[float]:
    """Seconds of schedule at which the ranking changes."""
    return [i * phase_s for i in range(1, len(phases))
            if phases[i].ranking != phases[i - 1].ranking]


@dataclass(frozen=True)
class Arrival:
    t: float  # seconds after the schedule's start
    model: str
    phase: int  # index into the phases
    protocol: str  # http | grpc


def schedule(models: Sequence[str], rate: float, phase_s: float, seed: int,
             phases: Sequence[Phase] = PHASES) -> list[Arrival]:
    """Poisson arrivals at ``rate`` per second for every phase of ``phase_s``; each
    request's model drawn by its phase's popularity, its protocol by a coin. The same
    arguments give the same schedule (every arm runs the same traffic)."""
    rng = np.random.default_rng(seed)
    tables = [(list(p), np.fromiter(p.values(), dtype=np.float64))
              for p in popularity(models, seed, phases)]
    out: list[Arrival] = []
    t = float(rng.exponential(1 / rate))
    while t < len(phases) * phase_s:
        phase = int(t // phase_s)
        names, weights = tables[phase]
        model = names[int(rng.choice(len(names), p=weights))]
        out.append(Arrival(t, model, phase, PROTOCOLS[int(rng.random() < 0.5)]))
        t += float(rng.exponential(1 / rate))
    return out


# -- the best fixed placement (pure) --------------------------------------------------

def best_placement(p: Mapping[str, float], footprints: Mapping[str, int],
                   budget: int | None, members: int = 2) -> frozenset[str]:
    """What a placement that knew the popularity ``p`` in advance holds, never moving:
    the models most requested per byte first, each on the first member it still fits
    (a greedy knapsack per member). Every model when ``budget`` is None."""
    if budget is None:
        return frozenset(p)
    room, held = [budget] * members, set()
    for m in sorted(p, key=lambda m: (-p[m] / footprints[m], m)):
        slot = next((i for i, r in enumerate(room) if footprints[m] <= r), None)
        if slot is not None:
            room[slot] -= footprints[m]
            held.add(m)
    return frozenset(held)


def placements(models: Sequence[str], footprints: Mapping[str, int], budget: int | None,
               seed: int, phases: Sequence[Phase] = PHASES) -> list[frozenset[str]]:
    """The best fixed placement of each phase."""
    return [best_placement(p, footprints, budget) for p in popularity(models, seed, phases)]


def ideal_hit_share(models: Sequence[str], footprints: Mapping[str, int],
                    budget: int | None, seed: int,
                    phases: Sequence[Phase] = PHASES) -> list[float]:
    """Per phase, the share of requests the best fixed placement takes, expected."""
    return [float(sum(p[m] for m in best_placement(p, footprints, budget)))
            for p in popularity(models, seed, phases)]


# -- outcomes (pure) ------------------------------------------------------------------

def cause_of(code: str, message: str, right: bool = True) -> str | None:
    """Why a request failed (None: it did not), from its status (an HTTP status, a gRPC
    code's name, ``timeout``/``error``: no answer) and the gateway's words."""
    if code in OK_CODES:
        return None if right else "wrong_model"
    text = message.lower()
    if "waiting room" in text and "full" in text:
        return "room_full"
    if "has room for it now" in text or "more than any member" in text:
        return "no_room"
    if "longer than this request may wait" in text:
        return "load_too_long"
    if code in ("404", "NOT_FOUND"):
        return "not_found"
    if code in ("504", "DEADLINE_EXCEEDED", "timeout"):
        return "deadline"
    return "other"


@dataclass(frozen=True)
class Outcome:
    t: float  # scheduled send, seconds after the start
    model: str
    phase: int
    protocol: str
    code: str  # HTTP status, gRPC code's name, or timeout / error (no answer)
    latency_ms: float  # from the scheduled send
    load_wait_ms: float | None  # the gateway's mark: it waited for a load
    message: str = ""  # a failed request's answer (its start)
    right: bool = True  # answered by the model asked for, with its output

    @property
    def cause(self) -> str | None:
        return cause_of(self.code, self.message, self.right)

    @property
    def kind(self) -> str:
        """``hit``, ``miss`` (answered after a load) or ``failed``."""
        if self.cause is not None:
            return "failed"
        return "hit" if self.load_wait_ms is None else "miss"


def load_wait(value: str | bytes | None) -> float | None:
    """The load-wait mark's milliseconds (None: absent; not a number counts as 0)."""
    if value is None:
        return None
    try:
        return float(value.decode() if isinstance(value, bytes) else value)
    except ValueError:
        return 0.0


def hit_share(outcomes: Sequence[Outcome]) -> float | None:
    return sum(o.kind == "hit" for o in outcomes) / len(outcomes) if outcomes else None


def failed_share(outcomes: Sequence[Outcome]) -> float | None:
    return sum(o.kind == "failed" for o in outcomes) / len(outcomes) if outcomes else None


def causes(outcomes: Sequence[Outcome]) -> dict[str, int]:
    """Failed requests by cause, in :data:`CAUSES` order (none: not listed)."""
    seen = Counter(o.cause for o in outcomes if o.cause is not None)
    return {c: seen[c] for c in CAUSES if seen[c]}


def hits_p99(outcomes: Sequence[Outcome], protocol: str, q: float = 99) -> float | None:
    values = [o.latency_ms for o in outcomes if o.kind == "hit" and o.protocol == protocol]
    return round(percentile(values, q), 2) if values else None


def held_then_failed(outcomes: Sequence[Outcome], held_ms: float = HELD_MS) -> int:
    """Failures answered more than ``held_ms`` after their send: held, then refused (or
    cut at their deadline). A refusal known at once comes back within milliseconds."""
    return sum(o.kind == "failed" and o.latency_ms > held_ms for o in outcomes)


def failed_after_load(outcomes: Sequence[Outcome]) -> int:
    """Failures carrying the load-wait mark: they waited for a load, which then served
    them not (their model evicted or gone before they were sent on)."""
    return sum(o.kind == "failed" and o.load_wait_ms is not None for o in outcomes)


def messages(outcomes: Sequence[Outcome], cause: str = "other") -> dict[str, int]:
    """The answers of the failures of ``cause``, most frequent first."""
    return dict(Counter(f"{o.code}: {o.message}" for o in outcomes
                        if o.cause == cause).most_common())


def recovery_s(outcomes: Sequence[Outcome], best: Sequence[frozenset[str]], start: float,
               stop: float, window_s: float = WINDOW_S, threshold: float = GOAL_RECOVERED,
               stride_s: float = 1.0) -> float | None:
    """Seconds after ``start`` (a reshuffle) until the requests of a ``window_s`` window
    (wholly after it, ending by ``stop``) hit at least ``threshold`` of what the best
    fixed placement of each one's phase (``best``) would have hit: that window's end
    minus ``start``. None: no such window."""
    after = sorted((o for o in outcomes if start <= o.t < stop), key=lambda o: o.t)
    times = [o.t for o in after]
    end = start + window_s
    while end <= stop + 1e-9:
        inside = after[bisect.bisect_left(times, end - window_s):bisect.bisect_left(times, end)]
        ideal = sum(o.model in best[o.phase] for o in inside)
        hits = sum(o.kind == "hit" for o in inside)
        if inside and hits >= threshold * ideal:
            return round(end - start, 1)
        end += stride_s
    return None


def hit_series(outcomes: Sequence[Outcome], bin_s: float = 5.0) -> list[tuple[float, float]]:
    """(bin's middle, hit share) per ``bin_s`` of schedule with any request in it."""
    bins: dict[int, list[Outcome]] = {}
    for o in outcomes:
        bins.setdefault(int(o.t // bin_s), []).append(o)
    return [(round((b + 0.5) * bin_s, 2), round(hit_share(v) or 0.0, 4))
            for b, v in sorted(bins.items())]


# -- budgets (pure) -------------------------------------------------------------------

def budget_of(footprints: Mapping[str, int], fraction: float) -> int:
    """A member's budget: ``fraction`` of every model's footprint together."""
    return math.ceil(fraction * sum(footprints.values()))


def first_fit(models: Sequence[str], footprints: Mapping[str, int], budget: int) -> list[str]:
    """The static baseline's models: in catalogue order, each that still fits ``budget``."""
    kept, used = [], 0
    for m in models:
        if used + footprints[m] <= budget:
            kept.append(m)
            used += footprints[m]
    return kept


@dataclass(frozen=True)
class Arm:
    kind: str  # all | static | residency
    budget: str | None = None  # a key of BUDGETS; None: every model resident

    @property
    def title(self) -> str:
        return "all resident" if self.kind == "all" else f"{self.kind}, {self.budget}"

    @property
    def folder(self) -> str:
        """Its scratch folder's name (no space: HAProxy's paths allow none)."""
        return self.kind if self.budget is None else f"{self.kind}-{self.budget}"


def arms_of(kinds: Sequence[str], budgets: Sequence[str]) -> list[Arm]:
    """The arms to run, in order: all resident first (the reference), then each kind at
    each budget."""
    out = [Arm("all")] if "all" in kinds else []
    return out + [Arm(k, b) for k in ("static", "residency") if k in kinds for b in budgets]


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


def tree_memory(pid: int) -> TreeMemory:
    root = psutil.Process(pid)
    rss, stubs = 0, dict[str, int]()
    for proc in (root, *root.children(recursive=True)):
        with contextlib.suppress(psutil.Error):
            rss += proc.memory_info().rss
            model = stub_model(proc.cmdline())
            if model is not None:
                stubs[model] = stubs.get(model, 0) + proc.memory_full_info().uss
    return TreeMemory(rss, stubs)


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
def members(repo: Path, folder: Path, loaded: Sequence[str], count: int = 2
            ) -> Iterator[list[Member]]:
    """``count`` Tritons over ``repo`` (explicit model control), each measured idle, then
    with ``loaded`` loaded (on every member at once); stopped on exit."""
    started: list[Member] = []
    try:
        for i in range(count):
            server = LocalTriton(TritonSettings(
                model_repository=repo, runtime_env=RUNTIME_ENV,
                log_file=folder / f"triton-{i}.log", startup_timeout_s=600))
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

@dataclass
class Setup:
    models: list[BenchModel]
    repo: Path
    rate: float
    phase_s: float
    seed: int
    deadline_ms: int
    residency: dict[str, Any] = field(default_factory=dict)  # knobs beyond the budget

    @property
    def names(self) -> list[str]:
        return [m.name for m in self.models]


@dataclass
class ArmRun:
    outcomes: list[Outcome]
    samples: list[dict[str, Any]]
    moves: list[dict[str, float]]  # loads and evictions at each phase's start, then the end
    stubs_uss: dict[str, int]  # the first member's stubs at the end


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
def started_gateway(config: Path, log_dir: Path, tries: int = 3) -> Iterator[GatewayProcess]:
    """:func:`gateway`, started again when it fails to start (on a shared host another
    process may take its free port between the pick and the bind)."""
    for attempt in range(1, tries + 1):
        with contextlib.ExitStack() as stack:
            try:
                gw = stack.enter_context(gateway(config, log_dir))
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
    with members(setup.repo, folder, loaded) as group:
        config = arm_config(folder / "gateway.yaml", arm, group, setup, budget)
        with started_gateway(config, folder / "gateway") as gw:
            url = f"http://{gw.http_url}"
            say(f"{arm.title}: {len(arrivals)} requests over "
                f"{len(PHASES) * setup.phase_s:g} s")
            t0 = time.monotonic() + 1.0
            marks = [t0 + k * setup.phase_s for k in range(len(PHASES))]
            with Sampler(url, group, t0, marks) as sampler:
                outcomes = drive(url, gw.grpc_url, arrivals, setup.deadline_ms, t0, expected)
            moves = [*sampler.moves, counters(page(f"{url}/metrics"))]
            keep_record(folder, url, outcomes)
            stubs = group[0].memory().stubs_uss
        return ArmRun(outcomes, sampler.samples, moves, stubs)


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


# -- the figures (pure) ---------------------------------------------------------------

def phase_row(outcomes: Sequence[Outcome], best: frozenset[str], phase: Phase,
              moves: tuple[Mapping[str, float], Mapping[str, float]] | None,
              minutes: float) -> dict[str, Any]:
    before, after = moves or ({}, {})
    return {
        "phase": phase.label, "requests": len(outcomes), "hit_share": hit_share(outcomes),
        "best_fixed_share": (sum(o.model in best for o in outcomes) / len(outcomes)
                             if outcomes else None),
        "failed": sum(o.kind == "failed" for o in outcomes), "causes": causes(outcomes),
        "held_then_failed": held_then_failed(outcomes),
        "hits_p99_ms": {p: hits_p99(outcomes, p) for p in PROTOCOLS},
        "loads_per_min": (round((after["loads"] - before["loads"]) / minutes, 2)
                          if moves else None),
        "evictions_per_min": (round((after["evictions"] - before["evictions"]) / minutes, 2)
                              if moves else None),
    }


def peak(samples: Sequence[Mapping[str, Any]], key: str) -> float | None:
    return max((s[key] for s in samples if s.get(key) is not None), default=None)


def summarise(arm: Arm, run: ArmRun, setup: Setup, budget: int | None,
              footprints: Mapping[str, int]) -> dict[str, Any]:
    out = run.outcomes
    best = placements(setup.names, footprints, budget, setup.seed)
    by_phase = [[o for o in out if o.phase == i] for i in range(len(PHASES))]
    moves = run.moves if len(run.moves) == len(PHASES) + 1 else None
    phases = [phase_row(by_phase[i], best[i], PHASES[i],
                        (moves[i], moves[i + 1]) if moves else None, setup.phase_s / 60)
              for i in range(len(PHASES))]
    end = len(PHASES) * setup.phase_s
    starts = reshuffles(setup.phase_s)
    stops = [*starts[1:], end]
    popular = {label: [o for o in out if PHASES[o.phase].s == s]
               for label, s in (("flat", FLAT_S), ("steep", STEEP_S))}
    return {
        "arm": arm.title, "kind": arm.kind, "budget": arm.budget, "budget_bytes": budget,
        "models": len(setup.models), "footprints_bytes": sum(footprints.values()),
        "requests": len(out), "offered_rps": setup.rate, "phase_s": setup.phase_s,
        "deadline_ms": setup.deadline_ms, "residency_knobs": setup.residency,
        "phases": phases, "hits_p99_ms": {p: hits_p99(out, p) for p in PROTOCOLS},
        "failed": sum(o.kind == "failed" for o in out), "causes": causes(out),
        "failed_share": {k: failed_share(v) for k, v in popular.items()},
        "held_then_failed": held_then_failed(out), "failed_after_load": failed_after_load(out),
        "load_waits": {p: sum(o.load_wait_ms is not None and o.protocol == p for o in out)
                       for p in PROTOCOLS},
        "max_used_bytes": peak(run.samples, "used_bytes"),
        "max_stubs_uss": peak(run.samples, "stubs_uss"),
        "max_rss_above_idle": peak(run.samples, "rss_above_idle"),
        "recovery": [{"at_s": s, "span_s": stop - s,
                      "s": recovery_s(out, best, s, stop)} for s, stop in zip(
                          starts, stops, strict=True)],
        "other_messages": messages(out, "other"),
        "hit_series": hit_series(out), "memory": list(run.samples),
    }


def ratio(value: float | None, base: float | None) -> float | None:
    return round(value / base, 3) if value is not None and base else None


def add_p99_ratios(rows: Sequence[dict[str, Any]]) -> None:
    """Each row's hits' p99 over the all-resident arm's, per protocol, overall and per
    phase (None without that arm)."""
    base = next((r for r in rows if r["kind"] == "all"), None)
    for r in rows:
        overall = base["hits_p99_ms"] if base else {}
        r["hits_p99_x"] = {p: ratio(r["hits_p99_ms"][p], overall.get(p)) for p in PROTOCOLS}
        for i, ph in enumerate(r["phases"]):
            ref = base["phases"][i]["hits_p99_ms"] if base else {}
            ph["hits_p99_x"] = {p: ratio(ph["hits_p99_ms"][p], ref.get(p)) for p in PROTOCOLS}


# -- the report (pure) ----------------------------------------------------------------

def _mb(value: float | None) -> str:
    return "n/a" if value is None else f"{value / 1e6:.0f} MB"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f} %"


def _x(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def failed_cell(count: int, requests: int, by_cause: Mapping[str, int]) -> str:
    if not count:
        return "0"
    by = ", ".join(f"{k} {v}" for k, v in by_cause.items())
    return f"{count} ({_pct(count / requests if requests else None)}: {by})"


def p99_cell(ms: float | None, x: float | None) -> str:
    return num(ms, ".1f") + (f" ({_x(x)})" if x is not None else "")


def moves_cell(phase: Mapping[str, Any]) -> str:
    if phase["loads_per_min"] is None:
        return "n/a"
    return f"{phase['loads_per_min']:.1f} / {phase['evictions_per_min']:.1f}"


def phase_table(rows: Sequence[Mapping[str, Any]]) -> str:
    header = ("arm", "phase", "requests", "hits / best fixed", "failed (by cause)",
              "hits p99 HTTP, ms (x all)", "hits p99 gRPC, ms (x all)",
              "loads / evictions per min")
    lines = []
    for r in rows:
        for ph in r["phases"]:
            x = ph.get("hits_p99_x", {})
            lines.append((r["arm"], ph["phase"], ph["requests"],
                          f"{_pct(ph['hit_share'])} / {_pct(ph['best_fixed_share'])}",
                          failed_cell(ph["failed"], ph["requests"], ph["causes"]),
                          p99_cell(ph["hits_p99_ms"]["http"], x.get("http")),
                          p99_cell(ph["hits_p99_ms"]["grpc"], x.get("grpc")),
                          moves_cell(ph)))
    return table(header, lines)


def _against(value: float | None, budget: int | None) -> str:
    if value is None or not budget:
        return _mb(value)
    return f"{_mb(value)} ({_x(value / budget)})"


def recovery_cell(recovery: Sequence[Mapping[str, Any]]) -> str:
    return ", ".join(
        f"at {r['at_s']:.0f} s: " + (f"{r['s']:.0f} s" if r["s"] is not None
                                     else f"not within {r['span_s']:.0f} s")
        for r in recovery) or "n/a"


def arm_table(rows: Sequence[Mapping[str, Any]]) -> str:
    header = ("arm", "budget per member", "accounted peak (x budget)",
              "stubs' USS peak (x budget)", "tree RSS above idle, peak",
              "failed: flat / steep", f"held > {HELD_MS / 1e3:g} s, then failed",
              "failed after their load", "back to 90 % of best fixed after each reshuffle")
    return table(header, ((
        r["arm"], _mb(r["budget_bytes"]) if r["budget_bytes"] else "none",
        _against(r["max_used_bytes"], r["budget_bytes"]),
        _against(r["max_stubs_uss"], r["budget_bytes"]), _mb(r["max_rss_above_idle"]),
        f"{_pct(r['failed_share']['flat'])} / {_pct(r['failed_share']['steep'])}",
        r["held_then_failed"], r["failed_after_load"], recovery_cell(r["recovery"]))
        for r in rows))


Goal = tuple[str, bool | None, str]


def _memory_goals(r: Mapping[str, Any]) -> list[Goal]:
    budget = r["budget_bytes"]
    used, real = r["max_used_bytes"], r["max_stubs_uss"]
    return [
        ("accounted use within the budget at every sample",
         None if used is None else used <= budget,
         f"peak {_against(used, budget)} of {_mb(budget)}"),
        (f"real memory (stubs' USS) within {GOAL_REAL_X}x the budget at every sample",
         None if real is None else real <= GOAL_REAL_X * budget,
         f"peak {_against(real, budget)} (tree RSS above idle {_mb(r['max_rss_above_idle'])})"),
    ]


def _recovery_goal(r: Mapping[str, Any]) -> Goal:
    recs = r["recovery"]
    # not back within a span shorter than the goal (the schedule's end): not judged
    each = [None if x["s"] is None and x["span_s"] < GOAL_RECOVERY_S
            else x["s"] is not None and x["s"] <= GOAL_RECOVERY_S for x in recs]
    met = False if False in each else None if None in each else True
    return (f"back to {GOAL_RECOVERED:.0%} of the best fixed placement's hit ratio within "
            f"{GOAL_RECOVERY_S:.0f} s of each reshuffle", met, recovery_cell(recs))


def arm_goals(r: Mapping[str, Any]) -> list[Goal]:
    """Issue 34's goals for one residency arm: (goal, met (None: not judged), figure)."""
    not_found = r["causes"].get("not_found", 0)
    flat, steep = r["failed_share"]["flat"], r["failed_share"]["steep"]
    gaps = [(ph["phase"], ph["hit_share"], ph["best_fixed_share"]) for ph in r["phases"]]
    x = r.get("hits_p99_x", {})
    judged = [v for v in x.values() if v is not None]
    return [
        ("0 404 / NOT_FOUND for a registered model", not_found == 0, str(not_found)),
        ("0 loads evicted before their waiters are served (failures after their load)",
         r["failed_after_load"] == 0, str(r["failed_after_load"])),
        ("0 requests held past the moment it was known they could not be served "
         f"(failures answered after {HELD_MS / 1e3:g} s)", r["held_then_failed"] == 0,
         str(r["held_then_failed"])),
        (f"failed <= {GOAL_FAILED:.0%} with a {r['deadline_ms'] / 1e3:g} s deadline, "
         "flat and steep", None if flat is None or steep is None
         else max(flat, steep) <= GOAL_FAILED, f"flat {_pct(flat)}, steep {_pct(steep)}"),
        (f"hit ratio >= best fixed placement - {GOAL_HIT_GAP} in every phase",
         None if any(h is None or b is None for _, h, b in gaps)
         else all(h >= b - GOAL_HIT_GAP for _, h, b in gaps),
         "; ".join(f"{p}: {_pct(h)} vs {_pct(b)}" for p, h, b in gaps)),
        (f"hits' p99 <= {GOAL_P99_X}x all-resident, HTTP and gRPC",
         None if len(judged) < len(PROTOCOLS) else max(judged) <= GOAL_P99_X,
         ", ".join(f"{p.upper() if p == 'http' else 'gRPC'} {_x(x.get(p))} "
                   f"({num(r['hits_p99_ms'][p], '.1f')} ms)" for p in PROTOCOLS)),
        *_memory_goals(r),
        _recovery_goal(r),
    ]


def verdict(met: bool | None) -> str:
    return "NOT JUDGED" if met is None else "MET" if met else "MISSED"


def notes(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    out = [
        "Hits: answered right without the gateway's load-wait mark (HTTP header, gRPC "
        "trailing metadata `infergate-load-wait-ms`); misses: with it; hit ratios over "
        "every request sent. Best fixed: the share of the phase's requests the models "
        "most requested per byte, packed into both budgets in advance, would take.",
        f"'held > {HELD_MS / 1e3:g} s, then failed' counts failures answered more than "
        f"{HELD_MS / 1e3:g} s after their send (a client's bound on requests held after "
        "they could not be served); 'failed after their load' counts failures carrying "
        "the load-wait mark (a client's view of loads evicted before their waiters went on).",
        "Figures from one run on a shared 2-core host: latencies and recovery are noisy; "
        "compare arms of the same run only.",
    ]
    for r in rows:
        if r["kind"] == "residency" and r["load_waits"]["http"] and not r["load_waits"]["grpc"]:
            out.append(f"{r['arm']}: no gRPC answer carried the load-wait mark while "
                       f"{r['load_waits']['http']} HTTP ones did: its gRPC hits may hold "
                       "misses.")
    return out


def markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    if not rows:
        return "(no rows)"
    first = rows[0]
    budgets = ", ".join(f"{r['budget']} {_mb(r['budget_bytes'])}" for r in rows
                        if r["budget_bytes"])
    head = (f"{first['models']} models ({_mb(first['footprints_bytes'])} of footprints), "
            f"2 members, budgets per member: {budgets or 'none'}; {first['requests']} "
            f"requests at {first['offered_rps']:g}/s, half HTTP, half gRPC, "
            f"{first['deadline_ms'] / 1e3:g} s deadline; phases of {first['phase_s']:g} s: "
            + ", ".join(f"{p.label} (s={p.s})" for p in PHASES) + ".")
    lines = [head, "", phase_table(rows), "", arm_table(rows), ""]
    for r in rows:
        if r["kind"] == "residency":
            lines.append(f"Goals ({r['arm']}):")
            lines += [f"- {verdict(met)}: {goal}: {fig}" for goal, met, fig in arm_goals(r)]
            lines.append("")
    lines += ["Notes:", *(f"- {n}" for n in notes(rows))]
    return "\n".join(lines)


def plot(rows: Sequence[Mapping[str, Any]], out: Path) -> list[Path]:
    if not rows:
        return []
    path = out / "bench_residency.png"
    budgeted = [r for r in rows if r["budget_bytes"]]
    with figure(path, len(budgeted) + 1, 1, figsize=(10, 3 * (len(budgeted) + 1)),
                squeeze=False) as (_, axes):
        hits = axes[0][0]
        for r in rows:
            ts, shares = zip(*r["hit_series"], strict=True) if r["hit_series"] else ((), ())
            hits.plot(ts, [100 * s for s in shares], label=r["arm"])
        for i, at in enumerate(reshuffles(rows[0]["phase_s"])):
            hits.axvline(at, color="grey", linestyle="--",
                         label="reshuffle" if i == 0 else None)
        hits.set_ylabel("hits (% of requests, 5 s bins)")
        hits.set_xlabel("seconds of schedule")
        hits.legend(fontsize=7)
        for ax, r in zip((a[0] for a in axes[1:]), budgeted, strict=True):
            for member, colour in ((0, "tab:blue"), (1, "tab:orange")):
                mine = [s for s in r["memory"] if s["member"] == member]
                t = [s["t"] for s in mine]
                ax.plot(t, [s["stubs_uss"] / 1e6 for s in mine], color=colour,
                        label=f"member {member}: its stubs' USS")
                if any(s["used_bytes"] is not None for s in mine):
                    ax.plot(t, [(s["used_bytes"] or 0) / 1e6 for s in mine], "--",
                            color=colour, label=f"member {member}: gateway's used_bytes")
            ax.axhline(r["budget_bytes"] / 1e6, color="black", label="budget per member")
            ax.set_title(f"{r['arm']}: each member's memory (sampled every second)")
            ax.set_ylabel("MB")
            ax.set_xlabel("seconds of schedule")
            ax.legend(fontsize=7)
    return [path]


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
        knobs: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    out = out or ROOT / "results" / "bench_residency"
    models = build_models(repo, say=say)
    setup = Setup(models, repo, rate, phase_s, seed, deadline_ms,
                  {**DEFAULT_KNOBS, **(knobs or {})})
    names = setup.names
    expected = expected_outputs(repo, names, input_of(request_body()))
    footprints = known_footprints(models, repo / FOOTPRINTS)
    scratch = out / "runs" / time.strftime("%Y%m%d-%H%M%S")
    rows: list[dict[str, Any]] = []
    for arm in arms_of(kinds, budgets):
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
        say(f"{r['arm']}: hits {_pct(hit_share(result.outcomes))}, failed {r['failed']} "
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
    parser.add_argument("--models", type=Path, default=MODELS,
                        help="the models' repository (built there once, then reused)")
    args = parser.parse_args(argv)
    kinds = _names(args.arms, ARMS, "arms", parser)
    budgets = _names(args.budgets, tuple(BUDGETS), "budgets", parser)
    rate = args.rate or (20.0 if args.quick else 30.0)
    phase_s = args.phase_s or (30.0 if args.quick else 60.0)
    knobs = dict(parse_knob(k) for k in args.knob)
    rows = run(rate, phase_s, args.seed, args.deadline_ms, kinds, budgets, args.out,
               args.models, knobs)
    publish(rows, markdown, plot, args.out, "bench_residency", say)


if __name__ == "__main__":
    main()
