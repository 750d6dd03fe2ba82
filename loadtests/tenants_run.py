"""One measured run of ``bench_tenants``: every tenant's h2load at once against a gateway
or straight at the member, its figures from h2load's logs and the gateway's counts
settled before and after (or Triton's queue emptied), Triton's own throughput, the
line each run reports."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from gateway.control.probes import PENDING
from infergate.processes import GatewayProcess
from infergate.triton.local import TritonEndpoints
from loadtests.h2load import Workload, h2load_command, run_h2load, run_h2loads, status_counts
from loadtests.harness import num, page, reporter, settle, totals
from loadtests.tenants_figures import (
    QUEUE_KEY,
    Measured,
    TenantCounts,
    figures,
    latency_buckets,
    member_outcomes,
    outcomes,
    tenant_counts,
)
from loadtests.tenants_scenarios import Key, TenantLoad

# a little more than one probe round of the gateway (run_gateway: --probe-interval 0.5),
# so that Triton's queue as the next run's admission sees it is the idle one
SETTLE_QUIET_S = 0.6

say = reporter("bench_tenants")


def metrics_text(gateway: GatewayProcess) -> str:
    return page(f"http://{gateway.http_url}/metrics")


def settled_counts(gateway: GatewayProcess, quiet_s: float = SETTLE_QUIET_S,
                   timeout_s: float = 8.0) -> TenantCounts:
    """The per-tenant counts once they have not moved for ``quiet_s`` and the gateway
    has nothing in flight (requests admitted before a client stopped still finish in
    Triton; the HAProxy data plane's counts arrive through its telemetry lines, a little
    after each answer)."""
    if quiet_s <= 0:
        return tenant_counts(metrics_text(gateway))
    counts, still = settle(lambda: tenant_counts(metrics_text(gateway)), quiet_s, timeout_s,
                           key=TenantCounts.total, busy=lambda c: bool(c.in_flight))
    if not still:
        say(f"the gateway's counts did not settle within {timeout_s:g} s (in flight: "
            f"{counts.in_flight}): the next run may start with requests still in Triton")
    return counts


def run_phase(target: GatewayProcess | TritonEndpoints, work: Workload, protocol: str,
              loads: Sequence[TenantLoad], seconds: float, scratch: Path,
              anonymous: bool = False, direct_per_s: float = 0.0) -> dict[str, Measured]:
    """Every tenant's h2load at once for ``seconds`` at ``target``; its figures from
    h2load's logs and the gateway's counts before and after (a member: h2load's alone,
    :func:`~loadtests.tenants_figures.member_outcomes`). ``anonymous``: no key (warm-up);
    ``direct_per_s``: Triton's own throughput, which paced tenants send a share of."""
    before = settled_counts(target, quiet_s=0.0) if isinstance(target, GatewayProcess) else None
    duration = f"{round(seconds * 1000)}ms"

    def rate(load: TenantLoad) -> float:
        if load.paced and direct_per_s <= 0:
            raise ValueError(f"{load.tenant} is paced: Triton's throughput is needed")
        return load.paced * direct_per_s

    runs = run_h2loads([h2load_command(work, protocol, target, load.in_flight, duration,
                                       scratch / f"{load.tenant}.tsv",
                                       () if anonymous else load.headers, rate(load))
                        for load in loads], seconds + 120)
    delta = None
    if isinstance(target, GatewayProcess):
        assert before is not None
        delta = settled_counts(target).minus(before)
    else:
        settled_member(target)
    measured = {}
    for load, r in zip(loads, runs, strict=True):
        problem = ""
        try:
            h2_seconds = r.summary().seconds
        except ValueError:
            h2_seconds = seconds
            problem = f"h2load printed no summary (exit {r.returncode})"
        if r.returncode != 0:
            problem = f"h2load exited {r.returncode}: {r.gist()}; $ {' '.join(r.command)}"
        statuses = status_counts(r.log)
        measured[load.tenant] = Measured(
            load.tenant, protocol, load.in_flight, h2_seconds, statuses,
            tuple(us for status, us in r.log if status == 200),
            member_outcomes(statuses) if delta is None else
            outcomes(delta, load.tenant, alone=len(runs) == 1), problem,
            tuple(us for status, us in r.log if status == 429), rate(load),
            None if delta is None else latency_buckets(delta, load.tenant),
            None if delta is None else latency_buckets(delta, load.tenant, QUEUE_KEY))
    return measured


def settled_member(member: TritonEndpoints, timeout_s: float = 8.0) -> None:
    """Once Triton has no request pending (h2load ends its run with some still there,
    and the next run would wait behind them)."""
    def pending() -> float:
        return sum(totals(page(member.metrics_url), PENDING, "model").values())

    _, idle = settle(pending, 0.0, timeout_s, busy=lambda n: n > 0)
    if not idle:
        say(f"Triton still had requests pending after {timeout_s:g} s: the next run may "
            "wait behind them")


def direct_throughput(member: TritonEndpoints, work: Workload, protocol: str,
                      in_flight: int, seconds: float, scratch: Path) -> float:
    """Triton's own requests per second, closed loop straight at the member."""
    out = run_h2load(h2load_command(work, protocol, member, in_flight,
                                    f"{round(seconds * 1000)}ms", None), seconds + 120)
    if out.returncode != 0:
        raise RuntimeError(f"h2load at Triton failed: {out.gist()}")
    return out.summary().req_per_s


def report_run(key: Key, r: int, rounds: int, run: Mapping[str, Measured]) -> None:
    parts = []
    for tenant, m in run.items():
        f = figures(m)
        parts.append(f"{tenant} x{m.in_flight}: {num(f.admitted_per_s, '.0f')}/s ok, "
                     f"{num(f.refused, '.0f')} refused"
                     + (f" (p50 {f.refusal_p50_ms:.2f} ms)" if math.isfinite(f.refusal_p50_ms)
                        else "")
                     + f", p99 {num(f.p99_ms, '.2f')} ms"
                     + (f" [{f.note[:300]}]" if f.note else ""))
    say(f"round {r + 1}/{rounds} {key[2]} {key[3]} {key[0]}/{key[1]}: " + "; ".join(parts))
