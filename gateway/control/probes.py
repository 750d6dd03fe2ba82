"""Active probes: each member's readiness and queue depth, refreshed periodically.

Health is ``/v2/health/live`` on the member's HTTP port, not ``/ready``: with Triton's
strict readiness a server reports not-ready while any one of its models is unloading,
and a member serving other models must not be ejected for that. Queue depth is the
sum of ``nv_inference_pending_request_count`` over the member's models, scraped from its
metrics port; from the same page, each model's answers and compute time so far
(:func:`service_counters`: the member's measured service time and answers per second
per model, which the deadline rule weighs, ``gateway/policy/deadline.py``). The member's
Triton version is read from its server metadata (``GET /v2``) every healthy round, so a
member restarted on another release is seen within a round
(``gateway.upstream.triton_version`` decides what that means for its gRPC
connections). The router treats a scrape older than its staleness bound as absent.
The config of each model the page lists is read every
:data:`~gateway.policy.triton_priority.LEVELS_TTL_S` (a few models a round): its dynamic
batcher's priority levels, which say the level a request's class gets there
(``gateway/policy/triton_priority.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterable
from urllib.parse import quote

import httpx

from gateway.config.pools import MemberSpec
from gateway.core import Core
from gateway.policy.triton_priority import LEVELS_TTL_S
from gateway.pools import Pool, PoolMember
from gateway.state import GatewayState
from gateway.upstream.triton_version import version_from_metadata

log = logging.getLogger(__name__)
PENDING = "nv_inference_pending_request_count"
LEVELS_PER_ROUND = 4  # model configs a probe round reads on one member, at most


def pending_requests(metrics_text: str) -> int:
    """The sum of ``nv_inference_pending_request_count`` over a member's models. Its
    samples are read straight off the text (``name{labels} value [timestamp]``): a
    full parse of Triton's metrics page, for one family, took the control plane about
    100 times as long (3.5 ms against 0.035 ms for two models' 61 lines, on a busy
    machine) per member per round."""
    total = 0.0
    for line in metrics_text.splitlines():
        if not line.startswith(PENDING):
            continue
        rest = line[len(PENDING):]
        if rest[:1] == "{":
            rest = rest[rest.rfind("}") + 1:]  # label values come before the last brace
        elif rest[:1] not in (" ", "\t"):
            continue  # another metric whose name starts alike
        with contextlib.suppress(IndexError, ValueError):
            total += float(rest.split()[0])
    return int(total)


SUCCESS = "nv_inference_request_success"
COMPUTE = ("nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
           "nv_inference_compute_output_duration_us")


def service_counters(metrics_text: str) -> dict[str, tuple[int, int]]:
    """Model -> (requests answered, their compute microseconds), summed over versions,
    read off the text as :func:`pending_requests` does."""
    counts: dict[str, list[float]] = {}
    for line in metrics_text.splitlines():
        if not line.startswith("nv_inference_"):
            continue
        name, brace, rest = line.partition("{")
        if not brace or (name != SUCCESS and name not in COMPUTE):
            continue
        labels, _, value = rest.rpartition("}")
        start = labels.find('model="')
        if start < 0:
            continue
        model = labels[start + 7:labels.index('"', start + 7)]
        with contextlib.suppress(IndexError, ValueError):
            entry = counts.setdefault(model, [0.0, 0.0])
            entry[0 if name == SUCCESS else 1] += float(value.split()[0])
    return {m: (int(n), int(us)) for m, (n, us) in counts.items()}


async def probe_member(client: httpx.AsyncClient, core: Core, member: PoolMember) -> None:
    spec = member.spec
    refused = False
    try:
        live = await client.get(f"http://{spec.http_address}/v2/health/live")
        passed = live.status_code == 200
    except httpx.ConnectError:
        passed, refused = False, True  # nothing listens: down now
    except httpx.HTTPError:
        passed = False
    was_healthy = member.healthy
    if member.probed(passed, refused):  # back from the dead (PoolMember.probed)
        log.info("member %s/%s is healthy again", member.pool, member.key)
        # whatever must be loaded on it is, before it is routable (GatewayState.recovered)
        core.state.recovered(member, lambda exc: log.error(
            "restoring member %s/%s failed: %r", member.pool, member.key, exc))
    elif was_healthy and not member.healthy:
        log.warning("member %s/%s failed its health check", member.pool, member.key)
    if member.healthy != was_healthy:
        # out of routing (or held there while restored) now, not at HAProxy's next round:
        # a Triton that restarts within a round would otherwise take traffic empty
        try:
            await core.state.settle()
        except Exception:  # noqa: BLE001 - the controller's next round tries again
            log.exception("moving the data plane after %s/%s changed health failed",
                          member.pool, member.key)
    metrics = core.metrics
    metrics.member_healthy.labels(member.pool, member.key).set(
        1 if member.available(core.clock()) else 0
    )
    if not (passed and member.healthy):
        # out of routing, or one failed probe from it (HEALTH_FALL): a member that did
        # not answer /live in time will not answer its metrics page sooner, and waiting
        # for that too would put off the next probe, and the ejection, by a timeout
        return
    scraped, version = await asyncio.gather(_scrape(client, spec), read_version(client, spec))
    queue = None if scraped is None else pending_requests(scraped)
    member.observed(queue, version, core.clock())
    if scraped is not None:
        counters = service_counters(scraped)
        member.served(counters, core.clock())
        await read_levels(client, member, counters, core.clock())
    if queue is not None:
        metrics.member_queue.labels(member.pool, member.key).set(member.upstream_queue)


async def read_levels(client: httpx.AsyncClient, member: PoolMember, models: Iterable[str],
                      now: float) -> None:
    """The priority levels of the member's models whose reading is due (the first
    :data:`LEVELS_PER_ROUND` of them): ``dynamic_batching.priority_levels`` of each
    one's config, 0 without. A config that cannot be read now is tried again next
    round; one Triton refuses (a model unloaded since the scrape) reads as 0."""
    due = [m for m in models if member.levels_due(m, now, LEVELS_TTL_S)][:LEVELS_PER_ROUND]

    async def read(model: str) -> None:
        try:
            resp = await client.get(f"http://{member.spec.http_address}/v2/models/"
                                    f"{quote(model, safe='')}/config")
            config = resp.json() if resp.status_code == 200 else {}
            levels = int((config.get("dynamic_batching") or {}).get("priority_levels", 0))
        except (httpx.HTTPError, ValueError, TypeError, AttributeError) as exc:
            log.debug("member %s: config of %s unreadable: %r", member.key, model, exc)
            return
        member.read_levels(model, levels, now)

    await asyncio.gather(*(read(m) for m in due))


async def _scrape(client: httpx.AsyncClient, spec: MemberSpec) -> str | None:
    """The member's metrics page, None when it cannot be read."""
    with contextlib.suppress(httpx.HTTPError, ValueError):
        resp = await client.get(f"http://{spec.metrics_address}/metrics")
        return resp.text if resp.status_code == 200 else None
    return None


