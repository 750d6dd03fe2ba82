"""Model residency (issue 29): many models, few members, each member's memory within a
budget that holds about a quarter of them; against static and all-resident baselines.

40 MLPs made by the converter (:mod:`loadtests.residency_models`: 16 of ~1 MB of weights,
14 of ~10 MB, 10 of ~40 MB; one request body serves all), one pool of two local Triton
members (explicit model control), one gateway (``--data-plane`` default). The same
open-loop traffic in every arm: Poisson arrivals at ``--rate`` requests per second for two
phases of ``--phase-s`` seconds; each request's model drawn with Zipf popularity
(s = 1.1) over a ranking of the models; at the step (halfway) the ranking turns by half,
so the popular set becomes the previously unpopular half. Every request carries a
deadline (``X-Request-Timeout-Ms``): a miss waits for its model's load within it.

Arms, one after the other, each on fresh members:

1. **all resident**: every model loaded on both members, no residency (the budget
   ignored, where this machine holds it). Each model's footprint is measured here: the
   unique set size (USS) of its Python-backend stub on the first member, or the
   converter's figure where larger. The budget *B* per member is a quarter of the sum
   of the footprints.
2. **static**: no residency; the first models of the catalogue (in name order) that fit
   *B* loaded on both members, requests for the others refused (counted as failed).
3. **residency**: the pool has ``residency: {memory_budget_bytes: B}``, every model
   ``on_demand``, nothing loaded at start.

A request is a **hit** when answered (HTTP 200) without the gateway's
``infergate-load-wait-ms`` header, a **miss** when answered with it (it waited for a load),
**failed** otherwise (a refusal, an error, no answer within the deadline + 5 s).
Figures per arm: hit ratio (hits over every request sent) overall and at steady state (the
second half of each phase), p50 and p99 of hits and of misses, throughput (answers per
second of schedule), failed requests, loads and evictions per minute (the gateway's
``infergate_model_loads_total`` / ``infergate_model_evictions_total`` over the run), the
time after the step until a 10 s window of requests is above 90 % hits, and each
member's memory sampled every second: the gateway's ``used_bytes``
(``GET /v1/residency``), the USS of the member's model stubs, and the RSS of its whole
process tree (tritonserver and stubs) above what it took with no model loaded.

Goals (issue 29): >= 95 % hits at steady state; hits' p99 within 1.1x of all-resident; 0
failed; a member's memory never above its budget; hit ratio back above 90 % within 60 s
of the step.

    python -m loadtests.bench_residency [--quick] [--rate 40] [--phase-s 120]
        [--seed 1] [--arms all,static,residency] [--out results/bench_residency]

The models are built once into ``results/bench_residency/models`` (``--models``; about a
minute on 2 cores) and reused.
With the defaults a run takes about 13 minutes on 2 cores (three arms of 4 minutes of
traffic, the members' start-ups); ``--quick`` (20 rps, 60 s phases: long enough to judge
the 60 s recovery) about 6. ``--knob NAME=VALUE`` sets a residency knob of the pool
(``min_resident_s=10``); ``--arms residency`` alone takes the budget from the footprints
the last all-resident arm measured (``measured-footprints.json`` beside the models).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import numpy as np
import psutil
import yaml

from infergate.processes import ROOT
from infergate.triton.local import LocalTriton, TritonEndpoints, TritonSettings
from loadtests.harness import (
    RUNTIME_ENV,
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
from loadtests.residency_models import BenchModel, build_models, request_body

say = reporter("bench_residency")

ZIPF_S = 1.1
LOAD_WAIT_HEADER = "infergate-load-wait-ms"
DEADLINE_HEADER = "X-Request-Timeout-Ms"
POOL = "cpu"
ARMS = ("all", "static", "residency")
ARM_TITLES = {"all": "all resident", "static": "static", "residency": "residency"}
MODELS = ROOT / "results" / "bench_residency" / "models"  # built once, reused
FOOTPRINTS = "measured-footprints.json"  # beside the models: the stubs' USS, last measured
WINDOW_S = 10.0  # the hit ratio's window after the step
GOAL_STEADY_HITS, GOAL_P99_X, GOAL_RECOVERY_S, GOAL_RECOVERED = 0.95, 1.1, 60.0, 0.90


# -- traffic (pure) -------------------------------------------------------------------

def zipf_weights(n: int, s: float = ZIPF_S) -> np.ndarray:
    """Probability of each rank 1..n under Zipf's law with exponent ``s``."""
    w = np.arange(1, n + 1, dtype=np.float64) ** -s
    return w / w.sum()


