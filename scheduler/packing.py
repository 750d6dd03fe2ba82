"""Mutable packing state for the heuristic: count vectors per GPU, bucketed for speed.

Every GPU is in exactly one bucket, keyed by its class (layout family + which demand
signatures may use it) and its current count vector. Finding the best GPU for one more
instance of a profile scans the non-empty buckets of the demand's classes (at most 128
count vectors each) instead of the GPUs, so a placement costs the same on 10 GPUs as on
10,000. Whether a count vector can take one more instance is a table look-up: the slot
rules were resolved once, in :mod:`scheduler.layouts`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import cache

from scheduler.layouts import (
    EMPTY_VECTOR,
    CountVector,
    add_profile,
    layout_table,
    memory_slices,
    remove_profile,
)
from scheduler.profiles import MEMORY_SLOTS, PROFILE_ORDER, WHOLE_DEVICE
from scheduler.snapshot import Demand, Snapshot

WHOLE_EMPTY: CountVector = (0,)
WHOLE_FULL: CountVector = (1,)


@cache
def transitions(family: str) -> Mapping[tuple[CountVector, int], CountVector]:
    """(count vector, profile) -> count vector after adding it, for placeable results."""
    if family == "whole":
        return {(WHOLE_EMPTY, WHOLE_DEVICE): WHOLE_FULL}
    table = layout_table(family == "mig")
    out = {}
    for vec in table.by_counts:
        for pid in PROFILE_ORDER:
            grown = add_profile(vec, pid)
            if table.placeable(grown):
                out[(vec, pid)] = grown
    return out


@cache
def preference(profile: int) -> Mapping[CountVector, int]:
    """Rank (lower is better) of putting ``profile`` on a GPU at each count vector.

    Best fit: a GPU already in use before an empty one, then the fullest result, then
    the least fragmented result.
    """
    if profile == WHOLE_DEVICE:
        return {WHOLE_EMPTY: 0}
    table = layout_table(True)
    keys = []
    for vec in table.by_counts:
        grown = add_profile(vec, profile)
        if table.placeable(grown):
            keys.append(
                ((vec == EMPTY_VECTOR, -memory_slices(grown), table.min_fragmentation(grown)), vec)
            )
    keys.sort()
    return {vec: rank for rank, (_, vec) in enumerate(keys)}


@cache
def vector_fragmentation(family: str, vec: CountVector) -> int:
    """Fragmentation of the best layout of ``vec`` (0 for whole GPUs)."""
    if family == "whole":
        return 0
    return layout_table(family == "mig").min_fragmentation(vec)


def used_slices(vec: CountVector) -> int:
    return MEMORY_SLOTS * vec[0] if len(vec) == 1 else memory_slices(vec)


class Packing:
    """Count vectors per GPU and the pools on them; ``gpu_order`` breaks ties."""

    def __init__(self, snapshot: Snapshot, gpu_order: Iterable[int] | None = None) -> None:
        self.snapshot = snapshot
        gpus = snapshot.gpus
        self.family = [g.family for g in gpus]
        self.counts: list[CountVector] = [
            WHOLE_EMPTY if f == "whole" else EMPTY_VECTOR for f in self.family
        ]
        self.on_gpu: list[dict[str, int]] = [{} for _ in gpus]
        self.on_node: dict[tuple[str, str], int] = {}
        self.places: dict[str, list[int]] = {}
        self.demand = {d.pool: d for d in snapshot.demands}
        accepts: list[set[int]] = [set() for _ in gpus]
        by_signature = {d.signature: d.eligible for d in snapshot.demands}
        for sig, eligible in by_signature.items():
            for g in eligible:
                accepts[g].add(sig)
        class_ids: dict[tuple[str, frozenset[int]], int] = {}
        self.class_of: list[int] = []
        for g, sigs in enumerate(accepts):
            key = (self.family[g], frozenset(sigs))
            self.class_of.append(class_ids.setdefault(key, len(class_ids)))
        self.class_family = [fam for fam, _ in class_ids]
        self.sig_classes: dict[int, list[int]] = {}
        for (_, accepted), cid in class_ids.items():
            for sig in accepted:
                self.sig_classes.setdefault(sig, []).append(cid)
        self.buckets: list[dict[CountVector, dict[int, None]]] = [{} for _ in class_ids]
        for g in gpu_order if gpu_order is not None else range(len(gpus)):
            if accepts[g]:
                self.buckets[self.class_of[g]].setdefault(self.counts[g], {})[g] = None

    # -- queries ---------------------------------------------------------------------

    def placed(self, pool: str) -> int:
        return len(self.places.get(pool, ()))

    def fits(self, d: Demand, g: int) -> bool:
        if (self.counts[g], d.profile) not in transitions(self.family[g]):
            return False
        return self._within_limits(d, g)

    def _within_limits(self, d: Demand, g: int) -> bool:
        if d.max_per_gpu is not None and self.on_gpu[g].get(d.pool, 0) >= d.max_per_gpu:
            return False
        if d.max_per_node is not None:
            node = self.snapshot.gpus[g].node
            if self.on_node.get((node, d.pool), 0) >= d.max_per_node:
                return False
        return True

    def find(self, d: Demand, exclude: int | None = None, allow_empty: bool = True) -> int | None:
        """Best GPU for one more instance of ``d`` (see :func:`preference`)."""
        ranks = preference(d.profile)
        limited = d.max_per_gpu is not None or d.max_per_node is not None or exclude is not None
        best_rank, best_gpu = len(ranks), None
        for cid in self.sig_classes.get(d.signature, ()):
            trans = transitions(self.class_family[cid])
            for vec, members in self.buckets[cid].items():
                rank = ranks.get(vec)
                if rank is None or rank >= best_rank or (vec, d.profile) not in trans:
                    continue
                if not allow_empty and sum(vec) == 0:
                    continue
                if not limited:
                    best_rank, best_gpu = rank, next(iter(members))
                    continue
                for g in members:
                    if g != exclude and self._within_limits(d, g):
                        best_rank, best_gpu = rank, g
                        break
        return best_gpu

    def best_move(self, d: Demand, source: int) -> tuple[int, int] | None:
        """The used GPU that, taking one ``d`` instance from ``source``, lowers total
        fragmentation the most: (GPU, change), or None when no move helps."""
        fam = self.family[source]
        before = self.counts[source]
        if fam == "whole":
            return None
        gain = vector_fragmentation(fam, remove_profile(before, d.profile)) - vector_fragmentation(
            fam, before
        )
        best: tuple[int, int] | None = None
        for cid in self.sig_classes.get(d.signature, ()):
            tfam = self.class_family[cid]
            trans = transitions(tfam)
            for vec, members in self.buckets[cid].items():
                grown = trans.get((vec, d.profile))
                if grown is None or not sum(vec):
                    continue
                delta = gain + vector_fragmentation(tfam, grown) - vector_fragmentation(tfam, vec)
                if delta >= 0 or (best is not None and delta >= best[1]):
                    continue
                for g in members:
                    if g != source and self._within_limits(d, g):
                        best = (g, delta)
                        break
        return best

    def used_gpus(self) -> list[int]:
        return [g for g, vec in enumerate(self.counts) if sum(vec)]

    # -- updates ---------------------------------------------------------------------

    def _move_bucket(self, g: int, old: CountVector, new: CountVector) -> None:
        bucket = self.buckets[self.class_of[g]]
        members = bucket.get(old)
        if members is None:  # a GPU no demand may use is never bucketed
            return
        del members[g]
        if not members:
            del bucket[old]
        bucket.setdefault(new, {})[g] = None

    def add(self, d: Demand, g: int) -> None:
        old = self.counts[g]
        new = transitions(self.family[g])[(old, d.profile)]
        self.counts[g] = new
        self._move_bucket(g, old, new)
        self.on_gpu[g][d.pool] = self.on_gpu[g].get(d.pool, 0) + 1
        key = (self.snapshot.gpus[g].node, d.pool)
        self.on_node[key] = self.on_node.get(key, 0) + 1
        self.places.setdefault(d.pool, []).append(g)

    def remove(self, d: Demand, g: int) -> None:
        old = self.counts[g]
        new = WHOLE_EMPTY if self.family[g] == "whole" else remove_profile(old, d.profile)
        self.counts[g] = new
        self._move_bucket(g, old, new)
        left = self.on_gpu[g][d.pool] - 1
        if left:
            self.on_gpu[g][d.pool] = left
        else:
            del self.on_gpu[g][d.pool]
        key = (self.snapshot.gpus[g].node, d.pool)
        self.on_node[key] -= 1
        self.places[d.pool].remove(g)

    def remove_pool(self, d: Demand) -> list[int]:
        """Take every instance of ``d`` off; returns where they were."""
        where = list(self.places.get(d.pool, ()))
        for g in where:
            self.remove(d, g)
        return where
