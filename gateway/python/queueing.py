"""The Python forwarder's queue in front of a pool (``gateway/policy/queueing.py``).

A pool that queues in the gateway has slots: ``capacity_per_member`` per routable member
(HAProxy: ``maxconn`` on each server). A request takes a slot before it is sent to a
member and gives it back when its answer is in; while none is free it waits here, in
the policy's order (:func:`gateway.policy.queueing.order_key`), at most its bound. A
light tenant's request that finds them full takes a slot of the pool's lane instead
when one is free (:meth:`PoolQueue.take_lane`; HAProxy: the pool's ``.lane`` twin), and
never waits for one.

One record per waiting request (:class:`Waiter`), in one of three states: ``waiting``
(in the heap), ``granted`` (holds a slot, its owner not yet resumed) and ``gone``
(left without a slot: its bound or deadline passed, or its caller was cancelled). Only
:meth:`PoolQueue.grant` moves a waiter to ``granted``, only the owner moves it to
``gone``, so a slot granted to a request whose caller is cancelled at that very moment
is handed back, never lost. Time comes from the injected clock; the wait itself is
``asyncio.timeout`` around the waiter's future.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field


class QueueTimeout(Exception):
    """No slot within the bound: ``waited_s``; ``members``: the pool still had slots."""

    def __init__(self, waited_s: float, members: bool) -> None:
        super().__init__(f"waited {waited_s:.3f} s")
        self.waited_s = waited_s
        self.members = members


@dataclass(order=True)
class Waiter:
    key: tuple[int, int]
    seq: int
    future: asyncio.Future[None] = field(compare=False)
    state: str = field(default="waiting", compare=False)


@dataclass
class PoolQueue:
    """Slots of one pool and the requests waiting for them. ``slots``: how many the pool
    has now (its routable members' capacity); read at every grant, so members that
    leave or come back change it at once. ``lane``: the lane's slots now (the pool's
    ``lane_per_member`` times its routable members)."""

    slots: Callable[[], int]
    clock: Callable[[], float]
    lane: Callable[[], int] = lambda: 0
    busy: int = 0  # slots held
    waiting: int = 0  # waiters in state "waiting"
    lane_busy: int = 0  # lane slots held
    _heap: list[Waiter] = field(default_factory=list)
    _seq: itertools.count[int] = field(default_factory=itertools.count)

    async def acquire(self, key: tuple[int, int], timeout_s: float) -> float:
        """Take a slot, waiting in ``key``'s order at most ``timeout_s``; the seconds
        waited. :class:`QueueTimeout` when none came in time; a cancelled caller leaves
        the queue (and gives back a slot granted meanwhile)."""
        if not self.waiting and self.busy < self.slots():
            self.busy += 1
            return 0.0
        began = self.clock()
        waiter = Waiter(key, next(self._seq), asyncio.get_running_loop().create_future())
        heapq.heappush(self._heap, waiter)
        self.waiting += 1
        try:
            # not wait_for: it returns a result that came as its caller was cancelled,
            # swallowing the cancellation (Python 3.11); here a cancelled caller leaves
            async with asyncio.timeout(max(0.0, timeout_s)):
                await waiter.future
        except (TimeoutError, asyncio.CancelledError) as exc:
            granted = waiter.state == "granted"
            if not granted:
                self.waiting -= 1
            waiter.state = "gone"
            if granted:  # granted as the wait ended: the slot goes to the next one
                self.release()
            elif len(self._heap) > 2 * self.waiting + 64:  # no grants to pop the gone ones
                self._heap = [w for w in self._heap if w.state == "waiting"]
                heapq.heapify(self._heap)
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise QueueTimeout(self.clock() - began, self.slots() > 0) from None
        return self.clock() - began

    def take_lane(self) -> bool:
        """A lane slot, taken when the pool's own slots are full (or have waiters) and
        the lane has one free; False: none taken, the request waits its turn
        (:meth:`acquire`). Given back with :meth:`release_lane`."""
        if (self.waiting or self.busy >= self.slots()) and self.lane_busy < self.lane():
            self.lane_busy += 1
            return True
        return False

    def release_lane(self) -> None:
        self.lane_busy -= 1

    def release(self) -> None:
        """A slot handed back (its request answered, failed or gone)."""
        self.busy -= 1
        self.grant()

    def grant(self) -> None:
        """Free slots to the first waiters, in order (also when the pool's slots grew:
        a member back)."""
        while self._heap and self.busy < self.slots():
            waiter = heapq.heappop(self._heap)
            if waiter.state != "waiting" or waiter.future.done():
                continue  # gone, or its caller cancelled and not yet resumed to say so
            waiter.state = "granted"
            self.waiting -= 1
            self.busy += 1
            waiter.future.set_result(None)
