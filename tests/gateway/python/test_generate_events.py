"""Counting server-sent events in a byte stream cut anywhere (pure)."""

from __future__ import annotations

import pytest

from gateway.python.generate import EventCounter

STREAM = b'data: {"a":1}\n\ndata: {"b":2}\n\ndata: {"error":"x"}\n\n'


@pytest.mark.parametrize("size", [1, 2, 3, 7, 15, 16, len(STREAM)])
def test_event_counter_counts_each_event_once_when_chunks_cut_anywhere(size: int) -> None:
    counter = EventCounter()
    found = [counter.feed(STREAM[i:i + size]) for i in range(0, len(STREAM), size)]
    assert counter.events == sum(found) == 3


def test_event_counter_counts_nothing_when_event_unfinished() -> None:
    counter = EventCounter()
    assert counter.feed(b'data: {"a":1}\n') == 0
    assert counter.feed(b"\n") == 1
