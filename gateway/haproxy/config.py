"""Snapshot -> HAProxy's configuration text (pure, no I/O).

:func:`render_config` writes the sections: ``global`` (with :data:`TUNING` and the
layout's ``tune.*`` settings) and the telemetry ring, ``defaults``, the ``http-errors``
sections (the error files of :mod:`gateway.haproxy.answers`), one frontend per protocol
with its request rules, the stick tables, the control plane's backends and one backend
per pool and protocol. ``MAPS/`` in a rule stands for the map directory
(:func:`with_map_paths`); the maps' contents come from :mod:`gateway.haproxy.maps`.

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
7. admission: with tenants the tenancy rule first (:func:`_tenancy_rules`), then the
   model's requests in the gateway (stick table ``st_model``, ``conn_cur``; per class
   with tenants) bounded by map ``limits``; beyond -> 429 / RESOURCE_EXHAUSTED at once;
   a deadline the pool cannot meet -> 504 / DEADLINE_EXCEEDED (:func:`_deadline_rules`);
8. a model under rollout: an unversioned request pinned to its stable or candidate
   version (:func:`_rollout_rules`; gRPC: by the Lua filter of a pin backend,
   :func:`_pin_backends`);
9. a model under residency (``RouteState.holders``): its own backend in the pool, or
   the control plane when no member holds it there (:func:`_residency_rules`);
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

from collections.abc import Callable

from gateway import errors
from gateway.haproxy import queueing
from gateway.haproxy.answers import CONTROL_ERRORS, LOCAL_ERRORS, grpc_return, http_return
from gateway.haproxy.maps import MISS, NO_RATE, split
from gateway.haproxy.snapshot import Layout, MemberState, PoolState, Resident, Snapshot
from gateway.policy import (
    access,
    admission,
    deadline,
    model_name,
    parse_errors,
    planes,
    rate,
    readiness,
    shape,
    tenancy,
)
from gateway.policy.rollout import SHADOW_HEADER
from gateway.policy.upstream import EJECT_AFTER_FAILURES, HEALTH_FALL, RETRIES
from gateway.upstream.triton_version import grpc_mode

GRPC_INFER = "/inference.GRPCInferenceService/ModelInfer"
# a replica waits this long to reach the control plane before answering that it cannot
CONTROL_CONNECT_S = 1
# one line per inference request, to the control plane's datagram socket (telemetry.py).
# %Ta is the request's own active time, from its first byte to the response's last: %Tt
# would add the time a keep-alive connection sat idle before the request (%Ti), so a
# client pausing 40 ms between calls of 3 ms each would be reported as 43 ms
LOG_FORMAT = ("%[var(txn.model)] %[var(txn.pool)] %[var(txn.proto)] %ST "
              "%[var(txn.gs)] %Ta %[var(txn.out)] %ts "
              "%[var(txn.tn)] %[var(txn.tc)] %[var(txn.why)] %[var(txn.ver)] %Tw")


def render_config(snapshot: Snapshot, layout: Layout) -> str:
    parts = [
        _global(layout),
        _defaults(layout),
        _errors_sections(layout),
        _frontend(snapshot, layout, "http"),
        _frontend(snapshot, layout, "grpc"),
        _tables(snapshot),
        _control_backends(layout),
        *(_pool_backend(pool, "http", layout) for pool in snapshot.pools),
        *(_pool_backend(pool, "grpc", layout) for pool in snapshot.pools),
        *_model_backends(snapshot, layout),
        *_pin_backends(snapshot, layout),
        *queueing.bypass_backends(
            snapshot, lambda name: _backend_head(name, "grpc", health=False),
            lambda m: _grpc_server(m, layout)),
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


PIN_GRPC_LUA = "pin_grpc.lua"  # in the run directory (gateway.haproxy.render)
PIN_GRPC_FILTER = "pin_grpc"  # its core.register_filter name


def _global(layout: Layout) -> str:
    lines = [
        "global",
        f"  nbthread {layout.nbthread}",
        f"  stats socket {layout.admin_socket} mode 600 level admin expose-fd listeners",
        "  log ring@telemetry len 2048 format raw local0",
        "  hard-stop-after 30s",
        # the filter of the pin backends (loading it costs no request anything)
        f"  lua-load {layout.run_dir / PIN_GRPC_LUA}",
        *(f"  {key} {value}" for key, value in tuning(layout).items()),
        "",
        # a ring buffer streamed to the control plane: bursts wait in the ring instead of
        # being dropped (a datagram socket's queue is a few lines long)
        "ring telemetry",
        "  format raw",
        "  maxlen 2048",
        "  size 16777216",
        "  timeout connect 2s",
        "  timeout server 300s",
        f"  server control unix@{layout.log_socket}",
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


def _frontend(snapshot: Snapshot, layout: Layout, proto: str) -> str:
    http = proto == "http"
    bind = layout.http_bind if http else f"{layout.grpc_bind} proto h2"
    lines = [
        f"frontend {proto}",
        f"  bind {bind}",
        f"  errorfiles {proto}_errors",
        f'  log-format "{LOG_FORMAT}"',
        "  option http-keep-alive" if http else "  option http-no-delay",
    ]
    if http:
        lines += [
            f"  acl infer_path path_reg {model_name.HTTP_INFER_PATTERN}",
            "  acl infer_method method POST",
        ]
        guard = "infer_path infer_method"
        model_fetch = "path,field(4,/),url_dec"
    else:
        lines.append(f"  acl infer_path path {GRPC_INFER}")
        guard = "infer_path"
        model_fetch = f"req.body,bytes(5),protobuf({model_name.GRPC_MODEL_FIELD})"
    python = _python_backend(layout, proto)
    lines.append(f"  http-request set-log-level silent unless {guard}")
    if layout.local_http is not None:  # a replica: the control plane's calls go there
        lines += [f"  acl control_call {acl}" for acl in _control_acls(http)]
        # (an inference request has txn.proto set: it never evaluates control_call)
        lines.append(f"  use_backend control_{proto} if !{{ var(txn.proto) -m found }} "
                     "control_call")
    lines.append(f"  use_backend {python} unless {guard}")
    first: list[tuple[str, str]] = [(f"set-var(txn.proto) str({proto})", "")]
    if not http:
        # only as much of the body as the model name needs (streams must not wait)
        first.append(("wait-for-body time 1s at-least 1k", ""))
    first.append((f"set-var(txn.model) {model_fetch}", ""))
    answer = http_return if http else grpc_return
    if http:
        too_large = answer(errors.PayloadTooLarge,
                           f"request body larger than {layout.max_body_bytes} bytes")
        first.append((too_large, f"{{ req.hdr_val(content-length) gt {layout.max_body_bytes} }}"))
    else:
        # a gRPC message says its length in its 5-byte prefix (big-endian, bytes 1-4)
        # Answering while the client still sends races its reading of the answer with
        # the stream's reset: the control plane's gRPC server reads the message through
        # and refuses it (RESOURCE_EXHAUSTED, its max_receive_message_length)
        first += [("set-var(txn.glen) req.body,bytes(1,4),be2dec(:,4)", ""),
                  ("set-var(txn.out) str(too_large)",
                   f"{{ var(txn.glen) -m int gt {layout.max_body_bytes} }}")]
    rules = [*first, *_request_rules(answer, http), *_deadline_fetch(http),
             *_model_rules(snapshot, answer, http), *_shadow_rules(http),
             *_rollout_rules(http), *_residency_rules(snapshot),
             *queueing.bypass_rules(snapshot, http, _bufsize(layout))]
    lines += [
        *(f"  acl {acl}" for acl in _acls()),
        *(_guarded(action, cond, guard) for action, cond in rules),
    ]
    if not http:
        lines.append("  http-response set-var(txn.gs) res.hdr(grpc-status)")
        # HAProxy drops content-type from a return without payload: put it back
        lines.append("  http-after-response set-header content-type application/grpc "
                     "if { var(txn.model) -m found } !{ res.hdr(content-type) -m found }")
    if not http:
        lines.append(f"  use_backend {python} if {{ var(txn.out) -m str too_large }}")
        lines.append(f"  use_backend {python} if {{ var(txn.detour) -m found }}")
    # a rollout's shadow step: its sampled share is the Python forwarder's (it mirrors it;
    # a replica's reports the pairs to the control plane's verdict)
    lines.append(f"  use_backend {python} if {{ var(txn.shadow) -m found }}")
    # a gRPC request pinned here goes to its backend's pin twin (_pin_backends)
    pinned = [] if http else [f"{{ var(txn.ver) -m found }} {{ var(txn.{v}) -m found }}"
                              for v in ("rb", "pool")]
    if snapshot.residents():
        lines += [f"  use_backend {python} if {{ var(txn.rb) -m str {MISS} }}",
                  *(f"  use_backend {proto}_%[var(txn.rb)]{PIN} if {cond}"
                    for cond in pinned[:1]),
                  f"  use_backend {proto}_%[var(txn.rb)] if {{ var(txn.rb) -m found }}"]
    lines += [f"  use_backend {proto}_%[var(txn.pool)]{PIN} if {cond}" for cond in pinned[1:]]
    lines += queueing.bypass_backend_rule(snapshot, http)
    lines.append(f"  use_backend {proto}_%[var(txn.pool)] if {{ var(txn.pool) -m found }}")
    return "\n".join(lines) + "\n"


def _python_backend(layout: Layout, proto: str) -> str:
    """The backend of the Python forwarder, for what HAProxy cannot route: a replica's
    own (``local_``), else the control plane's process, which runs it too."""
    return f"{'local' if layout.local_http is not None else 'control'}_{proto}"


