"""``gateway/policy/queueing.py`` rendered for HAProxy (pure, no I/O).

A pool that queues in the gateway (``PoolState.member_slots`` above 0):
- every server of its backends gets ``maxconn`` (:func:`server_cap`): the member's
  slots; a request that finds none free waits in the backend's queue;
- the backend's ``timeout queue`` is the pool's bound, and a request that reaches it is
  answered as the Python plane answers it (:func:`backend_lines`): 504 /
  DEADLINE_EXCEEDED, ``Deadline Exceeded: no member was free in time (N ms in the
  gateway's queue of pool 'p', at most B ms)``, or 503 / UNAVAILABLE when the pool has
  no member up any more (``nbsrv``: map ``queued`` gives the head);
- with tenants, the frontend sets the request's place (:func:`priority_rules`):
  ``set-priority-class`` from its class, ``set-priority-offset`` from its tenant's
  backlog for this model and pool (``sc1_conn_cur`` of ``st_route``, the request itself
  not counted) times the tenant's cost (map ``qcost``), in whole milliseconds.

``maxconn`` is per server of a backend: a member in a pool's HTTP backend and in its
gRPC backend (or a managed model's HTTP backend) has that many slots in each. Traffic of
one protocol per pool, the usual case, sees the member's slots exactly.

**Large gRPC messages are not queued** (:func:`bypass_rules`): a stream waiting in a
queue stops reading its message, and once its buffer is full HAProxy 2.6's HTTP/2
demultiplexer stops reading the whole client connection, so every other request on
that connection, those already at a member included, waits for it: a deadlock until the
queue's bound. A gRPC message longer than half a buffer (``tune.bufsize``) goes to the
pool's twin backend ``grpc_<pool>.nq``, the same servers (tracking the pool's) without
``maxconn``: to Triton at once, as without the gateway's queue. For the same reason a
managed model's gRPC backend and the gRPC pin twins (rollouts) are not capped. HTTP/1.1
carries one request per connection: nothing to stall.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway import errors
from gateway.config.tenancy import Priority
from gateway.haproxy.snapshot import MemberState, PoolState, Snapshot
from gateway.netaddr import join_host_port
from gateway.policy import queueing

Rule = tuple[str, str]  # (action, condition), as gateway.haproxy.admission_rules'
BYPASS = ".nq"  # a queueing pool's gRPC twin for messages too large to wait
LANE = ".lane"  # a queueing pool's twin for a light tenant's request (its lane's slots)
DEFAULT_BUFSIZE = 16384  # HAProxy's tune.bufsize when the layout does not set one


def server_cap(pool: PoolState) -> str:
    """What a server line of the pool's backends adds: its slots."""
    return f" maxconn {pool.member_slots}" if pool.member_slots > 0 else ""


def queued_pools(snapshot: Snapshot) -> list[str]:
    return [p.name for p in snapshot.pools if p.member_slots > 0]


def bypass_limit(bufsize: int) -> int:
    """The longest gRPC message that waits in a queue: half a buffer."""
    return bufsize // 2


def bypass_rules(snapshot: Snapshot, http: bool, bufsize: int) -> list[Rule]:
    """gRPC: ``req.nq`` for a message too large to wait (the module docstring), in a
    pool that queues; the frontend sends it to the pool's ``.nq`` twin."""
    pools = queued_pools(snapshot)
    if http or not pools:
        return []
    return [("set-var(req.nq) int(1)",
             f"{{ var(txn.glen) -m int gt {bypass_limit(bufsize)} }} "
             f"{{ var(txn.pool) -m str {' '.join(pools)} }}")]


def bypass_backend_rule(snapshot: Snapshot, http: bool) -> list[str]:
    """The frontend's ``use_backend`` for :func:`bypass_rules`' requests."""
    if http or not queued_pools(snapshot):
        return []
    return [f"  use_backend grpc_%[var(txn.pool)]{BYPASS} if {{ var(req.nq) -m found }}"]


def lane_backend_rules(snapshot: Snapshot, http: bool) -> list[str]:
    """The frontend's ``use_backend`` for a request that may take the lane
    (``queueing.takes_lane``: ``req.ql``, its tenant's requests here with itself, from
    :func:`priority_rules`, at most the lane's slots): to the pool's lane twin while the
    pool's own slots are full and the lane has one free (``be_conn_free`` counts the
    usable servers' free slots). Two such requests at once may both see the lane's last
    slot: the second waits in the lane's queue for it, bounded as the pool's."""
    if snapshot.tenancy is None:
        return []
    rules = []
    for pool in snapshot.pools:
        if pool.member_slots > 0 and pool.lane_slots > 0:
            own = f"{'http' if http else 'grpc'}_{pool.name}"
            rules.append(f"  use_backend {own}{LANE} if "
                         f"{{ var(req.ql) -m int le {pool.lane_slots} }} "
                         f"{{ var(txn.pool) -m str {pool.name} }} "
                         f"{{ be_conn_free({own}) eq 0 }} {{ be_conn_free({own}{LANE}) gt 0 }}")
    return rules