def rankings(models: Sequence[str], seed: int) -> tuple[list[str], list[str]]:
    """The popularity order before and after the step: a shuffle of ``models``, then the
    same turned by half (the first phase's least popular half leads the second)."""
    first = [models[i] for i in np.random.default_rng(seed).permutation(len(models))]
    half = len(first) // 2
    return first, first[half:] + first[:half]


@dataclass(frozen=True)
class Arrival:
    t: float  # seconds after the schedule's start
    model: str
    phase: int  # 0 before the step, 1 after


def schedule(models: Sequence[str], rate: float, phase_s: float, seed: int,
             s: float = ZIPF_S) -> list[Arrival]:
    """Poisson arrivals at ``rate`` per second for two phases of ``phase_s``; each
    request's model drawn by Zipf popularity over its phase's ranking. The same
    arguments give the same schedule (every arm runs the same traffic)."""
    rng = np.random.default_rng(seed)
    orders = rankings(models, seed)
    weights = zipf_weights(len(models), s)
    out: list[Arrival] = []
    t = float(rng.exponential(1 / rate))
    while t < 2 * phase_s:
        phase = int(t >= phase_s)
        out.append(Arrival(t, orders[phase][int(rng.choice(len(models), p=weights))], phase))
        t += float(rng.exponential(1 / rate))
    return out


# -- outcomes (pure) ------------------------------------------------------------------

@dataclass(frozen=True)
class Outcome:
    t: float  # scheduled send, seconds after the start
    model: str
    phase: int
    status: int  # HTTP status, -1: no answer
    latency_ms: float
    load_wait_ms: float | None  # the gateway's header: the request waited for a load
    error: str = ""  # a failed request's answer (its start)

    @property
    def kind(self) -> str:
        return classify(self.status, self.load_wait_ms)


def classify(status: int, load_wait_ms: float | None) -> str:
    """``hit``: answered without waiting for a load; ``miss``: answered after one;
    ``failed``: anything but HTTP 200."""
    if status != 200:
        return "failed"
    return "hit" if load_wait_ms is None else "miss"


def load_wait(headers: Mapping[str, str]) -> float | None:
    """The header's milliseconds (None: absent; a value not a number counts as 0)."""
    value = headers.get(LOAD_WAIT_HEADER)
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return 0.0


def hit_share(outcomes: Sequence[Outcome]) -> float | None:
    return sum(o.kind == "hit" for o in outcomes) / len(outcomes) if outcomes else None


def steady(outcomes: Sequence[Outcome], phase_s: float) -> list[Outcome]:
    """The requests of each phase's second half (after the cold start, after the step)."""
    return [o for o in outcomes if (o.t % phase_s) >= phase_s / 2]


def recovery_s(outcomes: Sequence[Outcome], step_s: float, window_s: float = WINDOW_S,
               threshold: float = GOAL_RECOVERED, stride_s: float = 1.0) -> float | None:
    """Seconds after the step until the requests of a ``window_s`` window (wholly after
    the step) are more than ``threshold`` hits: that window's end minus the step (at
    least ``window_s``). None: no such window before the schedule ends."""
    after = sorted((o for o in outcomes if o.t >= step_s), key=lambda o: o.t)
    if not after:
        return None
    end = step_s + window_s
    while end <= after[-1].t + 1e-9:
        inside = [o for o in after if end - window_s <= o.t < end]
        share = hit_share(inside)
        if share is not None and share > threshold:
            return end - step_s
        end += stride_s
    return None