def _control_acls(http: bool) -> list[str]:
    """``control_call``: a call that is the control plane's (gateway/policy/planes.py)."""
    if not http:
        return ["path " + " ".join(f"/{planes.GRPC_SERVICE}/{m}"
                                   for m in planes.CONTROL_GRPC_METHODS)]
    return ["path_beg " + " ".join(planes.CONTROL_HTTP_PREFIXES),
            "path " + " ".join(planes.CONTROL_HTTP_PATHS),
            f"path_reg {planes.CONTROL_HTTP_PATTERN}"]


def _acls() -> list[str]:
    timeout = deadline.HTTP_TIMEOUT_HEADER
    return [
        "named var(txn.model) -m len 1:",
        f"has_timeout req.fhdr({timeout}) -m found",
        f"good_timeout req.fhdr({timeout}) -m reg {deadline.HTTP_TIMEOUT_PATTERN}",
        "nr var(txn.nr) -m found",
        "has_key var(txn.key) -m len 1:",  # an empty key is no key
        "has_scopes var(txn.scopes) -m found",
        "may_predict var(txn.scopes) -m reg (^|,)(predict|admin)(,|;)",
        "has_pool var(txn.pool) -m found",
        "has_class var(txn.tc) -m found",
        "over_limit var(txn.over) -m int gt 0",
        "bearer req.fhdr(authorization) -i -m beg bearer",
        "x_api_key req.fhdr(x-api-key) -m found",
    ]


