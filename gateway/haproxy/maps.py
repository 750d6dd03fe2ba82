"""Snapshot -> the contents of HAProxy's map files (pure, no I/O).

The frontend's rules (:mod:`gateway.haproxy.config`) look a request up in these; the
control plane changes them live through the admin socket (:mod:`gateway.haproxy.changes`):
- ``route<k>`` / ``cut<k>``: model -> the pool of split rank ``k`` and the permille at
  which that rank takes over (:func:`split`);
- ``limits``: model -> requests it may have in the gateway at once (admission);
- ``capacity`` (pool -> capacity), ``elsewhere`` (pool -> requests queued in its members
  that are not the gateway's): a pool's load against its capacity (tenancy, deadlines);
- ``service`` / ``drain``: ``model/pool`` -> the model's service time there, and the
  microseconds per request the pool works off beyond its capacity
  (``gateway/policy/deadline.py``);
- ``notready``: model -> why it cannot take requests yet (503 + Retry-After);
- during a rollout (``gateway/policy/rollout.py``): ``rstable`` / ``rcand`` (model -> its
  stable / candidate version) and ``rollout`` (model -> the candidate's percent);
- during a rollout's shadow step: ``shadow`` (model -> the percent of its unversioned
  requests sent to the control plane, whose forwarder mirrors them to the candidate);
- ``tokens``: a token's digest -> its scopes (predict auth);
- ``ratekeys``: an API key's digest -> its rate class (the index of its stick table);
- with tenants (``gateway/policy/tenancy.py``): ``tenants`` (key digest -> tenant),
  ``tclass`` (tenant -> priority class), ``tlimit`` (a tenant with limits of its own ->
  its rate class, or ``n`` for an in-flight limit only), ``tmax`` (tenant -> its
  in-flight limit), ``ceiling`` (``pool/class`` -> the
  load from which that class is refused), ``share`` (``pool/tenant`` -> its share
  beside the tenants active there now), ``cbound`` (class -> the model's bound for it,
  in thousandths of the critical one; ``pool/class`` where a pool's rules differ),
  ``qcost`` (tenant -> microseconds of virtual time per request it has in the gateway:
  the queue's fairness, ``gateway/policy/queueing.py``);
- ``tprio``: ``model/class`` -> the Triton priority level a request of that class gets
  at a model with levels (``gateway/policy/triton_priority.py``,
  :mod:`gateway.haproxy.priority_rules`);
- ``queued``: the head of the answer to a request that waited in a pool's queue until
  its bound (``1``) or lost the pool's last member there (``0``);
- with model residency (``RouteState.holders``): ``resident`` (``pool/model`` -> the
  model's backend there, ``{pool}.r{h}``, while it has holders, else ``miss``: the
  control plane holds the request while the model loads). Only managed models have an
  entry, and the map exists only when some model is managed.
"""

from __future__ import annotations

from gateway.config.tenancy import Priority
from gateway.haproxy.snapshot import Resident, RouteState, Snapshot, TenancyState
from gateway.policy import queueing, triton_priority
from gateway.policy.rate import RateClass


