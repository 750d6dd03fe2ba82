"""The frontends (pure, no I/O): one per protocol, with its bind, its ACLs, the request
rules in the order of the hot path (:mod:`gateway.haproxy.config` lists it; the rules
are :mod:`gateway.haproxy.request_rules`' and :mod:`gateway.haproxy.admission_rules`'),
and the ``use_backend`` rules that send a request to the Python forwarder, a pool's backend,
a managed model's, or their gRPC pin twins (:mod:`gateway.haproxy.backends`).

Variables live in two scopes. HAProxy 2.6 keeps each scope's variables of a stream in a
list, in the order they were set, and reads one (every ``var()``, and every ``set-var``
first) by walking that list: with tenancy an admitted request set about 70, and a rule
testing one set late or not at all cost about six times what it cost with five set
(docs/haproxy.md). So ``txn`` holds what is read after the request's rules or outside
them (the log line's fields, the response rules', the backends', the Lua filters'), and
``req`` the rules' own working values, which only the frontend's request rules, ACLs and
``use_backend`` rules read (HAProxy frees them when the response begins).
``tests/gateway/haproxy/test_variables.py`` holds every configuration to it.
"""

from __future__ import annotations

from gateway import errors
from gateway.haproxy import priority_rules, queueing
from gateway.haproxy.admission_rules import REFUSAL_BACKEND, REFUSAL_WAIT
from gateway.haproxy.answers import grpc_return, http_return
from gateway.haproxy.backends import PIN
from gateway.haproxy.deadline_rules import deadline_fetch
from gateway.haproxy.maps import MISS
from gateway.haproxy.request_rules import (
    model_rules,
    request_rules,
    residency_rules,
    rollout_rules,
    shadow_rules,
)
from gateway.haproxy.snapshot import Layout, Snapshot
from gateway.policy import deadline, model_name, planes

GRPC_INFER = "/inference.GRPCInferenceService/ModelInfer"
# one line per inference request, to the control plane's datagram socket (telemetry.py).
# %Ta is the request's own active time, from its first byte to the response's last: %Tt
# would add the time a keep-alive connection sat idle before the request (%Ti), so a
# client pausing 40 ms between calls of 3 ms each would be reported as 43 ms
LOG_FORMAT = ("%[var(txn.model)] %[var(txn.pool)] %[var(txn.proto)] %ST "
              "%[var(txn.gs)] %Ta %[var(txn.out)] %ts "
              "%[var(txn.tn)] %[var(txn.tc)] %[var(txn.why)] %[var(txn.ver)] %Tw "
              "%[var(txn.dl)]")


COMPRESSED = "gz"  # a gRPC message sent compressed (req.gz): the Python forwarder serves it
INFERENCE = "inf"  # an inference request the model rules run for (req.inf: the guard passed)


