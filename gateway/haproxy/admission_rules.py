"""The frontend's admission rules (pure, no I/O), ``(action, condition)`` pairs: rate
limits per API key (a stick table per limit class, keyed by the key's digest; a tenant
with limits of its own counted as one key), with tenants the tenancy rule
(``gateway.policy.tenancy.decide``: the tenant's in-flight limit, the class ceiling on
the pool's load, the tenant's fair share; 429 / RESOURCE_EXHAUSTED after the tenancy's
refusal delay, HAProxy's tarpit in a backend of :func:`refusal_backends`), the model's
bound (stick table ``st_model`` against map ``limits``; beyond -> 429 /
RESOURCE_EXHAUSTED at once) and the deadline the pool cannot meet (504 /
DEADLINE_EXCEEDED). :mod:`gateway.haproxy.request_rules` places them in the hot path's
order.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway import errors
from gateway.config.tenancy import MAX_REFUSAL_DELAY_MS
from gateway.haproxy import queueing
from gateway.haproxy.backends import PIN
from gateway.haproxy.maps import NO_RATE
from gateway.haproxy.snapshot import Snapshot, TenancyState
from gateway.policy import admission, deadline, tenancy

Rule = tuple[str, str]  # (action, condition): an http-request rule of a frontend
# a tenancy refusal waiting its delay: the milliseconds it waits (req.rw), in the backend
# REFUSAL_BACKEND.format(proto=..., ms=...) whose tarpit waits them
REFUSAL_WAIT = "rw"
REFUSAL_BACKEND = "refuse_{proto}_{ms}"


def rate_rules(snapshot: Snapshot, answer: Callable[..., str]) -> list[Rule]:
    """Rate limits: per API key digest in the table of its class; a tenant with limits of
    its own is counted as one key, ``t:<tenant>`` (its in-flight count is the same
    entry's ``conn_cur``: table ``tenant_flight`` when it has no rate)."""
    classes = snapshot.rate_classes()
    default = str(classes.index(snapshot.rate_default)) if snapshot.rate_default else "none"
    rules: list[Rule] = [
        (f"set-var(req.rc) var(req.kd),map(MAPS/ratekeys.map,{default})", ""),
    ]
    key, own = "var(req.kd)", "{ var(req.tl) -m found }"
    if snapshot.tenancy is not None:
        key = "var(req.rk)"
        rules += [
            ("set-var(req.rk) var(req.kd)", ""),
            ("set-var(req.tl) var(txn.tn),map(MAPS/tlimit.map)", ""),
            ("set-var(req.rk) str(t:),concat(,txn.tn,)", own),
            ("set-var(req.rc) var(req.tl)", own),
            (f"track-sc2 {key} table tenant_flight", f"{{ var(req.rc) -m str {NO_RATE} }}"),
        ]
    for i, limit in enumerate(classes):
        cls = f"{{ var(req.rc) -m str {i} }}"
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



def bound_rules(snapshot: Snapshot, answer: Callable[..., str], model_lf: str,
                 default_limit: int) -> list[Rule]:
    """The model's bound (:mod:`gateway.policy.admission`), tracked only now, after the
    tenancy rules: a request they refused never holds a place in the model's count. With
    tenants it is per class (``Tenancy.model_bound``): ``st_model`` counts
    ``model/class``, the bound is scaled by map ``cbound`` (class -> permille; a pool
    whose rules differ, ``pool/class`` -> permille, ``req.ck``), and a
    request counts the requests of its class and of the classes above it
    (``tenancy.AT_LEAST``, read with ``table_conn_cur``)."""
    overloaded = admission.OVERLOADED.format(model=model_lf, count="%[var(req.mc)]",
                                             limit="%[var(req.lim)]")
    rules: list[Rule] = [("set-var(req.mk) var(txn.model)", "")]
    if snapshot.tenancy is not None:
        rules.append(("set-var(req.mk) var(txn.model),concat(/,txn.tc,)", "has_class"))
    rules += [
        ("track-sc0 var(req.mk) table st_model", ""),
        ("set-var(req.mc) sc0_conn_cur", ""),
        (f"set-var(req.lim) var(txn.model),map_str_int(MAPS/limits.map,{default_limit})", ""),
    ]
    if snapshot.tenancy is not None:
        for above in tenancy.Priority:
            below = [k.value for k in tenancy.Priority
                     if above in tenancy.AT_LEAST[k] and above is not k]
            if not below:
                continue
            cond = f"{{ var(txn.tc) -m str {' '.join(below)} }}"
            rules += [
                (f"set-var(req.k{above.value[0]}) var(txn.model),concat(/{above.value}),"
                 "table_conn_cur(st_model)", cond),
                (f"set-var(req.mc) var(req.mc),add(req.k{above.value[0]})",
                 f"{cond} {{ var(req.k{above.value[0]}) -m found }}"),
            ]
        rules += [
            ("set-var(req.pm) var(txn.tc),map_str_int(MAPS/cbound.map,1000)", "has_class"),
            # a pool with rules of its own (it queues in the gateway): its entry, if any
            ("set-var(req.pm) var(req.ck),map_str_int(MAPS/cbound.map)", "has_class"),
            ("set-var(req.lim) var(req.lim),mul(req.pm),div(1000)", "has_class"),
            ("set-var(req.lim) int(1)", "{ var(req.lim) -m int lt 1 }"),
        ]
    rules += [
        ("set-var(req.over) var(req.mc),sub(req.lim)", ""),
        ("set-var(txn.out) str(rejected)", "over_limit"),
        ("set-var(txn.why) str(overloaded)", "over_limit"),
        (answer(errors.Overloaded, overloaded, retry_after=admission.RETRY_AFTER_S),
         "over_limit"),
    ]
    return rules


def tenancy_rules(snapshot: Snapshot, answer: Callable[..., str]) -> list[Rule]:
    """``gateway.policy.tenancy.decide``: the tenant's in-flight limit (``sc2``, its own
    entry), the class ceiling on the pool's load (``be_conn`` of the pool's backends plus
    the requests queued elsewhere), the tenant's share once the pool is saturated (its
    requests for this model in this pool in ``st_route``, which only what these rules
    admit tracks: :func:`.request_rules._pool_rules`).

    A refusal is answered after its wait (:func:`gateway.policy.tenancy.refusal_delay_ms`:
    the tenancy's ``refusal_delay_ms``, longer for a tenant with many refusals waiting)
    when the request's deadline (``txn.dl``) leaves room for it, else at once
    (:func:`_refuse`). Every refusal waiting tracks ``st_delay``
    under its tenant's key (``t:<tenant>``, ``req.dk``). A request waiting there still
    holds what it tracked before (``sc2``: a limited tenant's own entry, the same key), so
    the limit counts ``sc2`` less its refusals waiting. It tracks ``st_seen``
    (model/pool/tenant) instead of ``st_route``: the arrival makes the tenant active
    (``gateway.telemetry.read_haproxy``) without counting in flight."""
    delayed = snapshot.refusals_delayed()
    limited = "{ var(txn.tm) -m int gt 0 }"
    rules: list[Rule] = [
        ("set-var(txn.tm) var(txn.tn),map_str_int(MAPS/tmax.map,0)", ""),
        ("set-var(txn.tf) sc2_conn_cur", ""),
    ]
    if delayed is not None:
        delay = delayed.refusal_delay_ms
        dl = "{ var(txn.dl) -m found }"
        rules += [
            ("set-var(req.dk) str(t:),concat(,txn.tn,)", ""),
            # the limited tenant's refusals waiting their delay are not in flight
            ("set-var(req.tw) var(req.dk),table_conn_cur(st_delay)", limited),
            ("set-var(txn.tf) var(txn.tf),sub(req.tw)", limited),
            # tenancy.refusal_delay_ms: delayed unless delay x 10 beyond deadline x 9
            ("set-var(req.tp) int(0)", f"!{dl}"),
            (f"set-var(req.tp) var(txn.dl),mul({deadline.SHARE_NUM}),"
             f"sub({delay * deadline.SHARE_DEN})", dl),
        ]
    rules.append(("set-var(req.to) var(txn.tf),sub(txn.tm)", ""))
    rules.append(_decide("tenant_limit", f"{limited} {{ var(req.to) -m int gt 0 }}"))
    rules += _load_rules(snapshot, "")
    rules += [
        ("set-var(req.ck) var(txn.pool),concat(/,txn.tc,)", ""),
        ("set-var(txn.ceil) var(req.ck),map_str_int(MAPS/ceiling.map,1)", ""),
        ("set-var(req.sat) var(txn.pl),sub(txn.ceil)", ""),
        _decide("saturated", "has_class { var(req.sat) -m int ge 0 }"),
        ("set-var(req.co) var(txn.pl),sub(txn.cap)", ""),
        ("set-var(req.sk) var(txn.pool),concat(/,txn.tn,)", ""),
        ("set-var(txn.sh) var(req.sk),map_str_int(MAPS/share.map,1)", ""),
        # the tenant's admitted requests here, this one not tracked yet
        ("set-var(req.fo) var(req.mp),table_conn_cur(st_route),sub(txn.sh)", ""),
        _decide("fair_share", "has_class { var(req.co) -m int ge 0 } { var(req.fo) -m int ge 0 }"),
    ]
    return rules + _refuse(delayed, refusal_answers(answer))


def _decide(reason: str, cond: str) -> Rule:
    """The tenancy refusal ``reason`` under ``cond``, unless an earlier one was decided
    (the first decided is the answer, as in ``tenancy.decide``): only the reason is set
    here, and :func:`_refuse` answers it. An admitted request so meets one rule per
    reason, not the dozen of its answer and its wait (each rule's first term read a
    variable, and HAProxy 2.6 reads one by walking its scope's list:
    docs/haproxy.md)."""
    return (f"set-var(txn.why) str({reason})", f"{cond} !{{ var(txn.why) -m found }}")


def refusal_answers(answer: Callable[..., str]) -> dict[str, str]:
    """Each tenancy refusal's answer (``http-request return``), by reason, its message
    filled from the request's variables."""
    lf = {"pool": "%[var(txn.pool)]", "load": "%[var(txn.pl)]", "capacity": "%[var(txn.cap)]",
          "tenant": "%[var(txn.tn)]"}
    messages = {
        "tenant_limit": tenancy.TENANT_LIMIT.format(
            tenant="%[var(txn.tn)]", count="%[var(txn.tf)]", limit="%[var(txn.tm)]"),
        "saturated": tenancy.SATURATED.format(
            **lf, priority="%[var(txn.tc)]", ceiling="%[var(txn.ceil)]"),
        "fair_share": tenancy.FAIR_SHARE.format(**lf, share="%[var(txn.sh)]"),
    }
    assert set(messages) == set(tenancy.REASONS)
    return {reason: answer(errors.Overloaded, message, retry_after=tenancy.RETRY_AFTER_S)
            for reason, message in messages.items()}


def _refuse(delayed: TenancyState | None, answers: dict[str, str]) -> list[Rule]:
    """Refused for the tenancy reason :func:`_decide` set (``txn.why``), with its answer
    (``answers``, by reason): logged as such, the arrival seen (``st_seen``), then, with
    a refusal delay (``delayed``) where the deadline allows, counted among its tenant's
    refusals waiting (``st_delay``) and sent to wait in the backend whose tarpit waits
    :func:`gateway.policy.tenancy.refusal_delay_ms` (``req.rw``: its tenant's refusals
    waiting, this one counted, x 1000 / ``refusals_per_s``, at least the delay and at
    most ``MAX_REFUSAL_DELAY_MS``, beyond the delay rounded up to a step, within 9/10 of
    the deadline rounded down, in the same integers): ``http-request allow`` ends this
    frontend's rules, and the route to that backend (:func:`refusal_backends`) is the
    first the request meets. Else the answer at once.

    A tarpit, in the frontend or in a backend, holds no other stream of an HTTP/2
    connection, whatever the message's size: 16 refusals of 600 KB gRPC messages sleeping
    in Lua on one connection (an earlier way to wait longer than the frontend's tarpit)
    stopped HAProxy 2.6 reading it, and a critical request sent after them was answered
    after the last, at 0.81 s."""
    cond = "{ var(txn.why) -m found }"
    rules = [("set-var(txn.out) str(rejected)", cond),
             ("track-sc1 var(req.mp) table st_seen", cond)]
    if delayed is not None:
        delay, per_s = delayed.refusal_delay_ms, delayed.refusals_per_s
        most, step = MAX_REFUSAL_DELAY_MS, tenancy.REFUSAL_WAIT_STEP_MS
        late = f"{cond} {{ var(req.tp) -m int ge 0 }}"
        wait = f"req.{REFUSAL_WAIT}"

        def when(test: str) -> str:
            return f"{late} {{ var({wait}) -m int {test} }}"

        rules += [
            (f"set-var({wait}) var(req.dk),table_conn_cur(st_delay),add(1),mul(1000),"
             f"div({per_s})", late),
            ("track-sc0 var(req.dk) table st_delay", late),
            (f"set-var({wait}) int({most})", when(f"gt {most}")),
            (f"set-var({wait}) int({delay})", when(f"lt {delay}")),
            (f"set-var({wait}) var({wait}),add({step - 1}),div({step}),mul({step})",
             when(f"gt {delay}")),
            # within 9/10 of the deadline (req.wb; req.tp: 9/10 of it less the delay, x 10)
            (f"set-var(req.wb) var(req.tp),div({deadline.SHARE_DEN}),add({delay})",
             f"{late} {{ var(txn.dl) -m found }}"),
            (f"set-var(req.wy) var(req.wb),sub({wait})", f"{late} {{ var(txn.dl) -m found }}"),
            (f"set-var({wait}) var(req.wb),div({step}),mul({step})",
             f"{late} {{ var(txn.dl) -m found }} {{ var(req.wy) -m int lt 0 }}"),
            (f"set-var({wait}) int({delay})", when(f"lt {delay}")),
            ("allow", late),
        ]
    return rules + [(action, f"{{ var(txn.why) -m str {reason} }}")
                    for reason, action in answers.items()]


def refusal_backends(snapshot: Snapshot, proto: str, answer: Callable[..., str]) -> list[str]:
    """With a refusal delay, one backend per wait a tenancy refusal may wait
    (:func:`gateway.policy.tenancy.refusal_waits_ms`), its ``timeout tarpit`` that wait:
    the refusal (``txn.why``) is answered there by ``http-request tarpit``, which takes
    ``http-request return``'s arguments (status, content-type, ``hdr``, ``lf-string``) on
    HTTP/1.1 and HTTP/2 streams alike. The frontend's ``http-after-response`` rules
    apply to its answers as to the frontend's own."""
    delayed = snapshot.refusals_delayed()
    if delayed is None:
        return []
    head = "http-request return "
    tarpits = []
    for reason, action in refusal_answers(answer).items():
        assert action.startswith(head), action
        tarpits.append(f"  http-request tarpit {action[len(head):]} "
                       f"if {{ var(txn.why) -m str {reason} }}")
    return ["\n".join([f"backend {REFUSAL_BACKEND.format(proto=proto, ms=ms)}",
                       f"  timeout tarpit {ms}ms", *tarpits]) + "\n"
            for ms in tenancy.refusal_waits_ms(delayed.refusal_delay_ms)]


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
        ("set-var(req.eq) var(txn.pool),map_str_int(MAPS/elsewhere.map,0)", cond),
        ("set-var(txn.pl) var(txn.pl),add(req.eq)", cond),
        ("set-var(txn.cap) var(txn.pool),map_str_int(MAPS/capacity.map,1)", cond),
    ]


