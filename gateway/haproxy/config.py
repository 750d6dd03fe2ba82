"""Snapshot -> HAProxy's configuration text (pure, no I/O).

:func:`render_config` writes the sections: ``global`` (with :data:`TUNING` and the
layout's ``tune.*`` settings) and the telemetry ring, ``defaults``, the ``http-errors``
sections (the error files of :mod:`gateway.haproxy.answers`), one frontend per protocol
(:mod:`.frontend`) with its request rules (:mod:`.request_rules`,
:mod:`.admission_rules`), the stick tables, the control plane's backends and one backend
per pool and protocol (:mod:`.backends`). ``MAPS/`` in a rule stands for the map
directory (:func:`with_map_paths`); the maps' contents come from :mod:`gateway.haproxy.maps`.

The hot path, per request, inside HAProxy, in the request policy's order
(``gateway/policy``: its constants, patterns and message templates are rendered here):
1. body size (HTTP: ``Content-Length``; gRPC: the message's length prefix);
2. the request: the model name, HTTP from the path, gRPC ``ModelInfer`` from protobuf
   field 1 of the buffered body's first bytes (``req.body,bytes(5),protobuf(1)``: the
   5-byte gRPC prefix skipped; the partial body in the buffer is enough), none -> 400 /
   INVALID_ARGUMENT; a malformed ``X-Request-Timeout-Ms`` -> 400;
3. predict auth when gated: the presented token's digest looked up in map ``tokens``;
4. rate limit per API key: a stick table per limit class, keyed by the key's digest,
   bounded in size, never the key itself;
5. the pool: weighted split over up to ``MAX_POOLS_PER_MODEL`` pools (maps
   ``route<k>`` / ``cut<k>`` against one ``rand(1000)``); none -> 404;
6. a model still loading -> 503 + Retry-After (map ``notready``);
7. admission: with tenants the tenancy rule first
   (:func:`.admission_rules.tenancy_rules`), then the model's requests in the gateway
   (stick table ``st_model``, ``conn_cur``; per class with tenants) bounded by map
   ``limits``; beyond -> 429 / RESOURCE_EXHAUSTED at once; a deadline the pool cannot
   meet -> 504 / DEADLINE_EXCEEDED (:func:`.admission_rules.deadline_rules`);
8. a model under rollout: an unversioned request pinned to its stable or candidate
   version (:func:`.request_rules.rollout_rules`; gRPC: by the Lua filter of a pin
   backend, :func:`.backends.pin_backends`);
9. a model under residency (``RouteState.holders``): its own backend in the pool, or
   the control plane when no member holds it there
   (:func:`.request_rules.residency_rules`);
10. the pool's backend (or the model's): least connections over members weighted by
   their Triton queue depth (a pool with ``gateway_queue``: each member capped at its
   slots, the rest waiting in HAProxy's queue by class and tenant, :mod:`.queueing`;
   otherwise no cap: Triton queues and batches), active health checks on
   ``/v2/health/live``, passive ejection, one retry on another member for connection
   failures, the client's deadline (``txn.dl``) as the server timeout.
Every answer HAProxy produces itself is built from ``gateway.errors``' one table
(:mod:`gateway.haproxy.answers`).
"""

from __future__ import annotations

from gateway.haproxy import priority_rules, queueing
from gateway.haproxy.admission_rules import refusal_backends
from gateway.haproxy.answers import CONTROL_ERRORS, LOCAL_ERRORS, grpc_return, http_return
from gateway.haproxy.backends import (
    backend_head,
    control_backends,
    grpc_server,
    model_backends,
    pin_backends,
    pool_backend,
    tables,
)
from gateway.haproxy.frontend import frontend
from gateway.haproxy.lua_filters import LUA_FILES
from gateway.haproxy.snapshot import Layout, Snapshot


def render_config(snapshot: Snapshot, layout: Layout) -> str:
    parts = [
        _global(layout),
        _defaults(layout),
        _errors_sections(layout),
        frontend(snapshot, layout, "http", _bufsize(layout)),
        frontend(snapshot, layout, "grpc", _bufsize(layout)),
        tables(snapshot),
        control_backends(layout),
        *(pool_backend(snapshot, pool, "http", layout) for pool in snapshot.pools),
        *(pool_backend(snapshot, pool, "grpc", layout) for pool in snapshot.pools),
        *model_backends(snapshot, layout),
        *pin_backends(snapshot, layout),
        *refusal_backends(snapshot, "http", http_return),
        *refusal_backends(snapshot, "grpc", grpc_return),
        *queueing.twin_backends(
            snapshot, lambda name, proto: priority_rules.backend_lines(
                snapshot, proto, backend_head(name, proto, health=False)),
            lambda m, proto: grpc_server(m, layout) if proto == "grpc" else ""),
    ]
    return with_map_paths("\n".join(parts), layout)