def hit_series(outcomes: Sequence[Outcome], bin_s: float = 5.0) -> list[tuple[float, float]]:
    """(bin's middle, hit share) per ``bin_s`` of schedule with any request in it."""
    bins: dict[int, list[Outcome]] = {}
    for o in outcomes:
        bins.setdefault(int(o.t // bin_s), []).append(o)
    return [(round((b + 0.5) * bin_s, 2), round(hit_share(v) or 0.0, 4))
            for b, v in sorted(bins.items())]


def latency(outcomes: Sequence[Outcome], kind: str, q: float) -> float | None:
    values = [o.latency_ms for o in outcomes if o.kind == kind]
    return round(percentile(values, q), 2) if values else None


def failures(outcomes: Sequence[Outcome]) -> dict[str, int]:
    """Failed requests by HTTP status ('none': no answer)."""
    out: dict[str, int] = {}
    for o in outcomes:
        if o.kind == "failed":
            key = "none" if o.status < 0 else str(o.status)
            out[key] = out.get(key, 0) + 1
    return out


# -- budgets (pure) -------------------------------------------------------------------

def quarter_budget(footprints: Mapping[str, int], fraction: float = 0.25) -> int:
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


def ideal_hit_share(models: Sequence[str], footprints: Mapping[str, int], budget: int,
                    seed: int, members: int = 2, s: float = ZIPF_S) -> float:
    """The hit ratio of a placement that knew each phase's popularity and never moved:
    per phase, the models packed into ``members`` budgets most requested per byte first
    (each where it fits), the share of that phase's requests they would take; the mean
    of both phases. What no policy on these budgets can beat by much."""
    weights = zipf_weights(len(models), s)
    shares = []
    for order in rankings(models, seed):
        p = dict(zip(order, weights, strict=True))
        room = [budget] * members
        held = 0.0
        for m in sorted(order, key=lambda m: -p[m] / footprints[m]):
            slot = next((i for i, r in enumerate(room) if footprints[m] <= r), None)
            if slot is not None:
                room[slot] -= footprints[m]
                held += p[m]
        shares.append(held)
    return float(np.mean(shares))


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
        with httpx.Client(base_url=f"http://{self.endpoints.http_url}", timeout=600) as c:
            for m in models:
                r = c.post(f"/v2/repository/models/{m}/load")
                if r.status_code != 200:
                    raise RuntimeError(f"loading {m} on {self.endpoints.http_url}: "
                                       f"{r.status_code} {r.text}")


@contextlib.contextmanager
def members(repo: Path, folder: Path, loaded: Sequence[str], count: int = 2
            ) -> Iterator[list[Member]]:
    """``count`` Tritons over ``repo`` (explicit model control), each measured idle, then
    with ``loaded`` loaded; stopped on exit."""
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
        for m in started:
            m.load(loaded)
        yield started
    finally:
        for m in started:
            m.server.stop()


def member_view(view: Sequence[Mapping[str, Any]], member: TritonEndpoints
                ) -> Mapping[str, Any] | None:
    """The gateway's entry (``GET /v1/residency``) of ``member``: its key names the
    member's gRPC or HTTP address (``host:port``, perhaps after ``pool/``)."""
    for entry in view:
        key = str(entry.get("key", "")).rsplit("/", 1)[-1]
        if key in (member.grpc_url, member.http_url):
            return entry
    return None


class MemorySampler:
    """Each member's memory every ``interval_s`` in a thread: the gateway's view
    (``GET /v1/residency``: used and budget bytes, where the gateway has residency) and
    the member's own (its stubs' USS, its tree's RSS above idle)."""

    def __init__(self, url: str, members: Sequence[Member], interval_s: float = 1.0) -> None:
        self.url, self.members, self.interval_s = url, members, interval_s
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._t0 = 0.0

    def __enter__(self) -> MemorySampler:
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _gateway_view(self, client: httpx.Client) -> list[dict[str, Any]]:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            r = client.get(f"{self.url}/v1/residency")
            if r.status_code == 200:
                return [m for p in r.json().get("pools", []) for m in p.get("members", [])]
        return []

    def _run(self) -> None:
        with httpx.Client(timeout=5, trust_env=False) as client:
            while not self._stop.is_set():
                t = round(time.monotonic() - self._t0, 2)
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

async def _one(session: aiohttp.ClientSession, url: str, body: bytes, arrival: Arrival,
               t0: float, deadline_ms: int) -> Outcome:
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, t0 + arrival.t - loop.time()))
    sent = loop.time()
    status, wait, error = -1, None, ""
    try:
        async with session.post(
                f"{url}/v2/models/{arrival.model}/infer", data=body,
                headers={"content-type": "application/json",
                         DEADLINE_HEADER: str(deadline_ms)},
                timeout=aiohttp.ClientTimeout(total=deadline_ms / 1e3 + 5)) as resp:
            answer = await resp.read()
            status, wait = resp.status, load_wait(resp.headers)
            if status != 200:
                error = answer[:200].decode(errors="replace")
    except (TimeoutError, aiohttp.ClientError) as exc:
        error = f"{type(exc).__name__}: {exc}"[:200]
    # from the scheduled time: a late client's lag is the user's wait too
    return Outcome(round(arrival.t, 4), arrival.model, arrival.phase, status,
                   round((loop.time() - min(sent, t0 + arrival.t)) * 1e3, 3), wait, error)