def _guarded(action: str, cond: str, guard: str) -> str:
    """``http-request <action> if <guard> <cond>``: the model rules run for inference
    requests only (use_backend is decided after every http-request rule)."""
    action = action.removeprefix("http-request ")
    return f"  http-request {action} if {guard} {cond}".rstrip()


Rule = tuple[str, str]  # (action, condition)


def _request_rules(answer: Callable[..., str], http: bool) -> list[Rule]:
    """The policy's ``request`` check: a model named, a well-formed deadline, no shape
    beyond any request (HTTP)."""
    rules: list[Rule] = [
        ("set-var(txn.out) str(invalid)", "!named"),
        (answer(errors.InvalidInput, model_name.NO_MODEL), "!named"),
    ]
    if not http:
        # json(utf8) yields nothing for bytes that are not UTF-8
        rules += [
            ("set-var(txn.mu) var(txn.model),json(utf8)", ""),
            ("set-var(txn.out) str(invalid)", "!{ var(txn.mu) -m found }"),
            (answer(errors.InvalidInput, model_name.NOT_UTF8), "!{ var(txn.mu) -m found }"),
        ]
    if http:
        header = deadline.HTTP_TIMEOUT_HEADER
        value = f"%[req.fhdr({header}),bytes(0,64),json(utf8s)]"
        rules += [
            ("set-var(txn.out) str(invalid)", "has_timeout !good_timeout"),
            (answer(errors.InvalidInput, deadline.BAD_HTTP_TIMEOUT.format(value=value)),
             "has_timeout !good_timeout"),
        ]
        # the start of the body, as gateway.policy.shape scans it (single quotes: PCRE
        # gets the pattern as written)
        huge = f"{{ req.body -m reg '{shape.HUGE_SHAPE_PATTERN}' }}"
        rules += [
            (f"wait-for-body time 1s at-least {shape.SCANNED_BYTES}", ""),
            ("set-var(txn.out) str(invalid)", huge),
            (answer(errors.InvalidInput, shape.HUGE_SHAPE), huge),
        ]
    return rules


def _model_rules(snapshot: Snapshot, answer: Callable[..., str], http: bool) -> list[Rule]:
    """The policy's checks after the request's own: auth, rate, route, readiness,
    admission (``gateway.policy.ORDER``)."""
    model_lf = "%[var(txn.model),json(utf8s)]" if http else "%[var(txn.model)]"
    classes = snapshot.rate_classes()
    if not classes and not snapshot.predict_gated and snapshot.tenancy is None:
        return _pool_rules(snapshot, answer, model_lf)  # no one asks who calls
    rules: list[Rule] = [
        # who is calling: X-API-Key, else Authorization: Bearer (one precedence)
        ("set-var(txn.key) req.fhdr(x-api-key)", "x_api_key"),
        ("set-var(txn.key) req.fhdr(authorization),bytes(7)", "!has_key bearer"),
    ]
    if snapshot.predict_gated:
        lacks = access.LACKS_SCOPE.format(name="%[var(txn.scopes),field(2,;)]",
                                          scope="predict")
        rules += [
            ("set-var(txn.out) str(auth)", "!has_key"),
            (answer(errors.Unauthorized, access.MISSING_TOKEN), "!has_key"),
            (f"set-var(txn.kd) var(txn.key),{access.HAPROXY_DIGEST}", ""),
            ("set-var(txn.scopes) var(txn.kd),map(MAPS/tokens.map)", ""),
            ("set-var(txn.out) str(auth)", "!has_scopes"),
            (answer(errors.Unauthorized, access.UNKNOWN_TOKEN), "!has_scopes"),
            ("set-var(txn.out) str(auth)", "!may_predict"),
            (answer(errors.Forbidden, lacks), "!may_predict"),
        ]
    rules += [
        (f"set-var(txn.key) str({access.ANONYMOUS})", "!has_key"),
        (f"set-var(txn.kd) var(txn.key),{access.HAPROXY_DIGEST}", ""),
    ]
    if snapshot.tenancy is not None:
        rules += [
            (f"set-var(txn.tn) var(txn.kd),map(MAPS/tenants.map,{tenancy.DEFAULT_TENANT})", ""),
            # no class: tenancy turned off (TenancyState.enabled), the rules admit
            ("set-var(txn.tc) var(txn.tn),map(MAPS/tclass.map)", ""),
        ]
    if classes or snapshot.tenancy is not None:
        rules += _rate_rules(snapshot, answer)
    return [*rules, *_pool_rules(snapshot, answer, model_lf)]


