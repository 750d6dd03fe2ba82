"""The backends (pure, no I/O): the stick tables the frontends' rules count in, the
control plane's backends (and a replica's own Python forwarder's), one backend per pool
and protocol (least connections, active health checks, passive ejection, one retry on
another member, the client's deadline as the server timeout, Triton's parse errors
mapped), a managed model's backends in its pool (servers tracking the pool's, ready on
its holders) and the gRPC backends' pin twins (the Lua filter that pins a rollout's
version).
"""

from __future__ import annotations

from gateway import errors
from gateway.haproxy import priority_rules, queueing
from gateway.haproxy.deadline_rules import stream_grace_rules
from gateway.haproxy.lua_filters import GRPC_FIELDS_FILTER
from gateway.haproxy.snapshot import Layout, MemberState, PoolState, Resident, Snapshot
from gateway.netaddr import join_host_port
from gateway.policy import parse_errors, rate, tenancy
from gateway.policy.upstream import EJECT_AFTER_FAILURES, HEALTH_FALL, RETRIES
from gateway.upstream.triton_version import grpc_mode

# a replica waits this long to reach the control plane before answering that it cannot
CONTROL_CONNECT_S = 1


def tables(snapshot: Snapshot) -> str:
    lines = [
        "backend st_model",
        "  stick-table type string len 128 size 20k expire 10m store conn_cur",
        "backend st_route",
        # the request rate says which tenants arrived lately (tenancy.TenantActivity)
        "  stick-table type string len 192 size 20k expire 10m store conn_cur,"
        f"http_req_rate({round(tenancy.ACTIVE_WINDOW_S * 1000)})",
    ]
    # with tenants, a limited tenant's entry counts its requests in flight too
    flight = ",conn_cur" if snapshot.tenancy is not None else ""
    for i, limit in enumerate(snapshot.rate_classes()):
        lines += [
            f"backend rate{i}",
            f"  stick-table type string len 64 size {rate.MAX_KEYS} "
            f"expire {2 * limit.window_ms}ms store http_req_rate({limit.window_ms}ms){flight}",
        ]
    if snapshot.tenancy is not None:
        lines += ["backend tenant_flight",
                  "  stick-table type string len 64 size 10k expire 10m store conn_cur",
                  # arrivals the tenancy rules refused (model/pool/tenant): they make a
                  # tenant active without counting in flight (admission_rules.py)
                  "backend st_seen",
                  "  stick-table type string len 192 size 20k expire 10m store "
                  f"http_req_rate({round(tenancy.ACTIVE_WINDOW_S * 1000)})"]
        if snapshot.refusals_delayed() is not None:  # refusals waiting, per tenant
            lines += ["backend st_delay",
                      "  stick-table type string len 64 size 10k expire 1m store conn_cur"]
    return "\n".join(lines) + "\n"


def control_backends(layout: Layout) -> str:
    """The control plane's backends, and a replica's own Python forwarder's. On a
    replica, a call to the control plane fails within a second while it is down, with
    an answer that names it (``answers.CONTROL_ERRORS``), never retried elsewhere."""
    if layout.local_http is None or layout.local_grpc is None:
        return _python_backends("control", layout.control_http, layout.control_grpc,
                                layout, ())
    down = (f"  timeout connect {CONTROL_CONNECT_S}s", "  retries 0")
    return "\n".join([
        _python_backends("control", layout.control_http, layout.control_grpc, layout,
                         down, "control_"),
        _python_backends("local", layout.local_http, layout.local_grpc, layout, ()),
    ])


def _python_backends(name: str, http: str, grpc: str, layout: Layout,
                     extra: tuple[str, ...], errors_prefix: str = "") -> str:
    return "\n".join([
        f"backend {name}_http",
        f"  errorfiles {errors_prefix}http_errors",
        "  http-reuse always",
        # generate_stream's server-sent events: each chunk leaves when it arrives (else
        # HAProxy holds small chunks back for more data, a whole stream's worth)
        "  option http-no-delay",
        *extra,
        f"  server {name} {http}",
        f"backend {name}_grpc",
        f"  errorfiles {errors_prefix}grpc_errors",
        "  option http-no-delay",
        # (the client's side is the frontend's `timeout client`: HAProxy ignores one
        # in a backend, and warned of it at every start)
        f"  timeout server {layout.stream_timeout_s}s",
        *stream_grace_rules(),
        *extra,
        f"  server {name} {grpc} proto h2",
        "",
    ])


