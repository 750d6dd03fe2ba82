"""Who waits, and in which order: requests queue in the gateway, not in Triton.

A pool that queues in the gateway (``gateway_queue: true`` in its spec) sends each member
at most ``capacity_per_member`` requests at once (what it works on together: its batch);
the rest wait in the gateway. Triton's own queue stays short, so a request admitted now
is not stuck behind everything admitted before it.

**The order** (:func:`order_key`), the same on both data planes:

1. by class: critical before standard before sheddable (:data:`CLASS_RANK`); strict, no
   aging: a permanent flood of a higher class is what the class ceilings and shares
   (:mod:`.tenancy`) are for;
2. within a class, by virtual finish time: the time the request arrived plus an offset
   that grows with what its tenant already has in the gateway for this model and pool
   (its *backlog*, the request itself not counted) over its weight
   (:func:`offset_ms`): ``backlog x FAIR_UNIT_MS / weight``. A tenant with nothing in the
   gateway goes ahead of the queued requests of a tenant with 64 in it that arrived up to
   ``64 x FAIR_UNIT_MS / weight`` ms earlier; two tenants of one weight with equal
   backlogs are served in arrival order, so each gets the same rate; at equal backlogs
   a tenant of weight 2 takes half the offset of one of weight 1 and runs ahead. That
   approximates weighted fair queueing's virtual time, with the backlog standing for
   the tenant's finish tag.

**The lane** (the pool's ``lane_per_member``, with tenants): a request that finds the
pool's slots full, of a tenant with fewer requests in the gateway for this model and
pool than the lane has slots a member (a backlog below them: a light tenant), of the
standard class (:func:`takes_lane`), takes one of the lane's slots when one is free, and
goes to its member at once. Queued, it would be first in line and still wait for one of
the requests at its member to end, then, at the member, for the batch that began
meanwhile; in the lane it joins the batch Triton forms next. Each member's own queue
grows by at most the lane's slots. A full lane sends the request to the queue, in the
order above. Sheddable requests never take it: they wait. Nor do critical ones: they go
before every waiting request of the other classes, and through the lane one would add
to its member's batch instead of taking the slot a lower class's request would have had
(measured: its p99 beside a sheddable flood was never lower with the lane, in four runs;
docs/request-policy.md, "The lane, measured").

**The bound**: a request waits at most the pool's ``max_queue_wait_ms``; then it is
answered 504 / DEADLINE_EXCEEDED, :data:`QUEUE_EXPIRED` (or 503 / UNAVAILABLE,
:data:`NO_MEMBER`, when the pool has no member left to wait for). A request with a
deadline is shed at admission when the wait it can expect does not fit
(:mod:`.deadline`: the load beyond the pool's capacity is exactly the queue). The
Python plane also ends a queued request's wait at its own deadline
(:data:`DEADLINE_PASSED`); HAProxy 2.6 has one ``timeout queue`` per backend, and its
clients end the wait from their side (a gRPC deadline resets the stream, which leaves
the queue).

HAProxy renders this with ``maxconn`` on each server, ``http-request
set-priority-class`` (:data:`CLASS_RANK`) and ``set-priority-offset`` (the backlog from
table ``st_route``'s ``conn_cur``, the tenant's cost from map ``qcost``:
:func:`cost_us`), ``timeout queue`` (``gateway/haproxy/queueing.py``); the Python plane
with one :class:`gateway.python.queueing.PoolQueue` per pool.
"""

from __future__ import annotations

from gateway.config.tenancy import Priority
from gateway.policy.deadline import EXCEEDED

# HAProxy's priority class: lower is served first (-2047..2047)
CLASS_RANK: dict[Priority, int] = {Priority.CRITICAL: 0, Priority.STANDARD: 1,
                                   Priority.SHEDDABLE: 2}
NO_CLASS_RANK = CLASS_RANK[Priority.STANDARD]  # without tenants: everyone alike
FAIR_UNIT_MS = 10  # the virtual time one request in the gateway costs a tenant of weight 1
# HAProxy keeps queue time + offset in 19 bits of milliseconds (524,287): the offset and
# the longest wait (MAX_WAIT_MS) together stay below it
MAX_OFFSET_MS = 240_000
MAX_WAIT_MS = 240_000  # PoolSpec.max_queue_wait_ms's upper bound (gateway/config/pools.py)

QUEUE_EXPIRED = EXCEEDED + ": no member was free in time"
NO_MEMBER = "no healthy Triton member could take the request"
DEADLINE_PASSED = EXCEEDED + ": the request's deadline passed while it waited"
QUEUE_TAIL = " ({waited} ms in the gateway's queue of pool '{pool}', at most {bound} ms)"


def cost_us(weight: float) -> int:
    """Microseconds of virtual time one request in the gateway costs a tenant of
    ``weight`` (HAProxy's map ``qcost``): integers, so both planes round alike."""
    return max(1, round(FAIR_UNIT_MS * 1000 / weight))


def offset_ms(backlog: int, cost: int) -> int:
    """The offset of a request whose tenant has ``backlog`` other requests in the gateway
    for this model and pool, at ``cost`` (:func:`cost_us`): HAProxy's
    ``sc1_conn_cur,sub(1),mul(req.qc),div(1000)``, capped at :data:`MAX_OFFSET_MS`."""
    return min(MAX_OFFSET_MS, max(0, backlog) * cost // 1000)


# the classes whose light tenants take the lane (the module docstring)
LANE_CLASSES: tuple[Priority, ...] = (Priority.STANDARD,)


def takes_lane(priority: Priority | None, backlog: int, lane_slots: int) -> bool:
    """Whether a request of a tenant of class ``priority`` (None: no tenants) with
    ``backlog`` other requests in the gateway for this model and pool may take a free
    slot of the pool's lane (``lane_slots`` a member) once the pool's own slots are full:
    a tenant light enough to fit in the lane whole."""
    return priority in LANE_CLASSES and backlog < lane_slots


def rank(priority: Priority | None) -> int:
    return NO_CLASS_RANK if priority is None else CLASS_RANK[priority]


def order_key(priority: Priority | None, arrived_ms: int, offset: int) -> tuple[int, int]:
    """The queue's order: smaller first (class, then arrival plus offset)."""
    return rank(priority), arrived_ms + offset


def expired_message(pool: str, waited_ms: int, bound_ms: int, members: bool = True,
                    deadline_passed: bool = False) -> str:
    """The answer's text for a request that waited past its bound (``members``: the
    pool still had some to wait for) or past its own deadline (Python plane)."""
    head = DEADLINE_PASSED if deadline_passed else QUEUE_EXPIRED if members else NO_MEMBER
    return head + QUEUE_TAIL.format(waited=waited_ms, pool=pool, bound=bound_ms)


__all__ = ["CLASS_RANK", "FAIR_UNIT_MS", "LANE_CLASSES", "MAX_OFFSET_MS", "MAX_WAIT_MS",
           "cost_us", "expired_message", "offset_ms", "order_key", "rank", "takes_lane"]
