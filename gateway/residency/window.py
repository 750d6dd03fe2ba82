"""The largest figure noted within a window of time (:class:`RecentMax`): what the
residency remembers of how much footprints rose, so that a one-off rise (a new version
measured larger than the last, a rollout's two versions measured together) keeps room
free for a while, not for good."""

from __future__ import annotations

from collections import deque

# a rise in a footprint is remembered this long (a stub grows over its first thousand or
# so requests: minutes at a few requests a second)
RISE_MEMORY_S = 600.0


class RecentMax:
    """The largest value noted within the last ``window_s`` seconds (0: none). Values
    are noted in time order; only those that could still be the largest are kept (each
    later one at least as large retires the earlier), so it holds a handful however
    many are noted."""

    def __init__(self, window_s: float = RISE_MEMORY_S) -> None:
        self.window_s = window_s
        self._kept: deque[tuple[float, int]] = deque()  # (when, value), values falling

    def note(self, value: int, at: float) -> None:
        while self._kept and self._kept[-1][1] <= value:
            self._kept.pop()
        self._kept.append((at, value))

    def value(self, now: float) -> int:
        while self._kept and now - self._kept[0][0] > self.window_s:
            self._kept.popleft()
        return self._kept[0][1] if self._kept else 0
