"""Each model's memory footprint: measured, not guessed.

A model's footprint is the largest of what is known of it:
- ``footprint_bytes`` in its model policy (the operator's word);
- the converter's measurement of the variant it published (its report,
  :func:`converters.model_dir.read_footprint`);
- what a member reported once it was last loaded there (:mod:`.memory`: the memory of
  the stubs started by that load on this host, the change of GPU memory across the load
  elsewhere).
The converter measures a session in a process that has its libraries loaded already; a
member's runtime adds its own per model (a Python-backend stub: about 30 MB on CPU).
That overhead is learned from the models measured both ways (the largest difference) and
added to the converter's figure of a model not measured on a member yet, so a first load
does not overcommit a budget. A model nothing is known of counts as the largest
footprint known in its pool (one eighth of a member's budget when none is known), until
its first load measures it. On this host the resident models are measured again each
residency round (:meth:`Footprints.remeasure`): a model's figure is its latest, and the
most it rose from one measure to the next is remembered (:meth:`Footprints.growth`: a
stub grows as it first serves), so that a placement leaves that much free.

A load takes more than the model keeps once loaded (ONNX Runtime building its session:
91 MB above its resident set for a 131 MB model here). On this host each load's surge is
measured too (:func:`~gateway.residency.memory.measured_surges`); with the pool's
``surge_headroom`` the largest of its models' is kept free on each member
(:meth:`Footprints.surge`; the residency's ``usable_bytes``), so that a load on a member
full to its budget stays within it.

The converter's figure is read from the model's folder in the repository the members
load from: the lifecycle's ``repository``, else the configuration's ``model_repository``
(none: no converter figure).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from pathlib import Path

from converters.model_dir import read_footprint
from gateway.config import GatewayConfig
from gateway.errors import GatewayError
from gateway.pools import Pool, PoolMember
from gateway.residency.memory import (
    Listeners,
    StubSizes,
    gpu_memory_used,
    is_loopback,
    measured_footprints,
    measured_surges,
    released,
)
from gateway.residency.window import RecentMax
from gateway.upstream.triton import MemberAdmin

log = logging.getLogger(__name__)


class Footprints:
    """``repository``: where the members' models are (default: the configuration's
    ``model_repository``)."""

    def __init__(self, config: GatewayConfig, admin: MemberAdmin,
                 repository: Path | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.admin = admin
        self.repository = repository or config.model_repository
        self.clock = clock
        self._converter: dict[str, tuple[float, int | None]] = {}  # model -> (mtime, bytes)
        self._measured: dict[str, int] = {}
        self._surges: dict[str, int] = {}  # model -> the most a load took beyond its figure
        # model -> the most its figure rose at a measure, within RISE_MEMORY_S
        self._growth: dict[str, RecentMax] = {}
        self._listeners = Listeners()  # the members' tritonservers on this host
        self._sizes = StubSizes()  # their stubs' sizes, read again once they may change
        # (overhead, the largest figure known of any model): worked out again only after
        # a figure changed (None), not for every model of every view
        self._summary: tuple[int, int | None] | None = None

    def refresh(self, models: list[str]) -> None:
        """Read the converter's figure of each model whose repository folder changed."""
        if self.repository is None:
            return
        for model in models:
            folder = self.repository / model
            try:
                mtime = max((p.stat().st_mtime for p in (folder, *folder.iterdir())
                             if p.is_dir()), default=0.0)
            except OSError:
                continue
            cached = self._converter.get(model)
            if cached is None or cached[0] != mtime:
                self._converter[model] = (mtime, read_footprint(folder))
                self._summary = None

    def of(self, model: str, pool: Pool) -> tuple[int, str]:
        """(bytes, where the figure comes from: configured, converter, measured or
        estimate)."""
        policy = self.config.models.get(model)
        converter = self._converter.get(model, (0.0, None))[1]
        if converter and model not in self._measured:
            converter += self.overhead()
        known = [(size, source) for size, source in (
            (policy.footprint_bytes if policy else None, "configured"),
            (converter, "converter"),
            (self._measured.get(model), "measured")) if size]
        if known:
            size, source = max(known)
            return int(size), source
        largest = self._summaries()[1]
        if largest:
            return largest, "estimate"
        spec = pool.spec.residency
        return (spec.usable_bytes // 8 if spec else 0), "estimate"

    def _known(self, model: str) -> int | None:
        figures = [self._measured.get(model), self._converter.get(model, (0.0, None))[1]]
        return max((f for f in figures if f), default=None)

    def bytes(self, model: str, pool: Pool) -> int:
        return self.of(model, pool)[0]

    def measured(self, model: str, size: int) -> None:
        """A member reported ``size`` bytes for ``model`` (after a load, or measured
        again); a rise over its last figure is remembered for :data:`RISE_MEMORY_S`
        (:meth:`growth`)."""
        if size > 0:
            last = self._measured.get(model)
            if last is not None and size > last:
                self._growth.setdefault(model, RecentMax()).note(size - last, self.clock())
            if size != last:
                self._measured[model] = size
                self._summary = None

    def growth(self, models: Collection[str]) -> int:
        """The most the figure of any of ``models`` rose from one measure to the next
        within the last :data:`RISE_MEMORY_S` (0: none seen): a stub growing as it first
        serves, a load measured larger than the last (a one-off too: a new version
        larger than the old, a rollout's two versions measured together, so remembered
        a while only). What a placement leaves free beside the models it packs
        (:meth:`~gateway.residency.manager.Residency.margin_bytes`)."""
        now = self.clock()
        return max((g.value(now) for m in models if (g := self._growth.get(m))), default=0)

    def surge(self, models: Collection[str]) -> int:
        """The most any of ``models``'s loads took beyond what it kept (0: none measured)."""
        return max((self._surges.get(m, 0) for m in models), default=0)

    def overhead(self) -> int:
        """What a member's runtime takes per model beyond the converter's figure,
        learned from the models measured both ways (0 until one is)."""
        return self._summaries()[0]

    def _summaries(self) -> tuple[int, int | None]:
        """(:meth:`overhead`, the largest figure known of any model: what one nothing is
        known of counts as), worked out once per change of the figures. Each is a pass
        over every model, and every model's figure is asked for by every view: worked out
        per figure, a pool of 2,000 models took 0.08 s per view, 0.66 s with half of them
        unknown (the pass for each)."""
        if self._summary is None:
            differences = [size - converter for model, size in self._measured.items()
                           if (converter := self._converter.get(model, (0.0, None))[1])]
            largest = max((s for m in self._measured.keys() | self._converter.keys()
                           if (s := self._known(m))), default=None)
            self._summary = (max(0, *differences) if differences else 0, largest)
        return self._summary

    async def gpu_before(self, member: PoolMember) -> int | None:
        """A remote member's GPU memory in use before a load (None: none read)."""
        if is_loopback(member.spec.host):
            return None
        return await self._gpu_used(member)

    async def measure(self, member: PoolMember, model: str, gpu_before: int | None = None,
                      started_after: float | None = None) -> None:
        """What ``member`` reports of ``model`` once loaded (see the module's sources);
        ``started_after``: when the load began (epoch seconds)."""
        try:
            if is_loopback(member.spec.host):
                for name, size in (await measured_footprints(
                        member, self.admin, [model], started_after,
                        self._listeners, self._sizes)).items():
                    self.measured(name, size)
                for name, surge in (await measured_surges(
                        member, [model], started_after, self._listeners)).items():
                    self._surges[name] = max(surge, self._surges.get(name, 0))
            elif gpu_before is not None:
                after = await self._gpu_used(member)
                if after is not None and after > gpu_before:
                    self.measured(model, after - gpu_before)
        except Exception as exc:  # noqa: BLE001 - a figure missed, the next load measures
            log.info("measuring %s on %s failed: %r", model, member.key, exc)

    async def released(self, member: PoolMember, model: str, timeout_s: float) -> bool:
        """Whether the memory of ``model``, unloaded from ``member``, is free again (its
        stubs exited; at most ``timeout_s`` waited)."""
        try:
            return await released(member, model, timeout_s, self._listeners)
        except Exception as exc:  # noqa: BLE001 - not watched: taken as freed
            log.info("watching %s leave %s failed: %r", model, member.key, exc)
            return True

    async def remeasure(self, member: PoolMember, models: Collection[str]) -> None:
        """Measure again each of ``models`` resident on ``member``, in one scan of its
        processes; each figure replaces that model's last. Only a member on this host: a
        remote one's GPU memory tells what a load changed, not what each model holds."""
        if not models or not is_loopback(member.spec.host):
            return
        try:
            figures = await measured_footprints(member, self.admin, models,
                                                listener=self._listeners, sizes=self._sizes)
        except Exception as exc:  # noqa: BLE001 - a round's figures missed, the next reads
            log.info("measuring %d models on %s failed: %r", len(models), member.key, exc)
            return
        for name, size in figures.items():
            self.measured(name, size)

    async def _gpu_used(self, member: PoolMember) -> int | None:
        try:
            return gpu_memory_used(await self.admin.metrics_text(member))
        except GatewayError:
            return None
