"""Small inline SVG charts for the console, drawn on the server (no JavaScript).

Every number is formatted here and every text goes through XML escaping, so the markup
returned is safe to place in a page as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from xml.sax.saxutils import escape, quoteattr

BLUE, ORANGE = "#2f6db5", "#c05f00"  # the stylesheet's .s0 and .s1


@dataclass(frozen=True)
class Series:
    label: str
    values: Sequence[float | None]  # oldest first; None breaks the line
    colour: str = BLUE


def sparkline(series: Sequence[Series], title: str, unit: str = "", scale: float = 1.0,
              slots: int = 0, width: int = 150, height: int = 34) -> str:
    """The series on one small chart from 0 to their largest value, with each series'
    latest value written beside it (``scale`` multiplies values for display). ``slots``:
    the points a full chart holds; the newest point is always at the right edge, so a
    short history fills the right of the chart, as time would."""
    known = [v for s in series for v in s.values if v is not None]
    top = max(known, default=0.0) or 1.0
    slots = max(slots, *(len(s.values) for s in series), 2)
    marks, latest = [], []
    for i, s in enumerate(series):
        marks += _line(s, top, width, height, slots)
        now = _last(s.values)
        text = "–" if now is None else f"{_fmt(now * scale)}{unit}"
        name = f"{s.label} " if len(series) > 1 else ""
        latest.append(f'<span class="spark-value s{i}">{escape(name + text)}</span>')
    points = max((len(s.values) for s in series), default=0)
    said = "; ".join(f"{s.label} now {_said(_last(s.values), scale, unit)}" for s in series)
    label = f"{title}: {said}; the chart's top is {_fmt(top * scale)}{unit}, {points} points"
    return (f'<span class="spark"><svg role="img" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" aria-label={quoteattr(label)}>'
            f"<title>{escape(label)}</title>"
            f'<line x1="0" y1="{height - 1}" x2="{width}" y2="{height - 1}" stroke="#bbb"/>'
            f"{''.join(marks)}</svg>{''.join(latest)}</span>")


def _line(series: Series, top: float, width: int, height: int, slots: int) -> list[str]:
    step = (width - 2) / (slots - 1)
    first = slots - len(series.values)  # the slot of the oldest value
    runs: list[list[tuple[float, float]]] = [[]]
    for i, value in enumerate(series.values):
        if value is None:
            runs.append([])
            continue
        runs[-1].append((1 + (first + i) * step, height - 2 - (height - 4) * value / top))
    marks = []
    for run in runs:
        if len(run) == 1:
            marks.append(f'<circle r="2" fill="{series.colour}" '
                         f'cx="{run[0][0]:.1f}" cy="{run[0][1]:.1f}"/>')
        elif run:
            points = " ".join(f"{x:.1f},{y:.1f}" for x, y in run)
            marks.append(f'<polyline fill="none" stroke="{series.colour}" '
                         f'stroke-width="1.5" points="{points}"/>')
    return marks


def _said(value: float | None, scale: float, unit: str) -> str:
    return "unknown" if value is None else f"{_fmt(value * scale)}{unit}"


def _last(values: Sequence[float | None]) -> float | None:
    return next((v for v in reversed(values) if v is not None), None)


def _fmt(value: float) -> str:
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def size_text(n: float) -> str:
    """Bytes in the largest binary unit that keeps the figure at least 1."""
    value = float(n)
    for unit in ("B", "KiB", "MiB"):
        if abs(value) < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def memory_bar(used: int, usable: int, budget: int, title: str, width: int = 200,
               height: int = 14) -> str:
    """A member's memory as one bar the width of its budget: the part in use (red once
    past what is usable), the headroom at the right end (grey: kept free), and a mark
    where usable ends; the figures written beside it.

    The frame is a stroke drawn inside the picture, edge to edge, and the picture may
    stretch but never letterbox (``preserveAspectRatio="none"``): a CSS border around
    the SVG would shrink its drawing uniformly and centre it, and a bar 98 % full would
    then look 84 % full. So the fill and the mark are exact fractions of the width."""
    top = max(budget, usable, used, 1)
    x_usable = width * usable / top
    over = used > usable
    fill = "#c62828" if over else "#2e7d32"
    said = (f"{size_text(used)} used of {size_text(usable)} usable "
            f"({used / usable:.0%})" if usable else f"{size_text(used)} used")
    said += f", budget {size_text(budget)}"
    label = f"{title}: {said}"
    mark = min(max(x_usable, 0.75), width - 0.75)  # the whole stroke inside the picture
    return (f'<span class="membar"><svg role="img" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" preserveAspectRatio="none" '
            f"aria-label={quoteattr(label)}>"
            f"<title>{escape(label)}</title>"
            f'<rect class="track" x="0" y="0" width="{width}" height="{height}" '
            f'fill="#f1f3f5"/>'
            f'<rect class="headroom" x="{x_usable:.1f}" y="0" '
            f'width="{max(width - x_usable, 0):.1f}" height="{height}" fill="#cfd4d9"/>'
            f'<rect class="used" x="0" y="0" width="{width * min(used, top) / top:.1f}" '
            f'height="{height}" fill="{fill}"/>'
            f'<rect class="frame" x="0.5" y="0.5" width="{width - 1}" height="{height - 1}" '
            f'fill="none" stroke="#b8c0ca"/>'
            f'<line class="usable" x1="{mark:.1f}" y1="0" x2="{mark:.1f}" y2="{height}" '
            f'stroke="#333" stroke-width="1.5"/></svg>'
            f'<span class="membar-value{" over" if over else ""}">{escape(said)}</span></span>')