async def _drive(url: str, arrivals: Sequence[Arrival], deadline_ms: int) -> list[Outcome]:
    body = request_body()
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        t0 = asyncio.get_running_loop().time() + 0.5
        return list(await asyncio.gather(*(_one(session, url, body, a, t0, deadline_ms)
                                           for a in arrivals)))


def drive(url: str, arrivals: Sequence[Arrival], deadline_ms: int) -> list[Outcome]:
    """Send ``arrivals`` open loop (each at its time, whatever the answers do)."""
    return asyncio.run(_drive(url, arrivals, deadline_ms))


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


def arm_config(path: Path, arm: str, member_list: Sequence[Member], setup: Setup,
               budget: int) -> Path:
    pools = {POOL: [m.endpoints for m in member_list]}
    if arm != "residency":
        return gateway_yaml(path, pools)
    gateway_yaml(path, pools, lifecycle=setup.repo,
                 models={m.name: {"on_demand": True} for m in setup.models})
    data = yaml.safe_load(path.read_text())
    data["pools"][0]["residency"] = {"memory_budget_bytes": budget, **setup.residency}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def counters(url: str) -> dict[str, float]:
    text = page(f"{url}/metrics")
    return {"loads": sum(totals(text, "infergate_model_loads", "reason").values()),
            "evictions": sum(totals(text, "infergate_model_evictions", "reason").values())}


def run_arm(arm: str, setup: Setup, folder: Path, budget: int, loaded: Sequence[str]
            ) -> tuple[list[Outcome], list[dict[str, Any]], dict[str, float], list[Member]]:
    folder.mkdir(parents=True, exist_ok=True)
    arrivals = schedule([m.name for m in setup.models], setup.rate, setup.phase_s, setup.seed)
    say(f"{ARM_TITLES[arm]}: starting 2 members ({len(loaded)} models loaded on each)")
    with members(setup.repo, folder, loaded) as group:
        config = arm_config(folder / "gateway.yaml", arm, group, setup, budget)
        with gateway(config, folder / "gateway") as gw:
            url = f"http://{gw.http_url}"
            before = counters(url)
            say(f"{ARM_TITLES[arm]}: {len(arrivals)} requests over {2 * setup.phase_s:g} s")
            with MemorySampler(url, group) as sampler:
                outcomes = drive(url, arrivals, setup.deadline_ms)
            after = counters(url)
            moves = {k: after[k] - before[k] for k in after}
            keep_record(folder, url, outcomes)
            footprints = member_footprints(group[0])
        return outcomes, sampler.samples, {**moves, **footprints}, group


def keep_record(folder: Path, url: str, outcomes: Sequence[Outcome]) -> None:
    """Every request's outcome and the gateway's last word on residency, in the arm's
    folder (for a look at what went wrong)."""
    with (folder / "requests.jsonl").open("w") as f:
        f.writelines(json.dumps(asdict(o)) + "\n" for o in outcomes)
    with contextlib.suppress(httpx.HTTPError):
        (folder / "residency.json").write_text(httpx.get(f"{url}/v1/residency", timeout=10).text)


def member_footprints(member: Member) -> dict[str, float]:
    return {f"uss:{m}": float(b) for m, b in member.memory().stubs_uss.items()}


