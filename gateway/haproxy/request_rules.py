"""The frontend's request rules (pure, no I/O), ``(action, condition)`` pairs in the hot
path's order (:mod:`gateway.haproxy.config` lists it): the request's own checks (a model
named, a well-formed deadline, no shape beyond any request) and its deadline, who calls
(predict auth: the key's digest in map ``tokens``; the tenant), the pool (a weighted
split over maps ``route<k>`` / ``cut<k>``; none -> 404) and its readiness, then the
admission rules (:mod:`gateway.haproxy.admission_rules`); after them a rollout's shadow
step and its pinned version, and model residency (map ``resident``).
"""

from __future__ import annotations

from collections.abc import Callable

from gateway import errors
from gateway.haproxy import queueing
from gateway.haproxy.admission_rules import (
    Rule,
    bound_rules,
    deadline_rules,
    rate_rules,
    tenancy_rules,
)
from gateway.haproxy.maps import MISS, split
from gateway.haproxy.snapshot import Snapshot
from gateway.policy import access, deadline, model_name, readiness, shape, tenancy
from gateway.policy.rollout import SHADOW_HEADER


def request_rules(answer: Callable[..., str], http: bool) -> list[Rule]:
    """The policy's ``request`` check: a model named, a well-formed deadline, no shape
    beyond any request (HTTP)."""
    rules: list[Rule] = [
        ("set-var(txn.out) str(invalid)", "!named"),
        (answer(errors.InvalidInput, model_name.NO_MODEL), "!named"),
    ]
    if not http:
        # json(utf8) yields nothing for bytes that are not UTF-8
        rules += [
            ("set-var(req.mu) var(txn.model),json(utf8)", ""),
            ("set-var(txn.out) str(invalid)", "!{ var(req.mu) -m found }"),
            (answer(errors.InvalidInput, model_name.NOT_UTF8), "!{ var(req.mu) -m found }"),
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


def model_rules(snapshot: Snapshot, answer: Callable[..., str], http: bool) -> list[Rule]:
    """The policy's checks after the request's own: auth, rate, route, readiness,
    admission (``gateway.policy.ORDER``)."""
    # the model's name as the client wrote it, inside a JSON string (HTTP) or a
    # grpc-message, which gRPC clients percent-decode: url_enc keeps a '%' in it (and
    # what is not ASCII) from being decoded into something else ('50%41' into '50A')
    model_lf = "%[var(txn.model),json(utf8s)]" if http else "%[var(txn.model),url_enc]"
    classes = snapshot.rate_classes()
    if not classes and not snapshot.predict_gated and snapshot.tenancy is None:
        return _pool_rules(snapshot, answer, model_lf)  # no one asks who calls
    rules: list[Rule] = [
        # who is calling: X-API-Key, else Authorization: Bearer (one precedence)
        ("set-var(req.key) req.fhdr(x-api-key)", "x_api_key"),
        ("set-var(req.key) req.fhdr(authorization),bytes(7)", "!has_key bearer"),
    ]
    if snapshot.predict_gated:
        lacks = access.LACKS_SCOPE.format(name="%[var(req.scopes),field(2,;)]",
                                          scope="predict")
        rules += [
            ("set-var(txn.out) str(auth)", "!has_key"),
            (answer(errors.Unauthorized, access.MISSING_TOKEN), "!has_key"),
            (f"set-var(req.kd) var(req.key),{access.HAPROXY_DIGEST}", ""),
            ("set-var(req.scopes) var(req.kd),map(MAPS/tokens.map)", ""),
            ("set-var(txn.out) str(auth)", "!has_scopes"),
            (answer(errors.Unauthorized, access.UNKNOWN_TOKEN), "!has_scopes"),
            ("set-var(txn.out) str(auth)", "!may_predict"),
            (answer(errors.Forbidden, lacks), "!may_predict"),
        ]
    rules += [
        (f"set-var(req.key) str({access.ANONYMOUS})", "!has_key"),
        (f"set-var(req.kd) var(req.key),{access.HAPROXY_DIGEST}", ""),
    ]
    if snapshot.tenancy is not None:
        rules += [
            (f"set-var(txn.tn) var(req.kd),map(MAPS/tenants.map,{tenancy.DEFAULT_TENANT})", ""),
            # no class: tenancy turned off (TenancyState.enabled), the rules admit
            ("set-var(txn.tc) var(txn.tn),map(MAPS/tclass.map)", ""),
        ]
    if classes or snapshot.tenancy is not None:
        rules += rate_rules(snapshot, answer)
    return [*rules, *_pool_rules(snapshot, answer, model_lf)]



def _pool_rules(snapshot: Snapshot, answer: Callable[..., str], model_lf: str) -> list[Rule]:
    """The pool (weighted split; none: unknown), readiness, then with tenants the
    tenancy rule (:func:`.admission_rules.tenancy_rules`), then the model's bound
    (:func:`.admission_rules.bound_rules`)."""
    default_limit = snapshot.default_route.max_in_system if snapshot.default_route else 1
    not_ready = readiness.not_ready_message(model_lf, "%[var(req.nr)]")
    route_key = ("var(txn.model),concat(/,txn.pool,)" if snapshot.tenancy is None
                 else "var(txn.model),concat(/,txn.pool,/),concat(,txn.tn,)")
    rules = _split_rules(snapshot)
    rules += [
        ("set-var(txn.out) str(unknown)", "!has_pool"),
        (answer(errors.ModelNotFound, model_name.UNKNOWN_MODEL.format(model=model_lf)),
         "!has_pool"),
        # a model still loading or warming up
        ("set-var(req.nr) var(txn.model),map(MAPS/notready.map)", ""),
        ("set-var(txn.out) str(not_ready)", "nr"),
        (answer(errors.ModelNotReady, not_ready, retry_after=readiness.RETRY_AFTER_S), "nr"),
        (f"set-var(req.mp) {route_key}", ""),
    ]
    if snapshot.tenancy is not None:  # what they refuse never counts in st_route
        rules += tenancy_rules(snapshot, answer)
    rules.append(("track-sc1 var(req.mp) table st_route", ""))
    return [*rules, *bound_rules(snapshot, answer, model_lf, default_limit),
            *deadline_rules(snapshot, answer, model_lf), *queueing.priority_rules(snapshot)]



def shadow_rules(http: bool) -> list[Rule]:
    """A rollout's shadow step (map ``shadow``: model -> percent,
    ``gateway.policy.rollout.Shadow``). HAProxy cannot copy a request: an unversioned
    request of the model goes to the control plane when ``rand(100)`` is below the
    percent (``req.shadow``, the frontend's ``use_backend``), marked with
    ``SHADOW_HEADER``; its forwarder answers it from stable (the split is at 0 %) and
    mirrors it to the candidate, and counts it (not logged here). A client's own mark
    is dropped. Before the rollout's rules: the request is still unversioned there."""
    if http:
        unversioned = f"{{ path_reg {model_name.HTTP_UNVERSIONED_INFER_PATTERN} }}"
    else:
        unversioned = (f"!{{ req.body,bytes(5),protobuf({model_name.GRPC_VERSION_FIELD}) "
                       "-m len 1: }")
    under = "{ var(req.sp) -m int gt 0 }"
    sampled = "{ var(req.shadow) -m found }"
    return [
        ("set-var(req.sp) var(txn.model),map_str_int(MAPS/shadow.map,0)", ""),
        (f"del-header {SHADOW_HEADER}", under),
        ("set-var(req.sd) rand(100),sub(req.sp)", under),
        ("set-var(req.shadow) int(1)", f"{under} {{ var(req.sd) -m int lt 0 }} {unversioned}"),
        (f"set-header {SHADOW_HEADER} 1", sampled),
        ("set-log-level silent", sampled),
    ]


def rollout_rules(http: bool) -> list[Rule]:
    """A model under rollout (maps ``rstable`` / ``rcand`` / ``rollout``,
    ``gateway.policy.rollout.Split``): an unversioned request is pinned to the candidate
    when ``rand(100)`` is below its percent, else to stable, and ``txn.ver`` (logged)
    says which: the log line tallies it for the verdict, on both protocols.
    HTTP: the path gets the version.
    gRPC: the request goes to its backend's pin twin (:func:`.backends.pin_backends`), whose Lua
    filter (``grpc_fields.lua``) appends ``model_version`` to the message as it streams
    through and raises the length prefix (~18 us of HAProxy CPU a pinned request; none
    for the others). Still sent to the control plane's gRPC server, which pins them (and
    counts them: not logged here): a body whose ``content-length`` is not the one
    message's (5 + its prefix's length). A compressed message never gets here: no rule
    runs on it (:data:`.frontend.COMPRESSED`), the Python forwarder takes it. A message
    that names a version in its first bytes (``protobuf`` of the buffered start, as the
    model name) keeps it.
    """
    under = "{ var(req.rs) -m found }"
    if not http:
        named = "{ var(req.mv) -m len 1: }"
        return [
            ("set-var(req.rs) var(txn.model),map(MAPS/rstable.map)", ""),
            (f"set-var(req.mv) req.body,bytes(5),protobuf({model_name.GRPC_VERSION_FIELD})",
             under),
            ("set-var(req.cl) req.hdr(content-length),sub(txn.glen)",
             f"{under} !{named} {{ req.hdr(content-length) -m found }}"),
            ("set-var(req.detour) int(1)", f"{under} {{ var(req.cl) -m found }} "
             "!{ var(req.cl) -m int eq 5 }"),
            ("set-log-level silent", "{ var(req.detour) -m found }"),
            *_split_pick(f"{under} !{named} !{{ var(req.detour) -m found }}"),
        ]
    unversioned = f"{{ path_reg {model_name.HTTP_UNVERSIONED_INFER_PATTERN} }}"
    return [
        ("set-var(req.rs) var(txn.model),map(MAPS/rstable.map)", unversioned),
        *_split_pick(under),
        ("set-path %[path,regsub(/infer,/versions/)]%[var(txn.ver)]/infer", under),
    ]


def _split_pick(cond: str) -> list[Rule]:
    """``txn.ver``: ``Split.pick`` of one ``rand(100)`` for a request pinned here."""
    return [
        ("set-var(req.rp) var(txn.model),map_str_int(MAPS/rollout.map,0)", cond),
        ("set-var(req.rd) rand(100),sub(req.rp)", cond),
        ("set-var(txn.ver) var(req.rs)", cond),
        ("set-var(txn.ver) var(txn.model),map(MAPS/rcand.map)",
         f"{cond} {{ var(req.rd) -m int lt 0 }}"),
    ]


def residency_rules(snapshot: Snapshot) -> list[Rule]:
    """Model residency, the last rule: a managed model's ``pool/model`` in map
    ``resident`` gives its backend in that pool (``req.rb``, servers ready only on its
    holders) or ``miss``: the request goes to the control plane, which holds it while
    the model loads and counts it (so HAProxy logs no line for it). ``txn.pool`` keeps
    the pool's name: the log line, the tables and the rules above name pools."""
    if not snapshot.residents():
        return []
    return [("set-var(req.rb) var(txn.pool),concat(/,txn.model,),map(MAPS/resident.map)", ""),
            ("set-log-level silent", f"{{ var(req.rb) -m str {MISS} }}")]



def _split_rules(snapshot: Snapshot) -> list[Rule]:
    ranks = snapshot.split_ranks()
    default_pools, default_cuts = (split(snapshot.default_route, ranks)
                                   if snapshot.default_route else ([""] * ranks, [1000] * ranks))
    first = f",{default_pools[0]}" if default_pools[0] else ""
    rules: list[Rule] = [(f"set-var(txn.pool) var(txn.model),map(MAPS/route0.map{first})", "")]
    if ranks > 1:
        rules.append(("set-var(req.r) rand(1000)", ""))
    for k in range(1, ranks):
        pool_default = f",{default_pools[k]}" if default_pools[k] else ""
        rules += [
            (f"set-var(req.c) var(txn.model),map_str_int(MAPS/cut{k}.map,{default_cuts[k]})", ""),
            ("set-var(req.d) var(req.r),sub(req.c)", ""),
            (f"set-var(txn.pool) var(txn.model),map(MAPS/route{k}.map{pool_default})",
             "{ var(req.d) -m int ge 0 }"),
        ]
    return rules

