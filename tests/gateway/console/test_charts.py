"""Sparklines: drawn from the right as history grows, gaps kept, text escaped."""

from __future__ import annotations

import re

from gateway.console.charts import Series, sparkline


def test_sparkline_puts_the_newest_point_at_the_right_edge_and_breaks_on_gaps() -> None:
    svg = sparkline([Series("rate", [1.0, None, 2.0, 4.0])], "m rate", "/s", slots=10,
                    width=101)
    (line,) = re.findall(r'points="([^"]+)"', svg)
    xs = [float(p.split(",")[0]) for p in line.split()]
    assert xs[-1] == 100.0 and len(xs) == 2  # the two points after the gap
    assert '<circle r="2"' in svg  # the lone point before the gap
    assert "rate now 4.00/s" in svg and "4.00/s</span>" in svg


def test_sparkline_escapes_its_labels_and_says_when_there_is_no_data() -> None:
    svg = sparkline([Series("p50", []), Series("p99", [None])], '<b>"x"</b> latency')
    assert "<b>" not in svg and "&lt;b&gt;" in svg
    assert "p50 now unknown" in svg and "p50 –" in svg