def summarise(arm: str, outcomes: Sequence[Outcome], samples: Sequence[dict[str, Any]],
              moves: Mapping[str, float], setup: Setup, budget: int,
              footprints: Mapping[str, int], loaded: int) -> dict[str, Any]:
    seconds = 2 * setup.phase_s
    answered = [o for o in outcomes if o.kind != "failed"]
    minutes = seconds / 60
    return {
        "arm": ARM_TITLES[arm], "models": len(setup.models), "loaded_at_start": loaded,
        "requests": len(outcomes), "offered_rps": setup.rate, "phase_s": setup.phase_s,
        "ideal_hit_share": round(ideal_hit_share([m.name for m in setup.models], footprints,
                                                 budget, setup.seed), 4),
        "hit_share": hit_share(outcomes), "steady_hit_share": hit_share(steady(
            outcomes, setup.phase_s)),
        "hits_p50_ms": latency(outcomes, "hit", 50), "hits_p99_ms": latency(outcomes, "hit", 99),
        "misses": sum(o.kind == "miss" for o in outcomes),
        "misses_p50_ms": latency(outcomes, "miss", 50),
        "misses_p99_ms": latency(outcomes, "miss", 99),
        "throughput_rps": round(len(answered) / seconds, 2),
        "failed": sum(o.kind == "failed" for o in outcomes), "failed_by_status": failures(outcomes),
        "loads_per_min": round(moves.get("loads", 0.0) / minutes, 2),
        "evictions_per_min": round(moves.get("evictions", 0.0) / minutes, 2),
        "recovery_s": recovery_s(outcomes, setup.phase_s),
        "budget_bytes": budget,
        "max_used_bytes": max((s["used_bytes"] for s in samples
                               if s["used_bytes"] is not None), default=None),
        "max_stubs_uss": max((s["stubs_uss"] for s in samples), default=None),
        "max_rss_above_idle": max((s["rss_above_idle"] for s in samples), default=None),
        "hit_series": hit_series(outcomes), "memory": list(samples),
    }


# -- the report -----------------------------------------------------------------------

def _mb(value: float | None) -> str:
    return "n/a" if value is None else f"{value / 1e6:.0f} MB"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f} %"


FIGURES: tuple[tuple[str, str], ...] = (
    ("hit ratio", "hit_share"), ("hit ratio at steady state", "steady_hit_share"),
    ("hits p50 / p99 (ms)", "hits"), ("misses (count)", "misses"),
    ("misses p50 / p99 (ms)", "misses_ms"), ("throughput (answers/s)", "throughput_rps"),
    ("failed requests", "failed"), ("loads / evictions per minute", "moves"),
    ("back above 90 % hits after the step", "recovery_s"),
    ("max memory: gateway's used / stubs' USS / tree RSS above idle", "memory"),
)


def cell(row: Mapping[str, Any], key: str) -> str:
    if key in ("hit_share", "steady_hit_share"):
        return _pct(row[key])
    if key == "hits":
        return f"{num(row['hits_p50_ms'], '.1f')} / {num(row['hits_p99_ms'], '.1f')}"
    if key == "misses_ms":
        return f"{num(row['misses_p50_ms'], '.0f')} / {num(row['misses_p99_ms'], '.0f')}"
    if key == "failed":
        by = ", ".join(f"{k}: {v}" for k, v in sorted(row["failed_by_status"].items()))
        return f"{row['failed']}" + (f" ({by})" if by else "")
    if key == "moves":
        return f"{row['loads_per_min']:.1f} / {row['evictions_per_min']:.1f}"
    if key == "recovery_s":
        return "never" if row[key] is None else f"{row[key]:.0f} s"
    if key == "memory":
        return " / ".join(_mb(row[k]) for k in ("max_used_bytes", "max_stubs_uss",
                                                 "max_rss_above_idle"))
    return str(row[key])