def route_maps(snapshot: Snapshot) -> dict[str, dict[str, str]]:
    ranks = snapshot.split_ranks()
    maps: dict[str, dict[str, str]] = {f"route{k}": {} for k in range(ranks)}
    maps.update({f"cut{k}": {} for k in range(1, ranks)})
    maps["limits"], maps["notready"], maps["service"], maps["drain"] = {}, {}, {}, {}
    maps["capacity"] = {p.name: str(p.capacity) for p in snapshot.pools}
    maps["elsewhere"] = {p.name: str(p.elsewhere) for p in snapshot.pools}
    maps["rstable"], maps["rcand"], maps["rollout"] = {}, {}, {}
    maps["shadow"] = {}
    maps["queued"] = queued_map()
    maps["tprio"] = {f"{model}/{p.value}": str(level)
                     for model, levels in snapshot.levels for p in Priority
                     if (level := triton_priority.level(p, levels)) is not None}
    for route in snapshot.routes:
        pools, cuts = split(route, ranks)
        for k in range(ranks):
            maps[f"route{k}"][route.model] = pools[k]
            if k:
                maps[f"cut{k}"][route.model] = str(cuts[k])
        maps["limits"][route.model] = str(route.max_in_system)
        for pool, us, drain_us in route.service:
            maps["service"][f"{route.model}/{pool}"] = str(us)
            maps["drain"][f"{route.model}/{pool}"] = str(drain_us)
        if route.not_ready:
            maps["notready"][route.model] = _one_line(route.not_ready)
        if route.shadow is not None:
            maps["shadow"][route.model] = str(route.shadow)
        if route.split is not None:
            stable, candidate, percent = route.split
            maps["rstable"][route.model] = str(stable)
            maps["rcand"][route.model] = str(candidate)
            maps["rollout"][route.model] = str(percent)
    maps["tokens"] = {digest: scopes for digest, scopes in snapshot.tokens}
    classes = snapshot.rate_classes()
    maps["ratekeys"] = {digest: str(classes.index(c)) for digest, c in snapshot.rate_keys}
    if snapshot.tenancy is not None:
        maps.update(tenancy_maps(snapshot.tenancy, classes))
    residents = snapshot.residents()
    if residents:
        maps["resident"] = {f"{r.pool}/{r.model}": resident_value(r) for r in residents}
    return maps


MISS = "miss"  # resident: no member holds the model in that pool now


def resident_value(resident: Resident) -> str:
    return resident.backend if resident.holders else MISS


NO_RATE = "n"  # tlimit: a tenant limited in flight only (its own counter, no window)


def tenancy_maps(t: TenancyState, classes: tuple[RateClass, ...]) -> dict[str, dict[str, str]]:
    if not t.enabled:  # the rules stay and find nothing: everyone admitted, no tenant
        return {name: {} for name in ("tenants", "tclass", "tlimit", "tmax", "ceiling",
                                      "share", "cbound", "qcost")}
    return {
        "tenants": dict(t.keys),
        "tclass": {x.name: x.priority for x in t.tenants},
        "tlimit": {x.name: str(classes.index(x.rate)) if x.rate is not None else NO_RATE
                   for x in t.tenants if x.rate is not None or x.max_in_flight is not None},
        "tmax": {x.name: str(x.max_in_flight) for x in t.tenants
                 if x.max_in_flight is not None},
        "ceiling": {f"{p}/{k}": str(c) for p, k, c in t.ceilings},
        "share": {f"{p}/{n}": str(c) for p, n, c in t.shares},
        "cbound": {**{k: str(c) for k, c in t.bounds},
                   **{f"{p}/{k}": str(c) for p, k, c in t.pool_bounds}},
        "qcost": {x.name: str(queueing.cost_us(x.weight)) for x in t.tenants},
    }


def queued_map() -> dict[str, str]:
    """``queued``: the head of the answer to a request that waited in a pool's queue
    until its bound, by whether the pool still has a member up (``nbsrv,bool``)."""
    return {"0": queueing.NO_MEMBER, "1": queueing.QUEUE_EXPIRED}


def split(route: RouteState, ranks: int) -> tuple[list[str], list[int]]:
    """Pool per rank and the cumulative permille at which each rank takes over: rank k
    serves a request when ``rand(1000) >= cut[k]`` and no higher rank does."""
    pools = [p for p, _ in route.pools][:ranks]
    weights = [w for _, w in route.pools][:ranks]
    total = sum(weights) or 1.0
    cuts, acc = [0], 0.0
    for w in weights[:-1]:
        acc += w
        cuts.append(round(1000 * acc / total))
    while len(pools) < ranks:
        pools.append(pools[0] if pools else "")
        cuts.append(1000)
    return pools, cuts


def _one_line(text: str) -> str:
    return " ".join(text.split()) or "-"