async def read_version(client: httpx.AsyncClient, spec: MemberSpec) -> str | None:
    """The member's Triton version (server metadata), None when it cannot be read."""
    try:
        resp = await client.get(f"http://{spec.http_address}/v2")
        return version_from_metadata(resp.json()) if resp.status_code == 200 else None
    except (httpx.HTTPError, ValueError) as exc:
        log.debug("member %s: server metadata unreadable: %s", spec.key, exc)
        return None


async def resolve_members(state: GatewayState, pool: Pool) -> None:
    """Members of a pool declared by DNS (a Kubernetes headless Service): one per address.
    Known members keep their state; vanished addresses leave the pool."""
    assert pool.spec.dns is not None
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(
            pool.spec.dns, None, type=socket.SOCK_STREAM
        )
    except OSError as exc:
        log.warning("pool %s: cannot resolve %s: %s", pool.name, pool.spec.dns, exc)
        return
    addresses = sorted({str(info[4][0]) for info in infos})
    ports = pool.spec.dns_ports
    specs = [MemberSpec(host=a, http_port=ports.http_port, grpc_port=ports.grpc_port,
                        metrics_port=ports.metrics_port) for a in addresses]
    for key in state.resolved(pool, specs):
        log.info("pool %s: member %s joined via DNS", pool.name, key)


async def probe_forever(core: Core, interval_s: float) -> None:
    # The probe's timeout is not its interval: a member slow to answer /live while it
    # loads a model under load must not be ejected for it. Rounds run concurrently per
    # member, so one slow member does not delay the others' verdicts.
    timeout = httpx.Timeout(max(2.0, 2 * interval_s), connect=max(0.5, interval_s))
    async with httpx.AsyncClient(timeout=timeout, trust_env=False) as client:
        while True:
            try:
                await probe_round(client, core)
            except Exception:  # noqa: BLE001 - probing goes on: health must not freeze
                log.exception("a probe round failed; the next one in %.1f s", interval_s)
            await asyncio.sleep(interval_s)


async def probe_round(client: httpx.AsyncClient, core: Core) -> None:
    """DNS pools resolved, every member probed (a member whose probe fails unexpectedly
    is logged, and the others' verdicts stand), then the core's round."""
    dns_pools = [p for p in core.state.pools if p.spec.dns]
    if dns_pools:
        await asyncio.gather(*(resolve_members(core.state, p) for p in dns_pools))
    members = core.state.members()
    results = await asyncio.gather(*(probe_member(client, core, m) for m in members),
                                   return_exceptions=True)
    for member, result in zip(members, results, strict=True):
        if isinstance(result, Exception):
            log.error("probing %s failed", member.key, exc_info=result)
    core.round()
