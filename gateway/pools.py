"""Pools of Triton servers, live: what the gateway routes over.

A pool is a set of equivalent Triton servers (members) serving the same models. How a
pool is declared is configuration (:mod:`gateway.config.pools`); :class:`PoolMember`
carries the live state the router reads (in-flight count, scraped queue depth, health).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gateway.config.pools import MemberSpec, PoolSpec
from gateway.policy.upstream import HEALTH_FALL, EjectionPolicy

QUEUE_SAMPLES = 64  # per member: the 4 s window at probe intervals down to 1/16 s


RATE_SAMPLES = 256  # answers-per-second samples kept per model (a minute of 0.25 s rounds)


@dataclass(eq=False)
class PoolMember:
    """Live state of one member. Read its fields anywhere; change them only through its
    methods (the probes, the Python forwarder and the HAProxy controller each report
    what they saw; ``tests/gateway/test_ownership.py`` checks that no module assigns
    them). Single event loop: no locks."""

    pool: str
    spec: MemberSpec
    in_flight: int = 0
    # of them, per model (an eviction waits for its model's to end)
    model_in_flight: Counter[str] = field(default_factory=Counter)
    # requests HAProxy has at this member right now (the native data plane's count)
    external_in_flight: int = 0
    upstream_queue: int = 0  # nv_inference_pending_request_count summed over models
    queue_scraped_at: float = float("-inf")
    healthy: bool = True
    ejected_until: float = 0.0
    consecutive_failures: int = 0
    # back from the dead, its models being reloaded: healthy but not routable yet
    restoring: bool = False
    # what its server metadata (GET /v2) said at the last healthy probe: None when that
    # call failed; ``version_probed`` turns True at the first read, failed or not
    triton_version: str | None = None
    version_probed: bool = False
    failed_probes: int = 0  # health probes failed in a row (HEALTH_FALL)
    # (when, Triton's pending count, the gateway's in-flight there) per probe, the last
    # few seconds' (gateway.policy.tenancy.queued_elsewhere)
    queue_samples: deque[tuple[float, int, int]] = field(
        default_factory=lambda: deque(maxlen=QUEUE_SAMPLES))
    # what Triton's counters said per model (gateway.policy.deadline): (when, mean compute
    # microseconds per request) over the last probe round that had answers; the answers
    # per second of the last rounds (when, rate); the counters and when they were read
    service: dict[str, tuple[float, float]] = field(default_factory=dict)
    answer_rates: dict[str, deque[tuple[float, float]]] = field(default_factory=dict)
    service_counters: dict[str, tuple[int, int]] = field(default_factory=dict)
    counters_read_at: float | None = None
    # model -> (when its config was read, its dynamic batcher's priority levels, 0: none)
    # (gateway.policy.triton_priority)
    priority_levels: dict[str, tuple[float, int]] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return self.spec.key

    def available(self, now: float) -> bool:
        return self.healthy and not self.restoring and now >= self.ejected_until

    # -- what the probes saw ---------------------------------------------------------------
    def probed(self, passed: bool, refused: bool) -> bool:
        """One health probe's verdict; True when the member just came back from the dead.
        A member that still answers is down after HEALTH_FALL failed probes in a row, as
        HAProxy's own checks decide (one slow /live on a machine busy converting a model
        must not send it through maintenance and a restore); nothing listening is down
        at once. Back from the dead, it gets traffic at once, not after its back-off."""
        self.failed_probes = 0 if passed else self.failed_probes + 1
        was_healthy = self.healthy
        self.healthy = passed or (self.healthy and not refused
                                  and self.failed_probes < HEALTH_FALL)
        if self.healthy and not was_healthy:
            self.ejected_until, self.consecutive_failures = 0.0, 0
            return True
        return False

    def observed(self, queue: int | None, version: str | None, now: float) -> None:
        """Triton's queue depth (None: not read) and its version, at a healthy probe."""
        self.triton_version, self.version_probed = version, True
        if queue is not None:
            self.upstream_queue, self.queue_scraped_at = queue, now
            self.queue_samples.append((now, queue, self.in_flight + self.external_in_flight))

    def served(self, counters: dict[str, tuple[int, int]], now: float) -> None:
        """Triton's counters per model, ``(requests answered, compute microseconds)``, at
        a probe: each model's service time is what the requests answered since the last
        probe took (the mean so far at the first), and its answers per second since
        then. A round without answers leaves the service time to age
        (:meth:`service_time_us`); a restarted Triton (counters went back) starts
        again."""
        since = self.counters_read_at
        for model, (answered, compute_us) in counters.items():
            before = self.service_counters.get(model)
            if before is not None and answered >= before[0] and compute_us >= before[1]:
                done = answered - before[0]
                if done:
                    self.service[model] = (now, (compute_us - before[1]) / done)
                if since is not None and now > since:
                    rates = self.answer_rates.setdefault(model, deque(maxlen=RATE_SAMPLES))
                    rates.append((now, done / (now - since)))
            elif answered:
                self.service[model] = (now, compute_us / answered)
        self.service_counters = dict(counters)
        self.counters_read_at = now

    def service_time_us(self, model: str, now: float, fresh_s: float) -> float | None:
        """The model's measured service time, if measured within ``fresh_s``."""
        measured = self.service.get(model)
        return None if measured is None or now - measured[0] > fresh_s else measured[1]

    def peak_answer_rate(self, model: str, now: float, window_s: float) -> float:
        """The most answers per second of the model measured within ``window_s`` (0:
        none): what the member serves when busy."""
        return max((rate for when, rate in self.answer_rates.get(model, ())
                    if now - when <= window_s), default=0.0)

    def levels_due(self, model: str, now: float, ttl_s: float) -> bool:
        """Whether the model's config is to be read (again) for its priority levels."""
        read = self.priority_levels.get(model)
        return read is None or now - read[0] >= ttl_s

    def read_levels(self, model: str, levels: int, now: float) -> None:
        """The model's priority levels as its config here said (or, on a data-plane
        replica, as the control plane's snapshot says)."""
        self.priority_levels[model] = (now, levels)

    def routed(self, routable: bool, version: str | None) -> None:
        """What the control plane's snapshot says of it: a data-plane replica probes
        nothing itself, and routes as the control plane last decided."""
        self.healthy, self.restoring = routable, False
        self.triton_version, self.version_probed = version, True

    def restore_started(self) -> bool:
        """Held out of routing while its models are reloaded; False if already so."""
        if self.restoring:
            return False
        self.restoring = True
        return True

    def restore_done(self) -> None:
        self.restoring = False

    # -- what the data planes saw --------------------------------------------------------
    def request_started(self, model: str | None = None) -> None:
        self.in_flight += 1
        if model is not None:
            self.model_in_flight[model] += 1

    def request_ended(self, model: str | None = None) -> None:
        self.in_flight -= 1
        if model is not None:
            self.model_in_flight[model] -= 1
            if not self.model_in_flight[model]:
                del self.model_in_flight[model]

    def answered(self) -> None:
        self.consecutive_failures = 0

    def failed(self, now: float, ejection: EjectionPolicy) -> bool:
        """A connection failure; True when it ejects the member (``ejection``)."""
        self.consecutive_failures += 1
        if self.consecutive_failures < ejection.failures:
            return False
        self.ejected_until = now + ejection.ejection_s(self.consecutive_failures)
        return True

    def haproxy_in_flight(self, count: int) -> None:
        """Requests HAProxy has at this member now (its stats, once per round)."""
        self.external_in_flight = count


@dataclass
class Pool:
    spec: PoolSpec
    members: list[PoolMember] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def capacity(self) -> int:
        return self.spec.capacity_per_member * max(1, len(self.members))

    def resolved(self, specs: Sequence[MemberSpec]) -> list[str]:
        """The members DNS resolves to now (plus the declared ones): known members keep
        their state, new ones join, vanished ones leave. Returns the keys that joined."""
        known = {m.key: m for m in self.members}
        kept = [m for m in self.members
                if m.key in {s.key for s in specs} or m.spec in self.spec.members]
        joined = [s for s in specs if s.key not in known]
        kept += [PoolMember(self.name, s) for s in joined]
        self.members[:] = kept
        return [s.key for s in joined]


def build_pools(specs: Iterable[PoolSpec]) -> list[Pool]:
    pools = []
    for spec in specs:
        pools.append(Pool(spec, [PoolMember(spec.name, m) for m in spec.members]))
    return pools


def pools_for_model(pools: Sequence[Pool], model: str) -> list[Pool]:
    return [p for p in pools if p.spec.serves(model) and p.spec.weight(model) > 0]
