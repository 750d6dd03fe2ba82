"""The client's deadline in HAProxy's rules (pure, no I/O): read from each protocol's
header (``gateway.policy.deadline``), and the grace a gRPC stream to the control plane
gets (:func:`stream_grace_rules`)."""

from __future__ import annotations

from gateway.policy import deadline, model_name

Rule = tuple[str, str]  # (action, condition), as gateway.haproxy.admission_rules'


def deadline_fetch(http: bool) -> list[Rule]:
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


def stream_grace_rules() -> list[str]:
    """A gRPC backend of the control plane (or a replica's own forwarder): a
    ``ModelStreamInfer`` with a deadline gets :data:`deadline.STREAM_GRACE_MS` more of
    it (``grpc-timeout``, said in :data:`deadline.GRACE_HEADER`), so the client's own
    timer ends it at its deadline, not the control plane (whose end HAProxy 2.6 turns
    into RST_STREAM(CANCEL): :data:`gateway.policy.deadline.STREAM_GRACE_MS`). A
    client's own grace header is dropped."""
    stream = (f"{{ path {model_name.GRPC_STREAM_PATH} }} {{ var(txn.dl) -m found }} "
              f"{{ var(txn.dl) -m int le {deadline.GRACE_MAX_DEADLINE_MS} }}")
    lines = [f"  http-request del-header {deadline.GRACE_HEADER}"]
    lines += [f"  http-request {action} if {{ path {model_name.GRPC_STREAM_PATH} }} {cond}"
              for action, cond in deadline_fetch(False)]
    return lines + [
        f"  http-request set-header grpc-timeout "
        f"%[var(txn.dl),add({deadline.STREAM_GRACE_MS})]m if {stream}",
        f"  http-request set-header {deadline.GRACE_HEADER} {deadline.STREAM_GRACE_MS} "
        f"if {stream}",
    ]