def _rate_rules(snapshot: Snapshot, answer: Callable[..., str]) -> list[Rule]:
    """Rate limits: per API key digest in the table of its class; a tenant with limits of
    its own is counted as one key, ``t:<tenant>`` (its in-flight count is the same
    entry's ``conn_cur``: table ``tenant_flight`` when it has no rate)."""
    classes = snapshot.rate_classes()
    default = str(classes.index(snapshot.rate_default)) if snapshot.rate_default else "none"
    rules: list[Rule] = [
        (f"set-var(txn.rc) var(txn.kd),map(MAPS/ratekeys.map,{default})", ""),
    ]
    key, own = "var(txn.kd)", "{ var(txn.tl) -m found }"
    if snapshot.tenancy is not None:
        key = "var(txn.rk)"
        rules += [
            ("set-var(txn.rk) var(txn.kd)", ""),
            ("set-var(txn.tl) var(txn.tn),map(MAPS/tlimit.map)", ""),
            ("set-var(txn.rk) str(t:),concat(,txn.tn,)", own),
            ("set-var(txn.rc) var(txn.tl)", own),
            (f"track-sc2 {key} table tenant_flight", f"{{ var(txn.rc) -m str {NO_RATE} }}"),
        ]
    for i, limit in enumerate(classes):
        cls = f"{{ var(txn.rc) -m str {i} }}"
        over = f"{cls} {{ sc2_http_req_rate gt {limit.limit} }}"
        rules += [
            (f"track-sc2 {key} table rate{i}", cls),
            ("set-var(txn.out) str(rejected)", over),
            ("set-var(txn.why) str(rate)", over),
        ]
        if snapshot.tenancy is not None:  # the tenant's own limit says so
            who = tenancy.RATE_WHO.format(tenant="%[var(txn.tn)]")
            rules.append((answer(errors.Overloaded, limit.message(who),
                                 retry_after=limit.retry_after_s), f"{over} {own}"))
        rules.append((answer(errors.Overloaded, limit.message(),
                             retry_after=limit.retry_after_s), over))
    return rules


def _pool_rules(snapshot: Snapshot, answer: Callable[..., str], model_lf: str) -> list[Rule]:
    """The pool (weighted split; none: unknown), readiness, then with tenants the
    tenancy rule (:func:`_tenancy_rules`), then the model's bound (:func:`_bound_rules`)."""
    default_limit = snapshot.default_route.max_in_system if snapshot.default_route else 1
    not_ready = readiness.not_ready_message(model_lf, "%[var(txn.nr)]")
    route_key = ("var(txn.model),concat(/,txn.pool,)" if snapshot.tenancy is None
                 else "var(txn.model),concat(/,txn.pool,/),concat(,txn.tn,)")
    rules = _split_rules(snapshot)
    rules += [
        ("set-var(txn.out) str(unknown)", "!has_pool"),
        (answer(errors.ModelNotFound, model_name.UNKNOWN_MODEL.format(model=model_lf)),
         "!has_pool"),
        # a model still loading or warming up
        ("set-var(txn.nr) var(txn.model),map(MAPS/notready.map)", ""),
        ("set-var(txn.out) str(not_ready)", "nr"),
        (answer(errors.ModelNotReady, not_ready, retry_after=readiness.RETRY_AFTER_S), "nr"),
        (f"set-var(txn.mp) {route_key}", ""),
        ("track-sc1 var(txn.mp) table st_route", ""),
    ]
    if snapshot.tenancy is not None:
        rules += _tenancy_rules(snapshot, answer)
    return [*rules, *_bound_rules(snapshot, answer, model_lf, default_limit),
            *_deadline_rules(snapshot, answer, model_lf), *queueing.priority_rules(snapshot)]