def frontend(snapshot: Snapshot, layout: Layout, proto: str, bufsize: int) -> str:
    """The frontend of ``proto``: its bind, ACLs, the request rules in the policy's
    order (:mod:`gateway.haproxy.config` lists it) and the backend each request goes to;
    ``bufsize``: HAProxy's ``tune.bufsize`` (:func:`gateway.haproxy.config.tuning`)."""
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
        # a compressed message (grpc-encoding gzip or deflate, as tritonclient's
        # compression_algorithm sends): HAProxy cannot read its model's name, so none of
        # its rules runs on it and the Python forwarder takes it (grpcio decompresses
        # it; Triton accepts either). Read here, its "name" was compressed bytes: the
        # call failed (INVALID_ARGUMENT, or CANCELLED for a large message) where Triton
        # itself serves it.
        guard = f"infer_path !{{ var(req.{COMPRESSED}) -m found }}"
        model_fetch = f"req.body,bytes(5),protobuf({model_name.GRPC_MODEL_FIELD})"
    python = _python_backend(layout, proto)
    lines.append(f"  http-request set-log-level silent unless {guard}")
    # HAProxy runs every http-request rule before any use_backend: the routes are written
    # after the rules, in the order they are tried (written before, each later rule
    # drew a warning at every start)
    routes: list[str] = []
    if layout.local_http is not None:  # a replica: the control plane's calls go there
        lines += [f"  acl control_call {acl}" for acl in _control_acls(http)]
        # (an inference request has txn.proto set: it never evaluates control_call)
        routes.append(f"  use_backend control_{proto} if !{{ var(txn.proto) -m found }} "
                      "control_call")
    routes.append(f"  use_backend {python} unless {guard}")
    if snapshot.refusals_delayed() is not None:
        # a tenancy refusal that waits: the tarpit of its wait (admission_rules._refuse)
        wait = REFUSAL_BACKEND.format(proto=proto, ms=f"%[var(req.{REFUSAL_WAIT})]")
        routes.append(f"  use_backend {wait} if {{ var(req.{REFUSAL_WAIT}) -m found }}")
    opening: list[tuple[str, str]] = [(f"set-var(txn.proto) str({proto})", "")]
    if not http:
        # only as much of the body as the model name needs (streams must not wait)
        # the message's flag byte (before its length): 1, compressed (the Python
        # forwarder counts it, as every request it takes)
        flag = "{ req.body,bytes(0,1),hex -m str 01 }"
        opening += [("wait-for-body time 1s at-least 1k", ""),
                    ("set-log-level silent", flag),
                    (f"set-var(req.{COMPRESSED}) int(1)", flag)]
    # the guard's verdict kept: every later rule tests one variable, a fifth of what the
    # path and the compression flag cost HAProxy a rule (docs/haproxy.md, "The rules'
    # own conditions first")
    opening.append((f"set-var(req.{INFERENCE}) int(1)", ""))
    first: list[tuple[str, str]] = [(f"set-var(txn.model) {model_fetch}", "")]
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
    rules = [*first, *request_rules(answer, http), *deadline_fetch(http),
             *model_rules(snapshot, answer, http), *shadow_rules(http),
             *rollout_rules(http), *residency_rules(snapshot),
             *queueing.bypass_rules(snapshot, http, bufsize),
             *priority_rules.frontend_rules(snapshot, http)]
    lines += [
        *(f"  acl {acl}" for acl in _acls()),
        *(_guarded(action, cond, guard) for action, cond in opening),
        *(_guarded(action, cond, f"{{ var(req.{INFERENCE}) -m found }}")
          for action, cond in rules),
    ]
    if not http:
        lines.append("  http-response set-var(txn.gs) res.hdr(grpc-status)")
        # HAProxy drops content-type from a return without payload: put it back on every
        # answer of this frontend, those given before the model's name is read too (no
        # name, a token refused): gRPC clients other than grpc-python refuse an answer
        # without it ("malformed header: missing HTTP content-type")
        lines.append("  http-after-response set-header content-type application/grpc "
                     "unless { res.hdr(content-type) -m found }")
    lines += routes
    if not http:
        lines.append(f"  use_backend {python} if {{ var(txn.out) -m str too_large }}")
        lines.append(f"  use_backend {python} if {{ var(req.detour) -m found }}")
    # a rollout's shadow step: its sampled share is the Python forwarder's (it mirrors it;
    # a replica's reports the pairs to the control plane's verdict)
    lines.append(f"  use_backend {python} if {{ var(req.shadow) -m found }}")
    # a gRPC request pinned here goes to its backend's pin twin (backends.pin_backends)
    pinned = [] if http else [f"{{ var(txn.ver) -m found }} {{ var({v}) -m found }}"
                              for v in ("req.rb", "txn.pool")]
    if snapshot.residents():
        lines += [f"  use_backend {python} if {{ var(req.rb) -m str {MISS} }}",
                  *(f"  use_backend {proto}_%[var(req.rb)]{PIN} if {cond}"
                    for cond in pinned[:1]),
                  f"  use_backend {proto}_%[var(req.rb)] if {{ var(req.rb) -m found }}"]
    lines += [f"  use_backend {proto}_%[var(txn.pool)]{PIN} if {cond}" for cond in pinned[1:]]
    lines += queueing.bypass_backend_rule(snapshot, http)
    lines += queueing.lane_backend_rules(snapshot, http)
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
        "nr var(req.nr) -m found",
        "has_key var(req.key) -m len 1:",  # an empty key is no key
        "has_scopes var(req.scopes) -m found",
        "may_predict var(req.scopes) -m reg (^|,)(predict|admin)(,|;)",
        "has_pool var(txn.pool) -m found",
        "has_class var(txn.tc) -m found",
        "over_limit var(req.over) -m int gt 0",
        "bearer req.fhdr(authorization) -i -m beg bearer",
        "x_api_key req.fhdr(x-api-key) -m found",
    ]


def _guarded(action: str, cond: str, guard: str) -> str:
    """``http-request <action> if <cond> <guard>``: the model rules run for inference
    requests only (use_backend is decided after every http-request rule). The rule's own
    condition comes first: HAProxy stops at a condition's first false term, and on an
    admitted request most rules' own conditions are false (every refusal's), where the
    guard is true (docs/haproxy.md, "The rules' own conditions first")."""
    action = action.removeprefix("http-request ")
    return f"  http-request {action} if {' '.join(c for c in (cond, guard) if c)}"