# gRPC to a member whose Triton lacks the fix for server#8034 (before 2.57.0): one
# ModelInfer per connection, never two at once on one. Triton 2.51 answers a message it
# cannot parse with its trailers-only status, then repeats that HEADERS frame on the
# stream END_STREAM closed (6 in all, each followed by an RST_STREAM). HAProxy takes
# that as a connection error (GOAWAY STREAM_CLOSED), which aborts every other request
# multiplexed on that connection; Triton cancels them all at once, and its cancellation
# race segfaults it. On a connection of its own, only the broken request's connection
# ends, after its answer, and Triton has nothing to cancel. The price: a TCP and HTTP/2
# handshake per request to the member (HAProxy resets the connection it is done with,
# so no TIME_WAIT socket piles up on either side). Members with the fix share
# connections (``gateway.upstream.triton_version.grpc_mode``; the layout's setting
# overrides it either way).
GRPC_SERVER_REUSE = "max-reuse 0"


def grpc_shared(member: MemberState, layout: Layout) -> bool:
    return grpc_mode(member.triton_version, layout.grpc_upstream_reuse).shared


def pool_backend(snapshot: Snapshot, pool: PoolState, proto: str, layout: Layout) -> str:
    http = proto == "http"
    check = (f"check inter {layout.health_interval_ms}ms fall {HEALTH_FALL} rise 1 "
             f"observe layer4 error-limit {EJECT_AFTER_FAILURES} on-error mark-down")
    lines = priority_rules.backend_lines(
        snapshot, proto, backend_head(f"{proto}_{pool.name}", proto, health=True))
    lines += queueing.backend_lines(pool, proto)
    cap = queueing.server_cap(pool)
    for m in pool.members:
        port = m.http_port if http else m.grpc_port
        extra = "" if http else f"{grpc_server(m, layout)} port {m.http_port} check-proto h1"
        lines.append(
            f"  server {m.name} {join_host_port(m.host, port)} {check} "
            f"weight {m.weight}{cap}{extra}{'' if m.routable else ' disabled'}"
        )
    return "\n".join(lines) + "\n"


def model_backends(snapshot: Snapshot, layout: Layout) -> list[str]:
    pools = {p.name: p for p in snapshot.pools}
    return [_model_backend(snapshot, pools[r.pool], r, proto, layout)
            for proto in ("http", "grpc") for r in snapshot.residents()]


def _model_backend(snapshot: Snapshot, pool: PoolState, resident: Resident, proto: str,
                   layout: Layout) -> str:
    """A managed model's backend in a pool: the pool backend's settings, its servers
    tracking the pool's (health and maintenance follow the member; no checks of their
    own), ready only on the model's holders (``disabled``, maintenance, elsewhere;
    ``gateway.haproxy.changes`` moves them live)."""
    http = proto == "http"
    lines = priority_rules.backend_lines(
        snapshot, proto, backend_head(f"{proto}_{resident.backend}", proto, health=False))
    # HTTP only: a queued gRPC stream can stall its client connection (haproxy/queueing.py)
    cap = queueing.server_cap(pool) if http else ""
    if http:
        lines += queueing.backend_lines(pool, proto)
    for m in pool.members:
        port = m.http_port if http else m.grpc_port
        extra = "" if http else grpc_server(m, layout)
        held = m.name in resident.holders
        lines.append(f"  server {m.name} {join_host_port(m.host, port)} "
                     f"track {proto}_{pool.name}/{m.name} "
                     f"weight {m.weight}{cap}{extra}{'' if held else ' disabled'}")
    return "\n".join(lines) + "\n"


PIN = ".pin"  # a gRPC backend's pin twin: grpc_<pool>.pin, grpc_<pool>.r<h>.pin


def pin_backends(snapshot: Snapshot, layout: Layout) -> list[str]:
    """One twin per gRPC backend (a pool's, a managed model's), for the requests
    :func:`.request_rules.rollout_rules` pinned: the same servers (each tracking the
    pool's: health and maintenance; a model's twin ready on its holders alone), the same
    settings, and the Lua filter that appends the version to the message
    (``grpc_fields.lua``, :mod:`gateway.haproxy.lua_filters`). A filter
    declared in a backend is attached to the streams that enter it only: every other
    request pays nothing for it (one declared in the frontend costs every gRPC request its
    Lua contexts, ~11 us). Rendered whatever the rollouts, so that one starting or ending
    is a map change, not a reload. ``gateway.telemetry.read_haproxy`` counts a twin's
    requests in its pool (``grpc_<pool>`` before the dot); a model's twin's are not its
    drain count, but a model under rollout is not evicted."""
    pools = {p.name: p for p in snapshot.pools}
    twins: list[tuple[PoolState, str, Resident | None]] = [
        (p, p.name, None) for p in snapshot.pools]
    twins += [(pools[r.pool], r.backend, r) for r in snapshot.residents()]
    out = []
    for pool, name, resident in twins:
        # no L7 retry (retry-on empty-response would replay a copy of the request
        # the filter already changed): a connection failure is still retried
        lines = [line for line in backend_head(f"grpc_{name}{PIN}", "grpc", health=False)
                 if "retry-on" not in line]
        lines += [f"  filter lua.{GRPC_FIELDS_FILTER}",
                  # field 2's bytes: tag, length, the digits
                  "  http-request set-var(txn.vl) var(txn.ver),length,add(2)",
                  "  http-request set-header content-length "
                  "%[req.hdr(content-length),add(txn.vl)] if { req.hdr(content-length) -m found }"]
        # the filter appends a class's level too (priority_rules: its length rule)
        lines = priority_rules.backend_lines(snapshot, "grpc", lines)
        for m in pool.members:
            held = resident is None or m.name in resident.holders
            lines.append(f"  server {m.name} {join_host_port(m.host, m.grpc_port)} "
                         f"track grpc_{pool.name}/"
                         f"{m.name} weight {m.weight}{grpc_server(m, layout)}"
                         f"{'' if held else ' disabled'}")
        out.append("\n".join(lines) + "\n")
    return out


