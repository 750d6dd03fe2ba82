"""An independent check of a PlacementPlan against its request.

It shares no code with the planners: no layout tables, bitmasks or snapshots, only the
profile facts of mig.md and the request itself, so a bug in the planners' slot logic
cannot hide here. It returns every violation found (empty list: the plan is sound).
"""

from __future__ import annotations

from collections import Counter

from scheduler.inventory import GpuSpec, NodeSpec
from scheduler.plan import GpuPlan, PlacementPlan
from scheduler.pools import PoolSpec
from scheduler.profiles import COMPUTE_SLICES, GPU_TYPES, MEMORY_SLOTS, PROFILES, WHOLE_DEVICE
from scheduler.request import PlanningRequest
from scheduler.sizing import replica_rps


def _slot_rules(gpu: GpuPlan, node: NodeSpec) -> list[str]:
    kind = GPU_TYPES[gpu.gpu_type]
    where = gpu.key
    if not kind.mig_capable:
        bad = [i for i in gpu.instances if i.profile_id != WHOLE_DEVICE or i.start != 0]
        out = [f"{where}: non-MIG GPU holds a MIG instance"] if bad else []
        if len(gpu.instances) > 1:
            out.append(f"{where}: whole GPU given to {len(gpu.instances)} instances")
        return out
    out = []
    if gpu.instances and not gpu.mig_enabled:
        out.append(f"{where}: instances on a GPU with MIG disabled")
    taken: dict[int, int] = {}
    counts: Counter[int] = Counter()
    compute = 0
    for i in gpu.instances:
        spec = PROFILES.get(i.profile_id)
        if spec is None or i.profile_id not in kind.profiles:
            out.append(f"{where}: profile {i.profile_id} does not exist on {kind.name}")
            continue
        if i.profile != kind.profiles[i.profile_id][0] or i.memory_slices != spec.memory_slices:
            out.append(f"{where}: profile {i.profile_id} mislabelled as {i.profile}")
        if i.start not in spec.start_slots:
            out.append(f"{where}: {i.profile} cannot start at slot {i.start}")
        for slot in range(i.start, i.start + spec.memory_slices):
            if slot >= MEMORY_SLOTS:
                out.append(f"{where}: {i.profile} at {i.start} runs past slot 7")
            elif slot in taken:
                out.append(f"{where}: slot {slot} used by two instances")
            taken[slot] = i.start
        counts[i.profile_id] += 1
        compute += spec.compute_slices
    for pid, n in counts.items():
        if n > PROFILES[pid].max_per_gpu:
            out.append(f"{where}: {n} x profile {pid}, at most {PROFILES[pid].max_per_gpu}")
    if compute > COMPUTE_SLICES:
        out.append(f"{where}: {compute} compute slices, at most {COMPUTE_SLICES}")
    if counts[5] and counts[9] and not node.allows_4g_with_3g:
        out.append(f"{where}: 4g beside 3g needs driver R510+ (node has {node.driver_version})")
    return out


def _repartition_rule(gpu: GpuPlan, spec: GpuSpec) -> list[str]:
    """mig-parted's semantics: a GPU whose counts are unchanged is left exactly as it is;
    any other is rebuilt, and a rebuild destroys every instance on it."""
    if not GPU_TYPES[gpu.gpu_type].mig_capable:
        return []
    enabled = spec.mig is not None and spec.mig.enabled
    current: list[tuple[int | None, int]] = []
    if enabled and spec.mig is not None:
        kind = GPU_TYPES[spec.type]
        current = [(kind.resolve_profile(i.profile), i.start) for i in spec.mig.instances]
    planned = [(i.profile_id, i.start) for i in gpu.instances]
    have, want = Counter(p for p, _ in current), Counter(p for p, _ in planned)
    if not gpu.repartition and sorted(planned) != sorted(current):
        return [f"{gpu.key}: layout changes but repartition is not flagged"]
    if gpu.repartition and enabled and all(n <= have[p] for p, n in want.items()):
        return [f"{gpu.key}: flagged for repartition though the current instances serve"]
    if gpu.repartition and any(i.kept for i in gpu.instances):
        return [f"{gpu.key}: instances kept on a GPU mig-parted rebuilds"]
    return []