# HAProxy's global tune.* settings beyond its own defaults (Layout.tune adds or overrides,
# key by key). None: HAProxy 2.6 has one buffer size for every stream, and larger ones
# cost small requests more than they save large ones (docs/haproxy.md, "HTTP/2 windows and
# buffers"); deployments of large tensors set them (--haproxy-tune).
TUNING: dict[str, str] = {}


def tuning(layout: Layout) -> dict[str, str]:
    return {**TUNING, **dict(layout.tune)}


def _bufsize(layout: Layout) -> int:
    return int(tuning(layout).get("tune.bufsize", queueing.DEFAULT_BUFSIZE))



# A reload's old worker (docs/haproxy.md, "Live changes and reloads"). By default it
# sends GOAWAY to every HTTP/2 connection the moment it stops, also to one it accepted
# just before whose gRPC client has not made its first call yet; that client then
# neither calls on it nor closes it, and HAProxy kept it, the call waiting, for
# `timeout client` (300 s), in effect until hard-stop-after (30 s). GOAWAYs spread over
# CLOSE_SPREAD_S let such a connection carry its call first, and `timeout client-fin`
# closes an idle connection HAProxy sent GOAWAY on after GOAWAY_IDLE_S, whenever sent.
# Neither applies to a connection with a request on it.
CLOSE_SPREAD_S = 1
GOAWAY_IDLE_S = 1


def _global(layout: Layout) -> str:
    lines = [
        "global",
        f"  nbthread {layout.nbthread}",
        f"  stats socket {layout.admin_socket} mode 600 level admin expose-fd listeners",
        "  log ring@telemetry len 2048 format raw local0",
        "  hard-stop-after 30s",
        f"  close-spread-time {CLOSE_SPREAD_S}s",
        # the filters of the pin backends and of Triton's priority levels, the action of
        # a tenancy refusal's longer delay (loading them costs no request anything)
        *(f"  lua-load {layout.run_dir / name}" for name in LUA_FILES),
        *(f"  {key} {value}" for key, value in tuning(layout).items()),
        "",
        # a ring buffer streamed to the control plane: bursts wait in the ring instead of
        # being dropped (a datagram socket's queue is a few lines long). Over loopback
        # TCP, not a unix socket: while nothing listens (the control plane crashed or
        # stopped, HAProxy left serving) HAProxy 2.6 retries a ring server whose
        # connect() fails at once (a unix socket: ENOENT, ECONNREFUSED) without pause,
        # a whole core per worker; a refused TCP connection fails asynchronously, and
        # HAProxy waits a second before the next try
        "ring telemetry",
        "  format raw",
        "  maxlen 2048",
        "  size 16777216",
        "  timeout connect 2s",
        "  timeout server 300s",
        f"  server control {layout.log_address}",
    ]
    return "\n".join(lines) + "\n"


def _defaults(layout: Layout) -> str:
    return "\n".join([
        "defaults",
        "  mode http",
        "  log global",
        "  option dontlognull",
        f"  timeout connect {layout.connect_timeout_ms}ms",
        f"  timeout client {layout.client_timeout_s}s",
        f"  timeout client-fin {GOAWAY_IDLE_S}s",  # (CLOSE_SPREAD_S above)
        f"  timeout server {layout.server_timeout_s}s",
        f"  timeout queue {layout.queue_timeout_s}s",
        "  timeout http-request 30s",
        "  timeout http-keep-alive 300s",
        "",
    ])


def _errors_sections(layout: Layout) -> str:
    lines = []
    sets = [("", LOCAL_ERRORS)]
    if layout.local_http is not None:  # a replica: the control plane may be away
        sets.append(("control_", {**LOCAL_ERRORS, **CONTROL_ERRORS}))
    for prefix, table in sets:
        for proto in ("http", "grpc"):
            lines.append(f"http-errors {prefix}{proto}_errors")
            lines += [f"  errorfile {s} "
                      f"{layout.run_dir / 'errors' / f'{prefix}{proto}-{s}.http'}"
                      for s in table]
    return "\n".join(lines) + "\n"


def with_map_paths(config: str, layout: Layout) -> str:
    return config.replace("MAPS/", f"{layout.run_dir / 'maps'}/")
