"""The residency benchmark's figures (pure: no processes, no network): each request's
outcome (hit, miss or failed, and why: :func:`cause_of`), the arms and what one ran
(:class:`Arm`, :class:`Setup`, :class:`ArmRun`), an arm's summary per phase
(:func:`summarise`: hits against the best fixed placement, failures by cause, hits' p99
per protocol, memory peaks, recovery after each reshuffle), issue 34's goals
(:func:`arm_goals`), the tables (:func:`markdown`) and the plot (:func:`plot`).
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtests.harness import figure, num, percentile, table
from loadtests.residency_models import BenchModel
from loadtests.residency_trace import (
    FLAT_S,
    PHASES,
    PROTOCOLS,
    STEEP_S,
    Phase,
    placements,
    reshuffles,
    serving_placement,
)

CAUSES = ("room_full", "no_room", "deadline", "load_too_long", "not_found", "wrong_model",
          "other")
OK_CODES = ("200", "OK")
WINDOW_S = 10.0  # the recovery's window
HELD_MS = 1000.0  # a failure answered later than this was held before it was refused
GOAL_FAILED, GOAL_HIT_GAP, GOAL_P99_X = 0.01, 0.02, 1.2
GOAL_REAL_X, GOAL_RECOVERY_S, GOAL_RECOVERED = 1.05, 60.0, 0.90


# -- outcomes -------------------------------------------------------------------------

def cause_of(code: str, message: str, right: bool = True) -> str | None:
    """Why a request failed (None: it did not), from its status (an HTTP status, a gRPC
    code's name, ``timeout``/``error``: no answer) and the gateway's words."""
    if code in OK_CODES:
        return None if right else "wrong_model"
    text = message.lower()
    if "waiting room" in text and "full" in text:
        return "room_full"
    if "has room for it now" in text or "more than any member" in text:
        return "no_room"
    if "longer than this request may wait" in text:
        return "load_too_long"
    if code in ("404", "NOT_FOUND"):
        return "not_found"
    if code in ("504", "DEADLINE_EXCEEDED", "timeout"):
        return "deadline"
    return "other"


@dataclass(frozen=True)
class Outcome:
    t: float  # scheduled send, seconds after the start
    model: str
    phase: int
    protocol: str
    code: str  # HTTP status, gRPC code's name, or timeout / error (no answer)
    latency_ms: float  # from the scheduled send
    load_wait_ms: float | None  # the gateway's mark: it waited for a load
    message: str = ""  # a failed request's answer (its start)
    right: bool = True  # answered by the model asked for, with its output

    @property
    def cause(self) -> str | None:
        return cause_of(self.code, self.message, self.right)

    @property
    def kind(self) -> str:
        """``hit``, ``miss`` (answered after a load) or ``failed``."""
        if self.cause is not None:
            return "failed"
        return "hit" if self.load_wait_ms is None else "miss"


def load_wait(value: str | bytes | None) -> float | None:
    """The load-wait mark's milliseconds (None: absent; not a number counts as 0)."""
    if value is None:
        return None
    try:
        return float(value.decode() if isinstance(value, bytes) else value)
    except ValueError:
        return 0.0


def hit_share(outcomes: Sequence[Outcome]) -> float | None:
    return sum(o.kind == "hit" for o in outcomes) / len(outcomes) if outcomes else None


def failed_share(outcomes: Sequence[Outcome]) -> float | None:
    return sum(o.kind == "failed" for o in outcomes) / len(outcomes) if outcomes else None


def causes(outcomes: Sequence[Outcome]) -> dict[str, int]:
    """Failed requests by cause, in :data:`CAUSES` order (none: not listed)."""
    seen = Counter(o.cause for o in outcomes if o.cause is not None)
    return {c: seen[c] for c in CAUSES if seen[c]}


def hits_p99(outcomes: Sequence[Outcome], protocol: str, q: float = 99) -> float | None:
    values = [o.latency_ms for o in outcomes if o.kind == "hit" and o.protocol == protocol]
    return round(percentile(values, q), 2) if values else None


def held_then_failed(outcomes: Sequence[Outcome], held_ms: float = HELD_MS) -> int:
    """Failures answered more than ``held_ms`` after their send: held, then refused (or
    cut at their deadline). A refusal known at once comes back within milliseconds."""
    return sum(o.kind == "failed" and o.latency_ms > held_ms for o in outcomes)


def failed_after_load(outcomes: Sequence[Outcome]) -> int:
    """Failures carrying the load-wait mark: they waited for a load, which then served
    them not (their model evicted or gone before they were sent on)."""
    return sum(o.kind == "failed" and o.load_wait_ms is not None for o in outcomes)


def messages(outcomes: Sequence[Outcome], cause: str = "other") -> dict[str, int]:
    """The answers of the failures of ``cause``, most frequent first."""
    return dict(Counter(f"{o.code}: {o.message}" for o in outcomes
                        if o.cause == cause).most_common())


def recovery_s(outcomes: Sequence[Outcome], best: Sequence[frozenset[str]], start: float,
               stop: float, window_s: float = WINDOW_S, threshold: float = GOAL_RECOVERED,
               stride_s: float = 1.0) -> float | None:
    """Seconds after ``start`` (a reshuffle) until the requests of a ``window_s`` window
    (wholly after it, ending by ``stop``) hit at least ``threshold`` of what the best
    fixed placement of each one's phase (``best``) would have hit: that window's end
    minus ``start``. None: no such window."""
    after = sorted((o for o in outcomes if start <= o.t < stop), key=lambda o: o.t)
    times = [o.t for o in after]
    end = start + window_s
    while end <= stop + 1e-9:
        inside = after[bisect.bisect_left(times, end - window_s):bisect.bisect_left(times, end)]
        ideal = sum(o.model in best[o.phase] for o in inside)
        hits = sum(o.kind == "hit" for o in inside)
        if inside and hits >= threshold * ideal:
            return round(end - start, 1)
        end += stride_s
    return None


def hit_series(outcomes: Sequence[Outcome], bin_s: float = 5.0) -> list[tuple[float, float]]:
    """(bin's middle, hit share) per ``bin_s`` of schedule with any request in it."""
    bins: dict[int, list[Outcome]] = {}
    for o in outcomes:
        bins.setdefault(int(o.t // bin_s), []).append(o)
    return [(round((b + 0.5) * bin_s, 2), round(hit_share(v) or 0.0, 4))
            for b, v in sorted(bins.items())]


# -- arms -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Arm:
    kind: str  # all | static | residency
    budget: str | None = None  # a key of the bench's BUDGETS; None: every model resident
    source: Path | None = None  # another checkout's gateway (``--source``: before)

    @property
    def title(self) -> str:
        before = " (before)" if self.source is not None else ""
        return "all resident" if self.kind == "all" else f"{self.kind}{before}, {self.budget}"

    @property
    def folder(self) -> str:
        """Its scratch folder's name (no space: HAProxy's paths allow none)."""
        before = "-before" if self.source is not None else ""
        return self.kind if self.budget is None else f"{self.kind}{before}-{self.budget}"


def arms_of(kinds: Sequence[str], budgets: Sequence[str],
            source: Path | None = None, source_last: bool = False) -> list[Arm]:
    """The arms to run, in order: all resident first (the reference), then each kind at
    each budget (with ``source``, residency from that checkout first, then this one's;
    ``source_last``: this one's first, to see whether the order moves the figures)."""
    out = [Arm("all")] if "all" in kinds else []
    for kind in ("static", "residency"):
        if kind in kinds:
            for budget in budgets:
                pair = [Arm(kind, budget)]
                if kind == "residency" and source is not None:
                    pair.insert(len(pair) if source_last else 0, Arm(kind, budget, source))
                out.extend(pair)
    return out


@dataclass
class Setup:
    """The run's settings, the same for every arm."""

    models: list[BenchModel]
    repo: Path
    rate: float
    phase_s: float
    seed: int
    deadline_ms: int
    residency: dict[str, Any] = field(default_factory=dict)  # knobs beyond the budget
    # how far below its member's server each stub starts (TritonSettings.stub_nice)
    stub_nice: int = 0

    @property
    def names(self) -> list[str]:
        return [m.name for m in self.models]


@dataclass
class ArmRun:
    """What one arm measured."""

    outcomes: list[Outcome]
    samples: list[dict[str, Any]]
    moves: list[dict[str, float]]  # loads and evictions at each phase's start, then the end
    stubs_uss: dict[str, int]  # the first member's stubs at the end
    # CPU over the traffic, in cores: members, control_plane, replica, haproxy,
    # load_generator (loadtests.proc_cpu.component_ticks)
    cpu_cores: dict[str, float] = field(default_factory=dict)
    # a residency arm: seconds its gateway took to settle before the traffic, and the
    # models its members held then (loaded by the fill: nothing asked for them yet)
    settled: tuple[float, int] | None = None


# -- the figures ----------------------------------------------------------------------

def phase_row(outcomes: Sequence[Outcome], best: frozenset[str], phase: Phase,
              moves: tuple[Mapping[str, float], Mapping[str, float]] | None,
              minutes: float, serving: frozenset[str] | None = None) -> dict[str, Any]:
    """One phase's figures; ``serving``: the best fixed placement that keeps a room for
    the models it leaves out (:func:`~loadtests.residency_trace.serving_placement`)."""
    before, after = moves or ({}, {})

    def share(held: frozenset[str] | None) -> float | None:
        if held is None or not outcomes:
            return None
        return sum(o.model in held for o in outcomes) / len(outcomes)
    return {
        "phase": phase.label, "requests": len(outcomes), "hit_share": hit_share(outcomes),
        "best_fixed_share": share(best), "serving_share": share(serving),
        "failed": sum(o.kind == "failed" for o in outcomes), "causes": causes(outcomes),
        "held_then_failed": held_then_failed(outcomes),
        "hits_p99_ms": {p: hits_p99(outcomes, p) for p in PROTOCOLS},
        "loads_per_min": (round((after["loads"] - before["loads"]) / minutes, 2)
                          if moves else None),
        "evictions_per_min": (round((after["evictions"] - before["evictions"]) / minutes, 2)
                              if moves else None),
    }


def peak(samples: Sequence[Mapping[str, Any]], key: str) -> float | None:
    return max((s[key] for s in samples if s.get(key) is not None), default=None)


def summarise(arm: Arm, run: ArmRun, setup: Setup, budget: int | None,
              footprints: Mapping[str, int]) -> dict[str, Any]:
    out = run.outcomes
    best = placements(setup.names, footprints, budget, setup.seed)
    serving = placements(setup.names, footprints, budget, setup.seed,
                         placer=serving_placement)
    by_phase = [[o for o in out if o.phase == i] for i in range(len(PHASES))]
    moves = run.moves if len(run.moves) == len(PHASES) + 1 else None
    phases = [phase_row(by_phase[i], best[i], PHASES[i],
                        (moves[i], moves[i + 1]) if moves else None, setup.phase_s / 60,
                        serving[i])
              for i in range(len(PHASES))]
    end = len(PHASES) * setup.phase_s
    starts = reshuffles(setup.phase_s)
    stops = [*starts[1:], end]
    popular = {label: [o for o in out if PHASES[o.phase].s == s]
               for label, s in (("flat", FLAT_S), ("steep", STEEP_S))}
    return {
        "arm": arm.title, "kind": arm.kind, "budget": arm.budget, "budget_bytes": budget,
        "models": len(setup.models), "footprints_bytes": sum(footprints.values()),
        "requests": len(out), "offered_rps": setup.rate, "phase_s": setup.phase_s,
        "deadline_ms": setup.deadline_ms, "residency_knobs": setup.residency,
        "stub_nice": setup.stub_nice,
        "phases": phases, "hits_p99_ms": {p: hits_p99(out, p) for p in PROTOCOLS},
        "failed": sum(o.kind == "failed" for o in out), "causes": causes(out),
        "failed_share": {k: failed_share(v) for k, v in popular.items()},
        "held_then_failed": held_then_failed(out), "failed_after_load": failed_after_load(out),
        "load_waits": {p: sum(o.load_wait_ms is not None and o.protocol == p for o in out)
                       for p in PROTOCOLS},
        "max_used_bytes": peak(run.samples, "used_bytes"),
        "max_stubs_uss": peak(run.samples, "stubs_uss"),
        "max_stubs_anon": peak(run.samples, "stubs_anon"),
        "max_rss_above_idle": peak(run.samples, "rss_above_idle"),
        "recovery": [{"at_s": s, "span_s": stop - s,
                      "s": recovery_s(out, best, s, stop)} for s, stop in zip(
                          starts, stops, strict=True)],
        "other_messages": messages(out, "other"),
        "hit_series": hit_series(out), "memory": list(run.samples),
        "cpu_cores": dict(run.cpu_cores),
        "settled": None if run.settled is None else {
            "s": round(run.settled[0], 1), "models": run.settled[1]},
    }


def ratio(value: float | None, base: float | None) -> float | None:
    return round(value / base, 3) if value is not None and base else None


def add_p99_ratios(rows: Sequence[dict[str, Any]]) -> None:
    """Each row's hits' p99 over the all-resident arm's, per protocol, overall and per
    phase (None without that arm)."""
    base = next((r for r in rows if r["kind"] == "all"), None)
    for r in rows:
        overall = base["hits_p99_ms"] if base else {}
        r["hits_p99_x"] = {p: ratio(r["hits_p99_ms"][p], overall.get(p)) for p in PROTOCOLS}
        for i, ph in enumerate(r["phases"]):
            ref = base["phases"][i]["hits_p99_ms"] if base else {}
            ph["hits_p99_x"] = {p: ratio(ph["hits_p99_ms"][p], ref.get(p)) for p in PROTOCOLS}


# -- the report -----------------------------------------------------------------------

def _mb(value: float | None) -> str:
    return "n/a" if value is None else f"{value / 1e6:.0f} MB"


def pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f} %"


def _x(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def failed_cell(count: int, requests: int, by_cause: Mapping[str, int]) -> str:
    if not count:
        return "0"
    by = ", ".join(f"{k} {v}" for k, v in by_cause.items())
    return f"{count} ({pct(count / requests if requests else None)}: {by})"


def p99_cell(ms: float | None, x: float | None) -> str:
    return num(ms, ".1f") + (f" ({_x(x)})" if x is not None else "")


def moves_cell(phase: Mapping[str, Any]) -> str:
    if phase["loads_per_min"] is None:
        return "n/a"
    return f"{phase['loads_per_min']:.1f} / {phase['evictions_per_min']:.1f}"


def best_cell(phase: Mapping[str, Any]) -> str:
    """Hits against the best fixed placement, and the one that keeps a room (where
    it differs: every model fits the budgets otherwise)."""
    cell = f"{pct(phase['hit_share'])} / {pct(phase['best_fixed_share'])}"
    serving = phase.get("serving_share")
    if serving is not None and serving != phase["best_fixed_share"]:
        cell += f" ({pct(serving)})"
    return cell


def phase_table(rows: Sequence[Mapping[str, Any]]) -> str:
    header = ("arm", "phase", "requests", "hits / best fixed (keeping a room for the rest)",
              "failed (by cause)",
              "hits p99 HTTP, ms (x all)", "hits p99 gRPC, ms (x all)",
              "loads / evictions per min")
    lines = []
    for r in rows:
        for ph in r["phases"]:
            x = ph.get("hits_p99_x", {})
            lines.append((r["arm"], ph["phase"], ph["requests"],
                          best_cell(ph),
                          failed_cell(ph["failed"], ph["requests"], ph["causes"]),
                          p99_cell(ph["hits_p99_ms"]["http"], x.get("http")),
                          p99_cell(ph["hits_p99_ms"]["grpc"], x.get("grpc")),
                          moves_cell(ph)))
    return table(header, lines)


def _against(value: float | None, budget: int | None) -> str:
    if value is None or not budget:
        return _mb(value)
    return f"{_mb(value)} ({_x(value / budget)})"


def recovery_cell(recovery: Sequence[Mapping[str, Any]]) -> str:
    return ", ".join(
        f"at {r['at_s']:.0f} s: " + (f"{r['s']:.0f} s" if r["s"] is not None
                                     else f"not within {r['span_s']:.0f} s")
        for r in recovery) or "n/a"


def arm_table(rows: Sequence[Mapping[str, Any]]) -> str:
    header = ("arm", "budget per member", "accounted peak (x budget)",
              "stubs' USS peak (x budget)", "of it anonymous, peak (x budget)",
              "tree RSS above idle, peak",
              "failed: flat / steep", f"held > {HELD_MS / 1e3:g} s, then failed",
              "failed after their load", "back to 90 % of best fixed after each reshuffle",
              "CPU, cores: " + " / ".join(CPU_PARTS.values()))
    return table(header, ((
        r["arm"], _mb(r["budget_bytes"]) if r["budget_bytes"] else "none",
        _against(r["max_used_bytes"], r["budget_bytes"]),
        _against(r["max_stubs_uss"], r["budget_bytes"]),
        _against(r.get("max_stubs_anon"), r["budget_bytes"]), _mb(r["max_rss_above_idle"]),
        f"{pct(r['failed_share']['flat'])} / {pct(r['failed_share']['steep'])}",
        r["held_then_failed"], r["failed_after_load"], recovery_cell(r["recovery"]),
        cpu_cell(r.get("cpu_cores", {})))
        for r in rows))


# the parts whose CPU the arm table gives, in its order (ArmRun.cpu_cores' keys)
CPU_PARTS = {"members": "members", "control_plane": "control plane", "replica": "replica",
             "haproxy": "HAProxy", "load_generator": "load generator"}


def cpu_cell(cpu: Mapping[str, float]) -> str:
    """The parts' cores, in :data:`CPU_PARTS`' order ("n/a" where not measured)."""
    return " / ".join(f"{cpu[k]:.2f}" if k in cpu else "n/a" for k in CPU_PARTS) \
        if cpu else "n/a"


Goal = tuple[str, bool | None, str]


def _memory_goals(r: Mapping[str, Any]) -> list[Goal]:
    budget = r["budget_bytes"]
    used, real = r["max_used_bytes"], r["max_stubs_uss"]
    return [
        ("accounted use within the budget at every sample",
         None if used is None else used <= budget,
         f"peak {_against(used, budget)} of {_mb(budget)}"),
        (f"real memory (stubs' USS) within {GOAL_REAL_X}x the budget at every sample",
         None if real is None else real <= GOAL_REAL_X * budget,
         f"peak {_against(real, budget)} (anonymous {_against(r.get('max_stubs_anon'), budget)}"
         f"; tree RSS above idle {_mb(r['max_rss_above_idle'])})"),
    ]


def _recovery_goal(r: Mapping[str, Any]) -> Goal:
    recs = r["recovery"]
    # not back within a span shorter than the goal (the schedule's end): not judged
    each = [None if x["s"] is None and x["span_s"] < GOAL_RECOVERY_S
            else x["s"] is not None and x["s"] <= GOAL_RECOVERY_S for x in recs]
    met = False if False in each else None if None in each else True
    return (f"back to {GOAL_RECOVERED:.0%} of the best fixed placement's hit ratio within "
            f"{GOAL_RECOVERY_S:.0f} s of each reshuffle", met, recovery_cell(recs))


def serving_note(phases: Sequence[Mapping[str, Any]]) -> str:
    """What the best fixed placement keeping a room for the models it leaves out takes
    per phase, where that differs from the best fixed placement's."""
    if all(ph.get("serving_share") in (None, ph["best_fixed_share"]) for ph in phases):
        return ""
    return (" (the best fixed placement keeping one member a room for the models it "
            "leaves out: " + "; ".join(f"{ph['phase']}: {pct(ph['serving_share'])}"
                                       for ph in phases) + ")")


def arm_goals(r: Mapping[str, Any]) -> list[Goal]:
    """Issue 34's goals for one residency arm: (goal, met (None: not judged), figure)."""
    not_found = r["causes"].get("not_found", 0)
    flat, steep = r["failed_share"]["flat"], r["failed_share"]["steep"]
    gaps = [(ph["phase"], ph["hit_share"], ph["best_fixed_share"]) for ph in r["phases"]]
    x = r.get("hits_p99_x", {})
    judged = [v for v in x.values() if v is not None]
    return [
        ("0 404 / NOT_FOUND for a registered model", not_found == 0, str(not_found)),
        ("0 loads evicted before their waiters are served (failures after their load)",
         r["failed_after_load"] == 0, str(r["failed_after_load"])),
        ("0 requests held past the moment it was known they could not be served "
         f"(failures answered after {HELD_MS / 1e3:g} s)", r["held_then_failed"] == 0,
         str(r["held_then_failed"])),
        (f"failed <= {GOAL_FAILED:.0%} with a {r['deadline_ms'] / 1e3:g} s deadline, "
         "flat and steep", None if flat is None or steep is None
         else max(flat, steep) <= GOAL_FAILED, f"flat {pct(flat)}, steep {pct(steep)}"),
        (f"hit ratio >= best fixed placement - {GOAL_HIT_GAP} in every phase",
         None if any(h is None or b is None for _, h, b in gaps)
         else all(h >= b - GOAL_HIT_GAP for _, h, b in gaps),
         "; ".join(f"{p}: {pct(h)} vs {pct(b)}" for p, h, b in gaps)
         + serving_note(r["phases"])),
        (f"hits' p99 <= {GOAL_P99_X}x all-resident, HTTP and gRPC",
         None if len(judged) < len(PROTOCOLS) else max(judged) <= GOAL_P99_X,
         ", ".join(f"{p.upper() if p == 'http' else 'gRPC'} {_x(x.get(p))} "
                   f"({num(r['hits_p99_ms'][p], '.1f')} ms)" for p in PROTOCOLS)),
        *_memory_goals(r),
        _recovery_goal(r),
    ]


def verdict(met: bool | None) -> str:
    return "NOT JUDGED" if met is None else "MET" if met else "MISSED"


def notes(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    out = [
        "Hits: answered right without the gateway's load-wait mark (HTTP header, gRPC "
        "trailing metadata `infergate-load-wait-ms`); misses: with it; hit ratios over "
        "every request sent. Best fixed: the share of the phase's requests the models "
        "most requested per byte, packed into both budgets in advance, would take.",
        f"'held > {HELD_MS / 1e3:g} s, then failed' counts failures answered more than "
        f"{HELD_MS / 1e3:g} s after their send (a client's bound on requests held after "
        "they could not be served); 'failed after their load' counts failures carrying "
        "the load-wait mark (a client's view of loads evicted before their waiters went on).",
        "Figures from one run on a shared 2-core host: latencies and recovery are noisy; "
        "compare arms of the same run only.",
        "CPU: what each part spent while the traffic ran, in cores (CPU seconds per "
        "second): the members' Tritons with their stubs, loads included; the gateway's "
        "own process; its data-plane replica; HAProxy; this benchmark's clients.",
    ]
    settled = [f"{r['arm']} {r['settled']['s']:g} s ({r['settled']['models']} models held)"
               for r in rows if r.get("settled")]
    if settled:
        out.append("The residency arms' traffic began once their gateway had settled (no "
                   "load pending, the same models held a round later), as the other arms' "
                   "began once their members had loaded theirs: " + "; ".join(settled)
                   + ". What they held then, the fill loaded knowing nothing of the "
                   "traffic to come.")
    for r in rows:
        if r["kind"] == "residency" and r["load_waits"]["http"] and not r["load_waits"]["grpc"]:
            out.append(f"{r['arm']}: no gRPC answer carried the load-wait mark while "
                       f"{r['load_waits']['http']} HTTP ones did: its gRPC hits may hold "
                       "misses.")
    return out


def markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    if not rows:
        return "(no rows)"
    first = rows[0]
    budgets = ", ".join(f"{r['budget']} {_mb(r['budget_bytes'])}" for r in rows
                        if r["budget_bytes"])
    head = (f"{first['models']} models ({_mb(first['footprints_bytes'])} of footprints), "
            f"2 members, budgets per member: {budgets or 'none'}; {first['requests']} "
            f"requests at {first['offered_rps']:g}/s, half HTTP, half gRPC, "
            f"{first['deadline_ms'] / 1e3:g} s deadline; phases of {first['phase_s']:g} s: "
            + ", ".join(f"{p.label} (s={p.s})" for p in PHASES)
            + (f"; stubs start {first['stub_nice']} below their member's server (nice), "
               "where it may bring them back" if first.get("stub_nice") else "") + ".")
    lines = [head, "", phase_table(rows), "", arm_table(rows), ""]
    for r in rows:
        if r["kind"] == "residency":
            lines.append(f"Goals ({r['arm']}):")
            lines += [f"- {verdict(met)}: {goal}: {fig}" for goal, met, fig in arm_goals(r)]
            lines.append("")
    lines += ["Notes:", *(f"- {n}" for n in notes(rows))]
    return "\n".join(lines)


def plot(rows: Sequence[Mapping[str, Any]], out: Path) -> list[Path]:
    if not rows:
        return []
    path = out / "bench_residency.png"
    budgeted = [r for r in rows if r["budget_bytes"]]
    with figure(path, len(budgeted) + 1, 1, figsize=(10, 3 * (len(budgeted) + 1)),
                squeeze=False) as (_, axes):
        hits = axes[0][0]
        for r in rows:
            ts, shares = zip(*r["hit_series"], strict=True) if r["hit_series"] else ((), ())
            hits.plot(ts, [100 * s for s in shares], label=r["arm"])
        for i, at in enumerate(reshuffles(rows[0]["phase_s"])):
            hits.axvline(at, color="grey", linestyle="--",
                         label="reshuffle" if i == 0 else None)
        hits.set_ylabel("hits (% of requests, 5 s bins)")
        hits.set_xlabel("seconds of schedule")
        hits.legend(fontsize=7)
        for ax, r in zip((a[0] for a in axes[1:]), budgeted, strict=True):
            for member, colour in ((0, "tab:blue"), (1, "tab:orange")):
                mine = [s for s in r["memory"] if s["member"] == member]
                t = [s["t"] for s in mine]
                ax.plot(t, [s["stubs_uss"] / 1e6 for s in mine], color=colour,
                        label=f"member {member}: its stubs' USS")
                if any(s["used_bytes"] is not None for s in mine):
                    ax.plot(t, [(s["used_bytes"] or 0) / 1e6 for s in mine], "--",
                            color=colour, label=f"member {member}: gateway's used_bytes")
            ax.axhline(r["budget_bytes"] / 1e6, color="black", label="budget per member")
            ax.set_title(f"{r['arm']}: each member's memory (sampled every second)")
            ax.set_ylabel("MB")
            ax.set_xlabel("seconds of schedule")
            ax.legend(fontsize=7)
    return [path]