def goals(rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, bool | None, str]]:
    """(goal, met (None: not measured), the figure) for the residency arm."""
    by = {r["arm"]: r for r in rows}
    res, base = by.get(ARM_TITLES["residency"]), by.get(ARM_TITLES["all"])
    if res is None:
        return []
    out: list[tuple[str, bool | None, str]] = []
    steady_hits = res["steady_hit_share"]
    out.append((f">= {GOAL_STEADY_HITS:.0%} hits at steady state",
                None if steady_hits is None else steady_hits >= GOAL_STEADY_HITS,
                _pct(steady_hits)))
    ratio = None
    if base and res["hits_p99_ms"] and base["hits_p99_ms"]:
        ratio = res["hits_p99_ms"] / base["hits_p99_ms"]
    out.append((f"hits' p99 within {GOAL_P99_X}x of all-resident",
                None if ratio is None else ratio <= GOAL_P99_X,
                "n/a (no all-resident arm)" if ratio is None else
                f"{ratio:.2f}x ({num(res['hits_p99_ms'], '.1f')} vs "
                f"{num(base['hits_p99_ms'] if base else None, '.1f')} ms)"))
    out.append(("0 failed requests", res["failed"] == 0, str(res["failed"])))
    peak = max((v for v in (res["max_used_bytes"], res["max_stubs_uss"]) if v is not None),
               default=None)
    out.append(("a member's memory never above its budget",
                None if peak is None else peak <= res["budget_bytes"],
                f"peak {_mb(peak)} (gateway's {_mb(res['max_used_bytes'])}, stubs' USS "
                f"{_mb(res['max_stubs_uss'])}) vs budget {_mb(res['budget_bytes'])}"))
    rec = res["recovery_s"]
    out.append((f"back above {GOAL_RECOVERED:.0%} hits within {GOAL_RECOVERY_S:.0f} s of the "
                "step", rec is not None and rec <= GOAL_RECOVERY_S,
                f"never in the {res['phase_s']:.0f} s after it" if rec is None
                else f"{rec:.0f} s"))
    return out


def verdict(met: bool | None) -> str:
    return "NOT MEASURED" if met is None else "MET" if met else "MISSED"


def markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    if not rows:
        return "(no rows)"
    first = rows[0]
    head = (f"{first['models']} models, 2 members, budget {_mb(first['budget_bytes'])} per "
            f"member (a quarter of every footprint together), {first['requests']} requests "
            f"at {first['offered_rps']:g}/s, Zipf s={ZIPF_S}, the popular set moved halfway. "
            f"The most popular models that fit both budgets (known in advance, never moved) "
            f"would take {_pct(first.get('ideal_hit_share'))} of the requests.")
    body = table(("figure", *(r["arm"] for r in rows)),
                 ((label, *(cell(r, key) for r in rows)) for label, key in FIGURES))
    lines = [f"- {verdict(met)}: {goal}: {figure_}" for goal, met, figure_ in goals(rows)]
    lines = lines or ["(no residency arm in this run)"]
    return "\n".join([head, "", body, "", "Goals (residency arm):", *lines])


def plot(rows: Sequence[Mapping[str, Any]], out: Path) -> list[Path]:
    if not rows:
        return []
    path = out / "bench_residency.png"
    with figure(path, len(rows) + 1, 1, figsize=(10, 3 * (len(rows) + 1))) as (_, axes):
        hits = axes[0]
        for r in rows:
            ts, shares = zip(*r["hit_series"], strict=True) if r["hit_series"] else ((), ())
            hits.plot(ts, [100 * s for s in shares], label=r["arm"])
        step = rows[0].get("phase_s")
        if step:
            hits.axvline(step, color="grey", linestyle="--", label="the popular set moves")
        hits.set_ylabel("hits (% of requests, 5 s bins)")
        hits.set_xlabel("seconds of schedule (the popular set moves halfway)")
        hits.legend()
        for ax, r in zip(axes[1:], rows, strict=True):
            for member, colour in ((0, "tab:blue"), (1, "tab:orange")):
                mine = [s for s in r["memory"] if s["member"] == member]
                t = [s["t"] for s in mine]
                ax.plot(t, [s["stubs_uss"] / 1e6 for s in mine], color=colour,
                        label=f"member {member}: its model stubs' USS")
                ax.plot(t, [s["rss_above_idle"] / 1e6 for s in mine], ":", color=colour,
                        label=f"member {member}: its tree's RSS above idle")
                if any(s["used_bytes"] is not None for s in mine):
                    ax.plot(t, [(s["used_bytes"] or 0) / 1e6 for s in mine], "--",
                            color=colour, label=f"member {member}: gateway's used_bytes")
            ax.axhline(r["budget_bytes"] / 1e6, color="black", label="budget per member")
            ax.set_title(f"{r['arm']}: each member's memory (sampled every second)")
            ax.set_ylabel("MB")
            ax.set_xlabel("seconds")
            ax.legend(fontsize=7)
    return [path]