def _bound_rules(snapshot: Snapshot, answer: Callable[..., str], model_lf: str,
                 default_limit: int) -> list[Rule]:
    """The model's bound (:mod:`gateway.policy.admission`), tracked only now, after the
    tenancy rules: a request they refused never holds a place in the model's count. With
    tenants it is per class (``Tenancy.model_bound``): ``st_model`` counts
    ``model/class``, the bound is scaled by map ``cbound`` (class -> permille), and a
    request counts the requests of its class and of the classes above it
    (``tenancy.AT_LEAST``, read with ``table_conn_cur``)."""
    overloaded = admission.OVERLOADED.format(model=model_lf, count="%[var(txn.mc)]",
                                             limit="%[var(txn.lim)]")
    rules: list[Rule] = [("set-var(txn.mk) var(txn.model)", "")]
    if snapshot.tenancy is not None:
        rules.append(("set-var(txn.mk) var(txn.model),concat(/,txn.tc,)", "has_class"))
    rules += [
        ("track-sc0 var(txn.mk) table st_model", ""),
        ("set-var(txn.mc) sc0_conn_cur", ""),
        (f"set-var(txn.lim) var(txn.model),map_str_int(MAPS/limits.map,{default_limit})", ""),
    ]
    if snapshot.tenancy is not None:
        for above in tenancy.Priority:
            below = [k.value for k in tenancy.Priority
                     if above in tenancy.AT_LEAST[k] and above is not k]
            if not below:
                continue
            cond = f"{{ var(txn.tc) -m str {' '.join(below)} }}"
            rules += [
                (f"set-var(txn.k{above.value[0]}) var(txn.model),concat(/{above.value}),"
                 "table_conn_cur(st_model)", cond),
                (f"set-var(txn.mc) var(txn.mc),add(txn.k{above.value[0]})",
                 f"{cond} {{ var(txn.k{above.value[0]}) -m found }}"),
            ]
        rules += [
            ("set-var(txn.pm) var(txn.tc),map_str_int(MAPS/cbound.map,1000)", "has_class"),
            ("set-var(txn.lim) var(txn.lim),mul(txn.pm),div(1000)", "has_class"),
            ("set-var(txn.lim) int(1)", "{ var(txn.lim) -m int lt 1 }"),
        ]
    rules += [
        ("set-var(txn.over) var(txn.mc),sub(txn.lim)", ""),
        ("set-var(txn.out) str(rejected)", "over_limit"),
        ("set-var(txn.why) str(overloaded)", "over_limit"),
        (answer(errors.Overloaded, overloaded, retry_after=admission.RETRY_AFTER_S),
         "over_limit"),
    ]
    return rules


def _tenancy_rules(snapshot: Snapshot, answer: Callable[..., str]) -> list[Rule]:
    """``gateway.policy.tenancy.decide``: the tenant's in-flight limit (``sc2``, its own
    entry), the class ceiling on the pool's load (``be_conn`` of the pool's backends plus
    the requests queued elsewhere), the tenant's share once the pool is saturated
    (``sc1``: the tenant's requests for this model in this pool)."""
    rules: list[Rule] = [
        ("set-var(txn.tm) var(txn.tn),map_str_int(MAPS/tmax.map,0)", ""),
        ("set-var(txn.to) sc2_conn_cur,sub(txn.tm)", ""),
    ]
    limit = "{ var(txn.tm) -m int gt 0 } { var(txn.to) -m int gt 0 }"
    rules += _refuse(answer, "tenant_limit", tenancy.TENANT_LIMIT.format(
        tenant="%[var(txn.tn)]", count="%[sc2_conn_cur]", limit="%[var(txn.tm)]"), limit)
    rules += _load_rules(snapshot, "")
    rules += [
        ("set-var(txn.ck) var(txn.pool),concat(/,txn.tc,)", ""),
        ("set-var(txn.ceil) var(txn.ck),map_str_int(MAPS/ceiling.map,1)", ""),
        ("set-var(txn.sat) var(txn.pl),sub(txn.ceil)", ""),
    ]
    lf = {"pool": "%[var(txn.pool)]", "load": "%[var(txn.pl)]", "capacity": "%[var(txn.cap)]",
          "tenant": "%[var(txn.tn)]"}
    rules += _refuse(answer, "saturated", tenancy.SATURATED.format(
        **lf, priority="%[var(txn.tc)]", ceiling="%[var(txn.ceil)]"),
        "has_class { var(txn.sat) -m int ge 0 }")
    rules += [
        ("set-var(txn.co) var(txn.pl),sub(txn.cap)", ""),
        ("set-var(txn.sk) var(txn.pool),concat(/,txn.tn,)", ""),
        ("set-var(txn.sh) var(txn.sk),map_str_int(MAPS/share.map,1)", ""),
        ("set-var(txn.fo) sc1_conn_cur,sub(txn.sh)", ""),
    ]
    rules += _refuse(answer, "fair_share", tenancy.FAIR_SHARE.format(
        **lf, share="%[var(txn.sh)]"),
        "has_class { var(txn.co) -m int ge 0 } { var(txn.fo) -m int gt 0 }")
    return rules


def _load_rules(snapshot: Snapshot, cond: str) -> list[Rule]:
    """The pool's load (``txn.pl``: ``be_conn`` of its two backends plus the requests
    queued in its members that are not the gateway's) and capacity (``txn.cap``)."""
    rules: list[Rule] = [("set-var(txn.pl) int(0)", cond)]
    for pool in snapshot.pools:
        this = f"{cond} {{ var(txn.pool) -m str {pool.name} }}".strip()
        rules += [(f"set-var(txn.pl) be_conn(http_{pool.name})", this),
                  (f"set-var(txn.pl) be_conn(grpc_{pool.name}),add(txn.pl)", this),
                  (f"set-var(txn.pl) be_conn(grpc_{pool.name}{PIN}),add(txn.pl)", this),
                  *((f"set-var(txn.pl) be_conn({b}),add(txn.pl)", this)
                    for b in queueing.load_backends(pool))]
        # a managed model's requests are at its own backends in the pool
        rules += [(f"set-var(txn.pl) be_conn({backend}),add(txn.pl)", this)
                  for r in snapshot.residents() if r.pool == pool.name
                  for backend in (f"http_{r.backend}", f"grpc_{r.backend}",
                                  f"grpc_{r.backend}{PIN}")]
    return rules + [
        ("set-var(txn.eq) var(txn.pool),map_str_int(MAPS/elsewhere.map,0)", cond),
        ("set-var(txn.pl) var(txn.pl),add(txn.eq)", cond),
        ("set-var(txn.cap) var(txn.pool),map_str_int(MAPS/capacity.map,1)", cond),
    ]