def backend_head(name: str, proto: str, health: bool) -> list[str]:
    """A backend's settings before its servers: least connections, retries, the
    client's deadline, Triton's parse errors; ``health``: active checks."""
    http = proto == "http"
    checks = ["  option httpchk GET /v2/health/live",
              "  http-check expect status 200"] if health else []
    lines = [
        f"backend {name}",
        f"  errorfiles {proto}_errors",
        "  balance leastconn",
        *checks,
        "  http-reuse always",
        f"  retries {RETRIES}",
        "  option redispatch 1",
        "  retry-on conn-failure empty-response",
    ]
    # the client's deadline (the frontend's txn.dl, milliseconds) as the member's timeout
    lines.append("  http-request set-timeout server var(txn.dl) if { var(txn.dl) -m found }")
    if not http:
        lines.append("  option http-no-delay")
    return lines + parse_error_rules(http)


def grpc_server(member: MemberState, layout: Layout) -> str:
    reuse = "" if grpc_shared(member, layout) else f" {GRPC_SERVER_REUSE}"
    return f" proto h2{reuse}"


def parse_error_rules(http: bool) -> list[str]:
    """Triton's 500 / INTERNAL for a request it could not parse becomes 400 /
    INVALID_ARGUMENT, its 503 / UNAVAILABLE for a request its queue dropped when its
    timeout expired 504 / DEADLINE_EXCEEDED (``gateway/policy/parse_errors.py``: matched
    by message prefix).
    Triton's HTTP error bodies are small, so waiting for one costs nothing; its gRPC
    errors are trailers-only answers, whose ``grpc-status`` is a header here."""
    if http:
        starts = " ".join(f"'{parse_errors.HTTP_BODY_START.decode()}{p}'"
                          for p in parse_errors.PREFIXES)
        encoding = f"'{parse_errors.HTTP_BODY_START.decode()}{parse_errors.UNKNOWN_ENCODING}'"
        expired = f"'{parse_errors.HTTP_BODY_START.decode()}{parse_errors.QUEUE_TIMEOUT}'"
        return ["  http-response wait-for-body time 1s if { status 500 501 503 }",
                "  http-response set-status 400 if { status 500 } "
                f"{{ res.body -m beg {starts} }}",
                "  http-response set-status 400 if { status 501 } "
                f"{{ res.body -m beg {encoding} }}",
                "  http-response set-status 504 if { status 503 } "
                f"{{ res.body -m beg {expired} }}"]
    starts = " ".join(f'"{p}"' for p in parse_errors.PREFIXES)
    code = errors.grpc_code_number(errors.InvalidInput)
    cut = parse_errors.MAX_MESSAGE_CHARS
    # res.fhdr: the whole header (res.hdr would take the part after its last comma)
    late = errors.grpc_code_number(errors.DeadlineExceeded)
    return [f"  http-response set-header grpc-status {code}"
            " if { res.hdr(grpc-status) -m str 13 } "
            f"{{ res.fhdr(grpc-message) -m beg {starts} }}",
            f"  http-response set-header grpc-status {late}"
            " if { res.hdr(grpc-status) -m str 14 } "
            f'{{ res.fhdr(grpc-message) -m beg "{parse_errors.QUEUE_TIMEOUT}" }}',
            # as parse_errors.bounded: a gRPC client refuses metadata above 8-16 KiB
            f'  http-response set-header grpc-message "%[res.fhdr(grpc-message),bytes(0,{cut})]'
            f'... (%[res.fhdr(grpc-message),length] characters, cut)"'
            f" if {{ res.fhdr(grpc-message),length gt {cut} }}"]