def p99_ratio(row: Mapping[str, Any], base: Mapping[str, Any]) -> float | None:
    """The row's hits' p99 over the all-resident arm's (None: either not measured)."""
    if base["arm"] != ARM_TITLES["all"] or not row["hits_p99_ms"] or not base["hits_p99_ms"]:
        return None
    return round(row["hits_p99_ms"] / base["hits_p99_ms"], 3)


def known_footprints(models: Sequence[BenchModel], measured_file: Path) -> dict[str, int]:
    """Each model's footprint: the converter's figure (its weights' size where it has
    none), or what an earlier all-resident arm measured on a member where larger."""
    measured: dict[str, int] = {}
    with contextlib.suppress(OSError, ValueError):
        measured = {k: int(v) for k, v in json.loads(measured_file.read_text()).items()}
    return {m.name: max(m.footprint_bytes or m.weight_bytes, measured.get(m.name, 0))
            for m in models}


# -- the run --------------------------------------------------------------------------

def run(rate: float = 40.0, phase_s: float = 120.0, seed: int = 1, deadline_ms: int = 10_000,
        arms: Sequence[str] = ARMS, out: Path | None = None,
        repo: Path = MODELS, knobs: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    out = out or ROOT / "results" / "bench_residency"
    models = build_models(repo, say=say)
    setup = Setup(models, repo, rate, phase_s, seed, deadline_ms, dict(knobs or {}))
    names = [m.name for m in models]
    footprints = known_footprints(models, repo / FOOTPRINTS)
    scratch = out / "runs" / time.strftime("%Y%m%d-%H%M%S")
    rows: list[dict[str, Any]] = []
    budget = quarter_budget(footprints)
    for arm in [a for a in ARMS if a in arms]:
        loaded = {"all": names, "static": first_fit(names, footprints, budget),
                  "residency": []}[arm]
        outcomes, samples, moves, _ = run_arm(arm, setup, scratch / arm, budget, loaded)
        if arm == "all":
            measured = {k.removeprefix("uss:"): int(v) for k, v in moves.items()
                        if k.startswith("uss:")}
            footprints = {m: max(footprints[m], measured.get(m, 0)) for m in names}
            (repo / FOOTPRINTS).write_text(json.dumps(measured, indent=1) + "\n")
            budget = quarter_budget(footprints)
            say(f"measured footprints: {sum(measured.values()) / 1e6:.0f} MB of stubs' USS "
                f"for {len(measured)} models; budget per member {budget / 1e6:.0f} MB")
        rows.append(summarise(arm, outcomes, samples, moves, setup, budget, footprints,
                              len(loaded)))
        rows[-1]["hits_p99_vs_all_resident_ratio"] = p99_ratio(rows[-1], rows[0])
        r = rows[-1]
        say(f"{r['arm']}: hits {_pct(r['hit_share'])}, failed {r['failed']}, "
            f"hits p99 {num(r['hits_p99_ms'], '.1f')} ms")
    return rows


def parse_knob(text: str) -> tuple[str, Any]:
    """``NAME=VALUE`` with VALUE read as YAML (a number, a mapping...)."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=VALUE")
    return name.strip(), yaml.safe_load(value)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="20 rps, 60 s phases")
    parser.add_argument("--rate", type=float, default=None, help="requests per second (40)")
    parser.add_argument("--phase-s", type=float, default=None, help="seconds per phase (120)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--deadline-ms", type=int, default=10_000)
    parser.add_argument("--arms", default=",".join(ARMS), help="any of all,static,residency")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bench_residency")
    parser.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE",
                        help="a residency knob of the pool (min_resident_s=10, "
                             "waiting_room={max_requests: 128}); repeatable")
    parser.add_argument("--models", type=Path, default=MODELS,
                        help="the models' repository (built there once, then reused)")
    args = parser.parse_args(argv)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = set(arms) - set(ARMS)
    if unknown:
        parser.error(f"unknown arms {sorted(unknown)}: choose from {', '.join(ARMS)}")
    rate = args.rate or (20.0 if args.quick else 40.0)
    phase_s = args.phase_s or (60.0 if args.quick else 120.0)
    knobs = dict(parse_knob(k) for k in args.knob)
    rows = run(rate, phase_s, args.seed, args.deadline_ms, arms, args.out, args.models, knobs)
    publish(rows, markdown, plot, args.out, "bench_residency", say)


if __name__ == "__main__":
    main()