def _deadline_rules(snapshot: Snapshot, answer: Callable[..., str], model_lf: str) -> list[Rule]:
    """``gateway.policy.deadline``: a request whose deadline (``txn.dl``, ms) the pool
    cannot meet, by the model's service time there (map ``service``) and the wait for
    the pool's load beyond its capacity (map ``drain``: microseconds per request), is
    refused at once (504 / DEADLINE_EXCEEDED), in the integers
    :func:`gateway.policy.deadline.expected_ms` uses."""
    dl = "{ var(txn.dl) -m found }"
    rules = [] if snapshot.tenancy is not None else _load_rules(snapshot, dl)
    hopeless = f"{dl} {{ var(txn.sv) -m int gt 0 }} {{ var(txn.late) -m int gt 0 }}"
    message = deadline.HOPELESS.format(
        deadline="%[var(txn.dl)]", model=model_lf, expected="%[var(txn.eta)]",
        pool="%[var(txn.pool)]", load="%[var(txn.pl)]", capacity="%[var(txn.cap)]")
    return rules + [
        ("set-var(txn.smp) var(txn.model),concat(/,txn.pool,)", dl),
        ("set-var(txn.sv) var(txn.smp),map_str_int(MAPS/service.map,0)", dl),
        ("set-var(txn.dr) var(txn.smp),map_str_int(MAPS/drain.map,0)", dl),
        ("set-var(txn.ex) var(txn.pl),add(1),sub(txn.cap)", dl),
        ("set-var(txn.ex) int(0)", f"{dl} {{ var(txn.ex) -m int lt 0 }}"),
        ("set-var(txn.eta) var(txn.dr),mul(txn.ex),add(txn.sv),div(1000)", dl),
        # deadline.hopeless: expected x 10 beyond deadline x 9
        (f"set-var(txn.dn) var(txn.dl),mul({deadline.SHARE_NUM})", dl),
        (f"set-var(txn.late) var(txn.eta),mul({deadline.SHARE_DEN}),sub(txn.dn)", dl),
        ("set-var(txn.out) str(shed)", hopeless),
        ("set-var(txn.why) str(deadline)", hopeless),
        (answer(errors.DeadlineExceeded, message), hopeless),
    ]


def _deadline_fetch(http: bool) -> list[Rule]:
    """The client's deadline in milliseconds (``txn.dl``), as each protocol says it
    (``gateway.policy.deadline``): the member's server timeout, and the deadline rule's."""
    if http:
        return [(f"set-var(txn.dl) req.fhdr({deadline.HTTP_TIMEOUT_HEADER}),add(0)",
                 "has_timeout good_timeout")]
    rules: list[Rule] = [
        ("set-var(txn.gt) req.hdr(grpc-timeout),regsub([^0-9],,g)",
         f"{{ req.hdr(grpc-timeout) -m reg {deadline.GRPC_TIMEOUT_PATTERN} }}"),
    ]
    rules += [(f"set-var(txn.dl) var(txn.gt){conv}",
               f"{{ var(txn.gt) -m found }} {{ req.hdr(grpc-timeout) -m end {unit} }}")
              for unit, conv in deadline.GRPC_TIMEOUT_MS_CONVERTERS.items()]
    return rules


def _shadow_rules(http: bool) -> list[Rule]:
    """A rollout's shadow step (map ``shadow``: model -> percent,
    ``gateway.policy.rollout.Shadow``). HAProxy cannot copy a request: an unversioned
    request of the model goes to the control plane when ``rand(100)`` is below the
    percent (``txn.shadow``, the frontend's ``use_backend``), marked with
    ``SHADOW_HEADER``; its forwarder answers it from stable (the split is at 0 %) and
    mirrors it to the candidate, and counts it (not logged here). A client's own mark
    is dropped. Before the rollout's rules: the request is still unversioned there."""
    if http:
        unversioned = f"{{ path_reg {model_name.HTTP_UNVERSIONED_INFER_PATTERN} }}"
    else:
        unversioned = (f"!{{ req.body,bytes(5),protobuf({model_name.GRPC_VERSION_FIELD}) "
                       "-m len 1: }")
    under = "{ var(txn.sp) -m int gt 0 }"
    sampled = "{ var(txn.shadow) -m found }"
    return [
        ("set-var(txn.sp) var(txn.model),map_str_int(MAPS/shadow.map,0)", ""),
        (f"del-header {SHADOW_HEADER}", under),
        ("set-var(txn.sd) rand(100),sub(txn.sp)", under),
        ("set-var(txn.shadow) int(1)", f"{under} {{ var(txn.sd) -m int lt 0 }} {unversioned}"),
        (f"set-header {SHADOW_HEADER} 1", sampled),
        ("set-log-level silent", sampled),
    ]


