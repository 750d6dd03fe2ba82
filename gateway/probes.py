"""Active probes: each member's readiness and queue depth, refreshed periodically.

Health is ``/v2/health/live`` on the member's HTTP port, not ``/ready``: with Triton's
strict readiness a server reports not-ready while any one of its models is unloading,
and a member serving other models must not be ejected for that. Queue depth is the
sum of ``nv_inference_pending_request_count`` over the member's models, scraped from its
metrics port. The member's Triton version is read from its server metadata (``GET /v2``)
every healthy round, so a member restarted on another release is seen within a round
(``gateway.upstream.triton_version`` decides what that means for its gRPC
connections). The router treats a scrape older than its staleness bound as absent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

import httpx

from gateway.dataplane import DataPlane
from gateway.policy.upstream import HEALTH_FALL
from gateway.pools import MemberSpec, Pool, PoolMember
from gateway.upstream.triton_version import version_from_metadata

log = logging.getLogger(__name__)
PENDING = "nv_inference_pending_request_count"


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


async def probe_member(client: httpx.AsyncClient, dataplane: DataPlane, member: PoolMember) -> None:
    spec = member.spec
    refused = False
    try:
        live = await client.get(f"http://{spec.host}:{spec.http_port}/v2/health/live")
        passed = live.status_code == 200
    except httpx.ConnectError:
        passed, refused = False, True  # nothing listens: down now
    except httpx.HTTPError:
        passed = False
    member.failed_probes = 0 if passed else member.failed_probes + 1
    # a member that answers slowly or badly is down after HEALTH_FALL probes in a row,
    # as HAProxy's own checks decide: one slow /live on a machine busy converting a
    # model must not send its member through maintenance and a restore
    healthy = passed or (member.healthy and not refused
                         and member.failed_probes < HEALTH_FALL)
    was_healthy = member.healthy
    member.healthy = healthy
    if healthy and not was_healthy:
        # A member back from the dead gets traffic at once, not after its back-off;
        # first, though, whatever must be loaded on it is (see DataPlane.member_recovered).
        member.ejected_until = 0.0
        member.consecutive_failures = 0
        log.info("member %s/%s is healthy again", member.pool, member.key)
        if dataplane.member_recovered and not member.restoring:
            member.restoring = True
            task = asyncio.create_task(_restore(dataplane, member))
            dataplane.background.add(task)  # a strong reference until it is done
            task.add_done_callback(dataplane.background.discard)
    elif was_healthy and not healthy:
        log.warning("member %s/%s failed its health check", member.pool, member.key)
    metrics = dataplane.metrics
    metrics.member_healthy.labels(member.pool, member.key).set(
        1 if member.available(dataplane.clock()) else 0
    )
    if not healthy:
        return
    queue, version = await asyncio.gather(_scrape_queue(client, spec),
                                          read_version(client, spec))
    member.triton_version, member.version_probed = version, True
    if queue is not None:
        member.upstream_queue = queue
        member.queue_scraped_at = dataplane.clock()
        metrics.member_queue.labels(member.pool, member.key).set(member.upstream_queue)


async def _scrape_queue(client: httpx.AsyncClient, spec: MemberSpec) -> int | None:
    with contextlib.suppress(httpx.HTTPError, ValueError):
        resp = await client.get(f"http://{spec.host}:{spec.metrics_port}/metrics")
        return pending_requests(resp.text)
    return None


async def read_version(client: httpx.AsyncClient, spec: MemberSpec) -> str | None:
    """The member's Triton version (server metadata), None when it cannot be read."""
    try:
        resp = await client.get(f"http://{spec.host}:{spec.http_port}/v2")
        return version_from_metadata(resp.json()) if resp.status_code == 200 else None
    except (httpx.HTTPError, ValueError) as exc:
        log.debug("member %s: server metadata unreadable: %s", spec.key, exc)
        return None


async def _restore(dataplane: DataPlane, member: PoolMember) -> None:
    try:
        for hook in dataplane.member_recovered:
            await hook(member)
        log.info("member %s/%s restored", member.pool, member.key)
    except Exception:  # noqa: BLE001 - logged; the member serves what it has
        log.exception("restoring member %s/%s failed", member.pool, member.key)
    finally:
        member.restoring = False


async def resolve_members(pool: Pool) -> None:
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
    wanted = {
        MemberSpec(host=a, http_port=ports.http_port, grpc_port=ports.grpc_port,
                   metrics_port=ports.metrics_port).key: a for a in addresses
    }
    kept = [m for m in pool.members if m.key in wanted or m.spec in pool.spec.members]
    known = {m.key for m in kept}
    for key, address in wanted.items():
        if key not in known:
            spec = MemberSpec(host=address, http_port=ports.http_port,
                              grpc_port=ports.grpc_port, metrics_port=ports.metrics_port)
            kept.append(PoolMember(pool.name, spec))
            log.info("pool %s: member %s joined via DNS", pool.name, key)
    pool.members[:] = kept


async def probe_forever(dataplane: DataPlane, interval_s: float) -> None:
    # The probe's timeout is not its interval: a member slow to answer /live while it
    # loads a model under load must not be ejected for it. Rounds run concurrently per
    # member, so one slow member does not delay the others' verdicts.
    timeout = httpx.Timeout(max(2.0, 2 * interval_s), connect=max(0.5, interval_s))
    async with httpx.AsyncClient(timeout=timeout, trust_env=False) as client:
        while True:
            dns_pools = [p for p in dataplane.pools if p.spec.dns]
            if dns_pools:
                await asyncio.gather(*(resolve_members(p) for p in dns_pools))
                dataplane.refresh_limits()
            await asyncio.gather(*(probe_member(client, dataplane, m) for m in dataplane.members()))
            dataplane.update_saturation()
            await asyncio.sleep(interval_s)