def twins(pool: PoolState, proto: str) -> list[tuple[str, int]]:
    """A queueing pool's backends beside its own for ``proto``, the same members: (name,
    each server's ``maxconn``, 0 for none): the ``.nq`` twin for large gRPC messages
    (:func:`bypass_rules`) and the lane (:func:`lane_backend_rules`)."""
    if pool.member_slots <= 0:
        return []
    out = [(f"grpc_{pool.name}{BYPASS}", 0)] if proto == "grpc" else []
    if pool.lane_slots > 0:
        out.append((f"{proto}_{pool.name}{LANE}", pool.lane_slots))
    return out


def twin_backends(snapshot: Snapshot, head: Callable[[str, str], list[str]],
                  server: Callable[[MemberState, str], str]) -> list[str]:
    """The :func:`twins`: ``head(name, proto)`` gives a backend's settings before its
    servers, ``server(member, proto)`` a member's protocol options. Their servers track
    the pool's (health, maintenance); a capped twin's queue is bounded and answered as
    the pool's (:func:`backend_lines`)."""
    out = []
    for pool in snapshot.pools:
        for proto in ("http", "grpc"):
            for name, cap in twins(pool, proto):
                lines = head(name, proto) + (backend_lines(pool, proto) if cap else [])
                lines += [f"  server {m.name} {join_host_port(m.host, _port(m, proto))} "
                          f"track {proto}_{pool.name}/{m.name} weight {m.weight}"
                          f"{f' maxconn {cap}' if cap else ''}{server(m, proto)}"
                          for m in pool.members]
                out.append("\n".join(lines) + "\n")
    return out


def _port(member: MemberState, proto: str) -> int:
    return member.http_port if proto == "http" else member.grpc_port


def load_backends(pool: PoolState) -> list[str]:
    """Backends beyond the pool's own whose requests are its load."""
    return [name for proto in ("http", "grpc") for name, _ in twins(pool, proto)]


def priority_rules(snapshot: Snapshot) -> list[Rule]:
    """The request's place in a queue: its class, then its virtual time
    (``queueing.order_key``). Without tenants: none, the queue is first come first
    served."""
    if snapshot.tenancy is None or not any(p.member_slots for p in snapshot.pools):
        return []
    rules: list[Rule] = [
        (f"set-priority-class int({queueing.CLASS_RANK[k]})",
         f"has_class {{ var(txn.tc) -m str {k.value} }}") for k in Priority]
    default_cost = queueing.cost_us(1.0)
    rules += [
        (f"set-var(req.qc) var(txn.tn),map_str_int(MAPS/qcost.map,{default_cost})",
         "has_class"),
        ("set-var(req.qo) sc1_conn_cur,sub(1),mul(req.qc),div(1000)", "has_class"),
        ("set-var(req.qo) int(0)", "has_class { var(req.qo) -m int lt 0 }"),
        (f"set-var(req.qo) int({queueing.MAX_OFFSET_MS})",
         f"has_class {{ var(req.qo) -m int gt {queueing.MAX_OFFSET_MS} }}"),
        ("set-priority-offset var(req.qo)", "has_class"),
    ]
    if any(p.member_slots > 0 and p.lane_slots > 0 for p in snapshot.pools):
        # queueing.takes_lane's classes; its backlog, the request counted, for the lane's rule
        classes = " ".join(k.value for k in queueing.LANE_CLASSES)
        rules.append(("set-var(req.ql) sc1_conn_cur",
                      f"has_class {{ var(txn.tc) -m str {classes} }}"))
    return rules


def backend_lines(pool: PoolState, proto: str) -> list[str]:
    """A queueing pool's backend: its bound, and the answer to a request that reached
    it (HAProxy answers 503 for a queue's timeout, as for no server: a 503 of its own,
    ``!srv_id``, while the backend still has a server up is the queue's)."""
    if pool.member_slots <= 0:
        return []
    tail = queueing.QUEUE_TAIL.format(waited="%Tw", pool=pool.name, bound=pool.max_wait_ms)
    head = "%[nbsrv,bool,map_int(MAPS/queued.map)]"
    ours = "!{ srv_id -m found }"
    lines = [f"  timeout queue {pool.max_wait_ms}ms"]
    if proto == "http":
        body = '{\\"error\\":\\"' + head + tail + '\\"}'
        late = errors.http_status_of(errors.DeadlineExceeded)
        lines += [
            "  http-error status 503 content-type application/json hdr retry-after 1 "
            f'lf-string "{body}"',
            f"  http-after-response del-header retry-after if {{ status 503 }} {ours} "
            "{ nbsrv gt 0 }",
            f"  http-after-response set-status {late} if {{ status 503 }} {ours} "
            "{ nbsrv gt 0 }",
        ]
        return lines
    unavailable = errors.grpc_code_number(errors.Unavailable)
    late = errors.grpc_code_number(errors.DeadlineExceeded)
    mine = f"{{ res.hdr(grpc-status) -m str {unavailable} }} {ours}"
    lines += [
        f'  http-after-response set-header grpc-message "{head}{tail}" if {mine}',
        f"  http-after-response set-header grpc-status {late} if {mine} {{ nbsrv gt 0 }}",
    ]
    return lines
