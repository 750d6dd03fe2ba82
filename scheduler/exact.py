"""Exact placement with CP-SAT, for small and medium fleets, under a time limit.

One Boolean per (pool, eligible GPU, valid start slot); the slot rules are constraints
(at most one instance covers each memory slot, per-profile maximums, no 4g beside 3g on
drivers before R510). Disruption follows mig-parted (:mod:`scheduler.objective`): a GPU
is rebuilt when some profile's planned count exceeds its current count, and only a GPU
that is not rebuilt keeps instances (and its current slots, hence its fragmentation).
The objective is the one in :mod:`scheduler.objective`, minimised
lexicographically term by term. The heuristic's plan is given as a hint, so the result
is never worse than the heuristic's when time runs out.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

from ortools.sat.python import cp_model

from scheduler.layouts import FREE_WINDOWS, fragmentation, mask_of
from scheduler.objective import Assignment, score
from scheduler.profiles import MEMORY_SLOTS, PROFILES, WHOLE_DEVICE
from scheduler.snapshot import GpuView, Snapshot

Var = cp_model.IntVar


@dataclass(frozen=True)
class ExactResult:
    assignment: Assignment
    status: str
    """``optimal`` (proved) or ``feasible`` (time limit reached)."""


def _starts(profile: int) -> tuple[int, ...]:
    return (0,) if profile == WHOLE_DEVICE else PROFILES[profile].start_slots


def variable_count(snapshot: Snapshot) -> int:
    return sum(len(d.eligible) * len(_starts(d.profile)) for d in snapshot.demands)


@dataclass
class _Model:
    model: cp_model.CpModel
    x: dict[tuple[str, int, int], cp_model.IntVar]
    terms: list[tuple[cp_model.LinearExprT, int]]
    """Objective terms (expression, upper bound) in order of importance."""


Item = tuple[str, int, int, cp_model.IntVar]
"""(pool, profile, start, placement variable) on one GPU."""


def _rebuilt_var(m: cp_model.CpModel, gpu: GpuView, items: list[Item]) -> Var | None:
    """True when mig-parted must rebuild the GPU: some profile is planned more often than
    the GPU has it now (see :func:`scheduler.objective.rebuilt`). None: it never must."""
    if not gpu.kind.mig_capable:
        return None
    have = Counter(c.profile for c in gpu.current) if gpu.mig_enabled else Counter()
    r: Var | None = None
    exceeds: list[Var] = []
    for pid in PROFILES:
        of_profile = [v for _, p, _, v in items if p == pid]
        if len(of_profile) <= have[pid]:
            continue
        if r is None:
            r = m.new_bool_var(f"rebuilt_{gpu.position}")
        m.add(sum(of_profile) <= have[pid] + len(of_profile) * r)
        e = m.new_bool_var(f"exceeds_{gpu.position}_{pid}")
        m.add(sum(of_profile) >= have[pid] + 1).only_enforce_if(e)
        exceeds.append(e)
    if r is not None:  # and only then: a rebuild nobody needs is not free to choose
        m.add(r <= sum(exceeds))
    return r


def _kept_vars(
    m: cp_model.CpModel, gpu: GpuView, items: list[Item], rebuilt: Var | None
) -> list[Var]:
    """Per (pool, profile) the GPU runs now: instances that keep serving it, at most
    min(planned, current) and none when the GPU is rebuilt."""
    have = Counter((c.pool, c.profile) for c in gpu.current if c.pool is not None)
    out = []
    for (pool, pid), n in sorted(have.items()):
        planned = [v for q, p, _, v in items if q == pool and p == pid]
        if not planned:
            continue
        k = m.new_int_var(0, n, f"kept_{gpu.position}_{pool}_{pid}")
        m.add(k <= sum(planned))
        if rebuilt is not None:
            m.add(k <= n * (1 - rebuilt))
        out.append(k)
    return out


def _gpu_constraints(
    m: cp_model.CpModel,
    snapshot: Snapshot,
    by_gpu: dict[int, list[Item]],
) -> tuple[list[Var], list[cp_model.LinearExprT], list[Var], list[Var]]:
    used: list[Var] = []
    frags: list[cp_model.LinearExprT] = []
    repartitioned: list[Var] = []
    kept: list[Var] = []
    groups: dict[tuple[object, ...], list[int]] = defaultdict(list)
    per_node = any(d.max_per_node for d in snapshot.demands)
    for g, items in sorted(by_gpu.items()):
        gpu = snapshot.gpus[g]
        use = m.new_bool_var(f"used_{g}")
        used.append(use)
        for _, _, _, v in items:
            m.add_implication(v, use)
        r = _rebuilt_var(m, gpu, items)
        if r is not None:
            repartitioned.append(r)
        kept.extend(_kept_vars(m, gpu, items, r))
        if not gpu.current:
            pools = frozenset(pool for pool, _, _, _ in items)
            groups[(gpu.kind.name, gpu.family, pools, gpu.node if per_node else "")].append(g)
        if not gpu.kind.mig_capable:
            if len(items) > 1:
                m.add(sum(v for *_, v in items) <= 1)
            continue
        occ = [
            sum(v for _, p, s, v in items if PROFILES[p].slot_mask(s) >> t & 1)
            for t in range(MEMORY_SLOTS)
        ]
        for slot in occ:
            if not isinstance(slot, int):
                m.add(slot <= 1)
        m.add(sum(occ) <= MEMORY_SLOTS * use)
        for pid, profile in PROFILES.items():
            of_profile = [v for _, p, _, v in items if p == pid]
            if len(of_profile) > profile.max_per_gpu:
                m.add(sum(of_profile) <= profile.max_per_gpu)
        if not gpu.allows_4g_with_3g:
            only_4g = m.new_bool_var(f"only4g_{g}")
            m.add(sum(v for _, p, _, v in items if p == 5) <= only_4g)
            m.add(sum(v for _, p, _, v in items if p == 9) <= 2 * (1 - only_4g))
        largest = m.new_int_var(0, MEMORY_SLOTS, f"largest_{g}")
        windows = []
        for mask, size in FREE_WINDOWS:
            free = m.new_bool_var("")
            for t in range(MEMORY_SLOTS):
                if mask >> t & 1:
                    m.add(free + occ[t] <= 1)
            windows.append(size * free)
        m.add_max_equality(largest, windows)
        m.add(largest + sum(occ) <= MEMORY_SLOTS)  # tightens the LP: fragmentation >= 0
        planned_frag = MEMORY_SLOTS - sum(occ) - largest
        current_frag = fragmentation(mask_of(gpu.current_placements))
        if r is None:  # never rebuilt: the current layout stays, whatever slots are planned
            frags.append(current_frag * use)
            continue
        frag = m.new_int_var(0, MEMORY_SLOTS, f"frag_{g}")
        m.add(frag >= planned_frag - MEMORY_SLOTS * (1 - r))
        m.add(frag >= current_frag * use - MEMORY_SLOTS * r)
        frags.append(frag)
    # Interchangeable empty GPUs: use them in index order (symmetry breaking).
    use_of = dict(zip(sorted(by_gpu), used, strict=True))
    for members in groups.values():
        for a, b in zip(members, members[1:], strict=False):
            m.add(use_of[a] >= use_of[b])
    return used, frags, repartitioned, kept


def _build(snapshot: Snapshot, objective: str) -> _Model:
    m = cp_model.CpModel()
    x: dict[tuple[str, int, int], cp_model.IntVar] = {}
    by_gpu: dict[int, list[tuple[str, int, int, cp_model.IntVar]]] = defaultdict(list)
    active: dict[str, cp_model.IntVar] = {}
    for d in snapshot.demands:
        a = active[d.pool] = m.new_bool_var(f"active_{d.pool}")
        node_vars: dict[str, list[cp_model.IntVar]] = defaultdict(list)
        mine = []
        for g in d.eligible:
            on_gpu = []
            for s in _starts(d.profile):
                v = x[(d.pool, g, s)] = m.new_bool_var(f"x_{d.pool}_{g}_{s}")
                by_gpu[g].append((d.pool, d.profile, s, v))
                on_gpu.append(v)
            mine.extend(on_gpu)
            node_vars[snapshot.gpus[g].node].extend(on_gpu)
            if d.max_per_gpu is not None and len(on_gpu) > d.max_per_gpu:
                m.add(sum(on_gpu) <= d.max_per_gpu)
        m.add(sum(mine) == d.replicas * a)
        if d.max_per_node is not None:
            for vs in node_vars.values():
                m.add(sum(vs) <= d.max_per_node)
    used, frags, repartitioned, kept = _gpu_constraints(m, snapshot, by_gpu)
    tiers = []
    for priority in snapshot.priorities:
        tier = [d for d in snapshot.demands if d.priority == priority]
        tiers.append((sum(1 - active[d.pool] for d in tier), len(tier)))
    carried = {
        d.pool: min(snapshot.current_by_pool.get(d.pool, 0), d.replicas) for d in snapshot.demands
    }
    moved = sum(n * active[pool] for pool, n in carried.items() if n) - sum(kept)
    n_gpu = len(used)
    rest = {
        "gpus": (sum(used), n_gpu),
        "frag": (sum(frags), MEMORY_SLOTS * n_gpu),
        "repartitioned": (sum(repartitioned), len(repartitioned)),
        "moved": (moved, sum(carried.values())),
    }
    order = (
        ("repartitioned", "moved", "gpus", "frag")
        if objective == "stability"
        else ("gpus", "frag", "repartitioned", "moved")
    )
    return _Model(m, x, [*tiers, *(rest[k] for k in order)])


def _solver(time_limit_s: float, workers: int, seed: int) -> cp_model.CpSolver:
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = seed
    # CP-SAT's own symmetry detection costs seconds on these models (GPUs and start slots
    # are highly symmetric) before any search; the model breaks the main symmetry itself.
    solver.parameters.symmetry_level = 0
    return solver


def _extract(solver: cp_model.CpSolver, built: _Model) -> Assignment:
    out: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for (pool, g, s), v in built.x.items():
        if solver.boolean_value(v):
            out[pool].append((g, s))
    return {pool: tuple(sorted(places)) for pool, places in out.items()}


def _hint(built: _Model, hint: Assignment) -> None:
    built.model.clear_hints()
    chosen = {(pool, g, s) for pool, places in hint.items() for g, s in places}
    for key, v in built.x.items():
        built.model.add_hint(v, key in chosen)


def solve_exact(
    snapshot: Snapshot,
    objective: str,
    time_limit_s: float,
    workers: int,
    seed: int,
    hint: Assignment | None = None,
) -> ExactResult | None:
    """Optimal (or best found) assignment; None when no solution came in time.

    The terms are minimised one after the other, each then capped at its optimum (a
    single weighted sum proves optimality far more slowly: its LP bound mixes terms).
    Each stage may use an equal share of the time left; unused time carries over.
    """
    built = _build(snapshot, objective)
    best: Assignment | None = hint
    best_key = score(snapshot, hint).key(objective) if hint is not None else None
    if hint is not None:
        _hint(built, hint)
    proved, solved, left = True, False, time_limit_s
    stages = [i for i, (_, bound) in enumerate(built.terms) if bound > 0]
    for n, i in enumerate(stages):
        expr = built.terms[i][0]
        built.model.minimize(expr)
        solver = _solver(max(0.05, left / (len(stages) - n)), workers, seed)
        status = solver.solve(built.model)
        left -= solver.wall_time
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            proved = False
            break
        solved = True
        proved = proved and status == cp_model.OPTIMAL
        found = _extract(solver, built)
        found_key = score(snapshot, found).key(objective)
        if best_key is None or found_key < best_key:
            best, best_key = found, found_key
        # Cap this term at the best known value (terms index the score key one to one).
        assert best_key is not None and best is not None
        built.model.add(expr <= best_key[i])
        _hint(built, best)
    if not stages:
        return ExactResult({}, "optimal")
    if not solved or best is None:
        return None
    result = best
    return ExactResult(result, "optimal" if proved else "feasible")