def deadline_rules(snapshot: Snapshot, answer: Callable[..., str], model_lf: str) -> list[Rule]:
    """``gateway.policy.deadline``: a request whose deadline (``txn.dl``, ms) the pool
    cannot meet, by the model's service time there (map ``service``) and the wait for
    the pool's load beyond its capacity (map ``drain``: microseconds per request), is
    refused at once (504 / DEADLINE_EXCEEDED), in the integers
    :func:`gateway.policy.deadline.expected_ms` uses."""
    dl = "{ var(txn.dl) -m found }"
    rules = [] if snapshot.tenancy is not None else _load_rules(snapshot, dl)
    hopeless = f"{dl} {{ var(req.sv) -m int gt 0 }} {{ var(req.late) -m int gt 0 }}"
    message = deadline.HOPELESS.format(
        deadline="%[var(txn.dl)]", model=model_lf, expected="%[var(req.eta)]",
        pool="%[var(txn.pool)]", load="%[var(txn.pl)]", capacity="%[var(txn.cap)]")
    return rules + [
        ("set-var(req.smp) var(txn.model),concat(/,txn.pool,)", dl),
        ("set-var(req.sv) var(req.smp),map_str_int(MAPS/service.map,0)", dl),
        ("set-var(req.dr) var(req.smp),map_str_int(MAPS/drain.map,0)", dl),
        ("set-var(req.ex) var(txn.pl),add(1),sub(txn.cap)", dl),
        ("set-var(req.ex) int(0)", f"{dl} {{ var(req.ex) -m int lt 0 }}"),
        ("set-var(req.eta) var(req.dr),mul(req.ex),add(req.sv),div(1000)", dl),
        # deadline.hopeless: expected x 10 beyond deadline x 9
        (f"set-var(req.dn) var(txn.dl),mul({deadline.SHARE_NUM})", dl),
        (f"set-var(req.late) var(req.eta),mul({deadline.SHARE_DEN}),sub(req.dn)", dl),
        ("set-var(txn.out) str(shed)", hopeless),
        ("set-var(txn.why) str(deadline)", hopeless),
        (answer(errors.DeadlineExceeded, message), hopeless),
    ]