def _pool_rules(pool: PoolSpec, node: NodeSpec, gpu: GpuPlan, profile: int) -> list[str]:
    out = []
    kind = GPU_TYPES[gpu.gpu_type]
    c = pool.constraints
    where = f"pool {pool.name} on {gpu.key}"
    if c.gpu_types and kind.name not in c.gpu_types:
        out.append(f"{where}: GPU type {kind.name} not allowed")
    if any(node.labels.get(k) != v for k, v in c.node_selector.items()):
        out.append(f"{where}: node does not match node_selector")
    for taint in node.taints:
        if taint.effect != "PreferNoSchedule" and not any(
            t.tolerates(taint) for t in c.tolerations
        ):
            out.append(f"{where}: taint {taint.key} not tolerated")
    if kind.profile_memory_gib(profile) < pool.memory_floor_gib():
        out.append(f"{where}: {kind.profile_memory_gib(profile)} GiB < "
                   f"{pool.memory_floor_gib():g} GiB")
    if not replica_rps(pool, kind, profile):
        out.append(f"{where}: no capacity figure for profile {profile} on {kind.name}")
    return out


def validate_plan(request: PlanningRequest, plan: PlacementPlan) -> list[str]:
    nodes = {n.name: n for n in request.fleet.nodes}
    specs = {(n.name, g.index): g for n in request.fleet.nodes for g in n.gpus}
    pools = {p.name: p for p in request.pools}
    out: list[str] = []
    seen = {(g.node, g.index) for g in plan.gpus}
    if seen != set(specs) or len(plan.gpus) != len(specs):
        out.append("plan GPUs do not match the fleet's GPUs one to one")
    per_pool: Counter[str] = Counter()
    per_pool_gpu: Counter[tuple[str, str]] = Counter()
    per_pool_node: Counter[tuple[str, str]] = Counter()
    profiles: dict[str, set[int]] = {}
    for gpu in plan.gpus:
        spec = specs.get((gpu.node, gpu.index))
        if spec is None or spec.type != gpu.gpu_type:
            out.append(f"{gpu.key}: not in the fleet as {gpu.gpu_type}")
            continue
        node = nodes[gpu.node]
        out += _slot_rules(gpu, node) + _repartition_rule(gpu, spec)
        for inst in gpu.instances:
            if inst.pool is None:
                continue
            pool = pools.get(inst.pool)
            if pool is None:
                out.append(f"{gpu.key}: unknown pool {inst.pool}")
                continue
            out += _pool_rules(pool, node, gpu, inst.profile_id)
            per_pool[pool.name] += 1
            per_pool_gpu[(pool.name, gpu.key)] += 1
            per_pool_node[(pool.name, gpu.node)] += 1
            profiles.setdefault(pool.name, set()).add(inst.profile_id)
    for outcome in plan.pools:
        pool = pools[outcome.name]
        n = per_pool[outcome.name]
        if n != outcome.replicas_placed:
            out.append(f"pool {pool.name}: {n} instances, outcome says {outcome.replicas_placed}")
        if n > pool.max_replicas:
            out.append(f"pool {pool.name}: {n} replicas > max_replicas {pool.max_replicas}")
        if outcome.status == "placed" and n < pool.min_replicas:
            out.append(f"pool {pool.name}: placed with {n} < min_replicas {pool.min_replicas}")
        if outcome.status in ("unplaced", "scaled-to-zero") and n:
            out.append(f"pool {pool.name}: {outcome.status} yet has {n} instances")
        if len(profiles.get(pool.name, ())) > 1:
            out.append(f"pool {pool.name}: replicas on different profiles")
    c_limits = {p.name: p.constraints for p in request.pools}
    for (name, key), n in per_pool_gpu.items():
        limit = c_limits[name].max_replicas_per_gpu
        if limit is not None and n > limit:
            out.append(f"pool {name}: {n} replicas on {key}, at most {limit}")
    for (name, node_name), n in per_pool_node.items():
        limit = c_limits[name].max_replicas_per_node
        if limit is not None and n > limit:
            out.append(f"pool {name}: {n} replicas on node {node_name}, at most {limit}")
    return out