def _rollout_rules(http: bool) -> list[Rule]:
    """A model under rollout (maps ``rstable`` / ``rcand`` / ``rollout``,
    ``gateway.policy.rollout.Split``): an unversioned request is pinned to the candidate
    when ``rand(100)`` is below its percent, else to stable, and ``txn.ver`` (logged)
    says which: the log line tallies it for the verdict, on both protocols.
    HTTP: the path gets the version.
    gRPC: the request goes to its backend's pin twin (:func:`_pin_backends`), whose Lua
    filter (``pin_grpc.lua``) appends ``model_version`` to the message as it streams
    through and raises the length prefix (~18 us of HAProxy CPU a pinned request; none
    for the others). Still sent to the control plane's gRPC server, which pins them (and
    counts them: not logged here): a body whose ``content-length`` is not the one
    message's (5 + its prefix's length), and, defensively, a compressed message (flag
    byte 1: never appended to; in practice HAProxy cannot read its model name and
    refuses it before this rule). A message that names a version in its first bytes
    (``protobuf`` of the buffered start, as the model name) keeps it.
    """
    under = "{ var(txn.rs) -m found }"
    if not http:
        named = "{ var(txn.mv) -m len 1: }"
        return [
            ("set-var(txn.rs) var(txn.model),map(MAPS/rstable.map)", ""),
            ("set-var(txn.detour) int(1)", f"{under} {{ req.body,bytes(0,1),hex -m str 01 }}"),
            (f"set-var(txn.mv) req.body,bytes(5),protobuf({model_name.GRPC_VERSION_FIELD})",
             f"{under} !{{ var(txn.detour) -m found }}"),
            ("set-var(txn.cl) req.hdr(content-length),sub(txn.glen)",
             f"{under} !{named} {{ req.hdr(content-length) -m found }}"),
            ("set-var(txn.detour) int(1)", f"{under} {{ var(txn.cl) -m found }} "
             "!{ var(txn.cl) -m int eq 5 }"),
            ("set-log-level silent", "{ var(txn.detour) -m found }"),
            *_split_pick(f"{under} !{named} !{{ var(txn.detour) -m found }}"),
        ]
    unversioned = f"{{ path_reg {model_name.HTTP_UNVERSIONED_INFER_PATTERN} }}"
    return [
        ("set-var(txn.rs) var(txn.model),map(MAPS/rstable.map)", unversioned),
        *_split_pick(under),
        ("set-path %[path,regsub(/infer,/versions/)]%[var(txn.ver)]/infer", under),
    ]


def _split_pick(cond: str) -> list[Rule]:
    """``txn.ver``: ``Split.pick`` of one ``rand(100)`` for a request pinned here."""
    return [
        ("set-var(txn.rp) var(txn.model),map_str_int(MAPS/rollout.map,0)", cond),
        ("set-var(txn.rd) rand(100),sub(txn.rp)", cond),
        ("set-var(txn.ver) var(txn.rs)", cond),
        ("set-var(txn.ver) var(txn.model),map(MAPS/rcand.map)",
         f"{cond} {{ var(txn.rd) -m int lt 0 }}"),
    ]


def _residency_rules(snapshot: Snapshot) -> list[Rule]:
    """Model residency, the last rule: a managed model's ``pool/model`` in map
    ``resident`` gives its backend in that pool (``txn.rb``, servers ready only on its
    holders) or ``miss``: the request goes to the control plane, which holds it while
    the model loads and counts it (so HAProxy logs no line for it). ``txn.pool`` keeps
    the pool's name: the log line, the tables and the rules above name pools."""
    if not snapshot.residents():
        return []
    return [("set-var(txn.rb) var(txn.pool),concat(/,txn.model,),map(MAPS/resident.map)", ""),
            ("set-log-level silent", f"{{ var(txn.rb) -m str {MISS} }}")]


def _refuse(answer: Callable[..., str], reason: str, message: str, cond: str) -> list[Rule]:
    return [("set-var(txn.out) str(rejected)", cond),
            (f"set-var(txn.why) str({reason})", cond),
            (answer(errors.Overloaded, message, retry_after=tenancy.RETRY_AFTER_S), cond)]


def _split_rules(snapshot: Snapshot) -> list[Rule]:
    ranks = snapshot.split_ranks()
    default_pools, default_cuts = (split(snapshot.default_route, ranks)
                                   if snapshot.default_route else ([""] * ranks, [1000] * ranks))
    first = f",{default_pools[0]}" if default_pools[0] else ""
    rules: list[Rule] = [(f"set-var(txn.pool) var(txn.model),map(MAPS/route0.map{first})", "")]
    if ranks > 1:
        rules.append(("set-var(txn.r) rand(1000)", ""))
    for k in range(1, ranks):
        pool_default = f",{default_pools[k]}" if default_pools[k] else ""
        rules += [
            (f"set-var(txn.c) var(txn.model),map_str_int(MAPS/cut{k}.map,{default_cuts[k]})", ""),
            ("set-var(txn.d) var(txn.r),sub(txn.c)", ""),
            (f"set-var(txn.pool) var(txn.model),map(MAPS/route{k}.map{pool_default})",
             "{ var(txn.d) -m int ge 0 }"),
        ]
    return rules


def _tables(snapshot: Snapshot) -> str:
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
                  "  stick-table type string len 64 size 10k expire 10m store conn_cur"]
    return "\n".join(lines) + "\n"


def _control_backends(layout: Layout) -> str:
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
        f"  timeout server {layout.stream_timeout_s}s",
        f"  timeout client {layout.stream_timeout_s}s",
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


def _pool_backend(pool: PoolState, proto: str, layout: Layout) -> str:
    http = proto == "http"
    check = (f"check inter {layout.health_interval_ms}ms fall {HEALTH_FALL} rise 1 "
             f"observe layer4 error-limit {EJECT_AFTER_FAILURES} on-error mark-down")
    lines = _backend_head(f"{proto}_{pool.name}", proto, health=True)
    lines += queueing.backend_lines(pool, proto)
    cap = queueing.server_cap(pool)
    for m in pool.members:
        port = m.http_port if http else m.grpc_port
        extra = "" if http else f"{_grpc_server(m, layout)} port {m.http_port} check-proto h1"
        lines.append(
            f"  server {m.name} {m.host}:{port} {check} "
            f"weight {m.weight}{cap}{extra}{'' if m.routable else ' disabled'}"
        )
    return "\n".join(lines) + "\n"


def _model_backends(snapshot: Snapshot, layout: Layout) -> list[str]:
    pools = {p.name: p for p in snapshot.pools}
    return [_model_backend(pools[r.pool], r, proto, layout)
            for proto in ("http", "grpc") for r in snapshot.residents()]


def _model_backend(pool: PoolState, resident: Resident, proto: str, layout: Layout) -> str:
    """A managed model's backend in a pool: the pool backend's settings, its servers
    tracking the pool's (health and maintenance follow the member; no checks of their
    own), ready only on the model's holders (``disabled``, maintenance, elsewhere;
    ``gateway.haproxy.changes`` moves them live)."""
    http = proto == "http"
    lines = _backend_head(f"{proto}_{resident.backend}", proto, health=False)
    # HTTP only: a queued gRPC stream can stall its client connection (haproxy/queueing.py)
    cap = queueing.server_cap(pool) if http else ""
    if http:
        lines += queueing.backend_lines(pool, proto)
    for m in pool.members:
        port = m.http_port if http else m.grpc_port
        extra = "" if http else _grpc_server(m, layout)
        held = m.name in resident.holders
        lines.append(f"  server {m.name} {m.host}:{port} track {proto}_{pool.name}/{m.name} "
                     f"weight {m.weight}{cap}{extra}{'' if held else ' disabled'}")
    return "\n".join(lines) + "\n"


PIN = ".pin"  # a gRPC backend's pin twin: grpc_<pool>.pin, grpc_<pool>.r<h>.pin


def _pin_backends(snapshot: Snapshot, layout: Layout) -> list[str]:
    """One twin per gRPC backend (a pool's, a managed model's), for the requests
    :func:`_rollout_rules` pinned: the same servers (each tracking the pool's: health and
    maintenance; a model's twin ready on its holders alone), the same settings, and the
    Lua filter that pins the message (``pin_grpc.lua``). A filter declared in a backend
    is attached to the streams that enter it only: every other request pays nothing for
    it (one declared in the frontend costs every gRPC request its Lua contexts, ~11 us).
    Rendered whatever the rollouts, so that one starting or ending is a map change, not
    a reload. ``gateway.telemetry.read_haproxy`` counts a twin's requests in its pool
    (``grpc_<pool>`` before the dot); a model's twin's are not its drain count, but a
    model under rollout is not evicted."""
    pools = {p.name: p for p in snapshot.pools}
    twins: list[tuple[PoolState, str, Resident | None]] = [
        (p, p.name, None) for p in snapshot.pools]
    twins += [(pools[r.pool], r.backend, r) for r in snapshot.residents()]
    out = []
    for pool, name, resident in twins:
        # no L7 retry (retry-on empty-response would replay a copy of the request
        # the filter already changed): a connection failure is still retried
        lines = [line for line in _backend_head(f"grpc_{name}{PIN}", "grpc", health=False)
                 if "retry-on" not in line]
        lines += [f"  filter lua.{PIN_GRPC_FILTER}",
                  # field 2's bytes: tag, length, the digits
                  "  http-request set-var(txn.vl) var(txn.ver),length,add(2)",
                  "  http-request set-header content-length "
                  "%[req.hdr(content-length),add(txn.vl)] if { req.hdr(content-length) -m found }"]
        for m in pool.members:
            held = resident is None or m.name in resident.holders
            lines.append(f"  server {m.name} {m.host}:{m.grpc_port} track grpc_{pool.name}/"
                         f"{m.name} weight {m.weight}{_grpc_server(m, layout)}"
                         f"{'' if held else ' disabled'}")
        out.append("\n".join(lines) + "\n")
    return out


def _backend_head(name: str, proto: str, health: bool) -> list[str]:
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


def _grpc_server(member: MemberState, layout: Layout) -> str:
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


def with_map_paths(config: str, layout: Layout) -> str:
    return config.replace("MAPS/", f"{layout.run_dir / 'maps'}/")
