"""Inline SVG: a timeline per fault check and a bar chart of recovery times. No scripts, no fonts.

Each timeline event gets its own row, so labels never overlap however close the times are
(a fault and its detection are often microseconds apart); the x axis is linear and honest.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from xml.sax.saxutils import escape, quoteattr

from hvconform.report.model import KINDS, CheckView, Event
from hvconform.report.words import duration

WIDTH = 720
LABEL_W = 300  # left column for event names
PLOT_X0, PLOT_X1 = LABEL_W + 10, WIDTH - 20
ROW = 24
MAX_LABEL = 44  # characters; the full name stays in the row's <title>

COLOURS = {
    "fault": "#c0392b",
    "detected": "#b9770e",
    "repaired": "#2471a3",
    "ready": "#1e8449",
    "guest": "#7d3c98",
    "info": "#707b7c",
    "failed": "#922b21",
}


def _nice_max(value: float) -> float:
    """The smallest 1/2/5 x 10^n not below value, so axis ticks land on round numbers."""
    if not math.isfinite(value) or value <= 0:
        return 1.0
    base = 10.0 ** math.floor(math.log10(value))  # a float: 1e308 must not become a huge int
    for step in (1, 2, 5, 10):
        if step * base >= value:
            return float(step * base)
    return float(10 * base)


def _ticks(top: float, n: int = 5) -> list[float]:
    return [top * i / n for i in range(n + 1)]


def _x(t: float, top: float) -> float:
    return PLOT_X0 + (PLOT_X1 - PLOT_X0) * (t / top)


def _text(x: float, y: float, text: str, *, anchor: str = "start", cls: str = "") -> str:
    klass = f' class="{cls}"' if cls else ""
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"{klass}>{escape(text)}</text>'


def _short(name: str) -> str:
    return name if len(name) <= MAX_LABEL else name[: MAX_LABEL - 1] + "…"


def tick_label(t: float, top: float) -> str:
    """One unit per axis (all ms, or all s), so ticks read as a scale: 0, 40 ms, 80 ms, ..."""
    if t == 0:
        return "0"
    if top < 1:
        return f"{round(t * 1000, 3):g} ms"
    return f"{round(t, 3):g} s"


def _axis(top: float, y: float, height: float, caption: str) -> list[str]:
    parts = []
    for tick in _ticks(top):
        x = _x(tick, top)
        parts.append(f'<line x1="{x:.1f}" y1="0" x2="{x:.1f}" y2="{y:.1f}" class="grid"/>')
        parts.append(_text(x, y + 14, tick_label(tick, top), anchor="middle", cls="tick"))
    parts.append(f'<line x1="{PLOT_X0}" y1="{y:.1f}" x2="{PLOT_X1}" y2="{y:.1f}" class="axis"/>')
    parts.append(_text(WIDTH - 20, height - 4, caption, anchor="end", cls="tick"))
    return parts


def _outages(events: Sequence[Event]) -> list[tuple[float, float]]:
    """(fault, ready again) pairs: the spans in which the node could not take a new workload."""
    spans = []
    start: float | None = None
    for event in events:
        if event.kind == "fault" and start is None:
            start = event.t_s
        elif event.kind == "ready" and start is not None:
            spans.append((start, event.t_s))
            start = None
    return spans


def _event(event: Event, y: float, top: float) -> list[str]:
    x = _x(event.t_s, top)
    colour = COLOURS.get(event.kind, COLOURS["info"])
    # The time sits beside its dot, on whichever side has room.
    right = x < (PLOT_X0 + PLOT_X1) / 2
    when = _text(
        x + (9 if right else -9), y + 4, duration(event.t_s), anchor="start" if right else "end"
    )
    return [
        f'<g class="event {event.kind}"><title>{escape(event.name)}</title>',
        _text(8, y + 4, _short(event.name), cls="label"),
        f'<circle cx="{x:.1f}" cy="{y:.1f}" r="5" fill="{colour}"/>',
        when,
        "</g>",
    ]


def timeline(check: CheckView) -> str:
    """One row per event: name on the left, a dot at its time, the time beside the dot."""
    events = list(check.timeline)
    failed = check.status == "failed"
    rows = len(events) + (1 if failed else 0)
    plot_h = rows * ROW + 8
    height = plot_h + 50
    top = _nice_max(max((e.t_s for e in events), default=0.0))
    label = f"Timeline of {check.id}: " + "; ".join(
        f"{e.name} at {duration(e.t_s)}" for e in events
    )
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" '
        f'class="timeline" role="img" aria-label={quoteattr(label)} '
        f"data-check={quoteattr(check.id)}>",
        f"<title>{escape(label)}</title>",
    ]
    for start, end in _outages(events):
        x0, x1 = _x(start, top), _x(end, top)
        span = escape("fault to ready: " + duration(end - start))
        parts.append(
            f'<rect x="{x0:.1f}" y="0" width="{max(x1 - x0, 1.0):.1f}" height="{plot_h}" '
            f'class="outage"><title>{span}</title></rect>'
        )
    parts += _axis(top, plot_h, height - 16, "time since the check started")
    ys = [4 + i * ROW + ROW / 2 for i in range(len(events))]
    if len(events) > 1:
        points = " ".join(f"{_x(e.t_s, top):.1f},{y:.1f}" for e, y in zip(events, ys, strict=True))
        parts.append(f'<polyline points="{points}" class="path"/>')
    for event, y in zip(events, ys, strict=True):
        parts += _event(event, y, top)
    if failed:
        y = 4 + len(events) * ROW + ROW / 2
        reason = check.wait.awaited if check.wait else check.reason_words
        parts.append(_text(8, y + 4, _short("failed: " + reason), cls="label failed"))
        parts.append(
            f'<text x="{PLOT_X1:.1f}" y="{y + 5:.1f}" text-anchor="middle" '
            f'fill="{COLOURS["failed"]}" class="cross">✕</text>'
        )
    parts.append("</svg>")
    return "\n".join(parts)


def legend() -> str:
    """A small key for the event colours, shared by every timeline."""
    items = []
    for i, kind in enumerate(KINDS):
        x = 10 + i * 118
        items.append(f'<circle cx="{x}" cy="12" r="5" fill="{COLOURS[kind]}"/>')
        items.append(_text(x + 9, 16, kind))
    items.append(f'<rect x="{10 + len(KINDS) * 118}" y="5" width="14" height="14" class="outage"/>')
    items.append(_text(30 + len(KINDS) * 118, 16, "fault to ready"))
    total = 150 + len(KINDS) * 118
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {total} 24" class="legend" '
        f'role="img" aria-label="timeline colours">' + "".join(items) + "</svg>"
    )


def recovery_chart(checks: Sequence[CheckView], metric: str = "recovery_s") -> str:
    """Horizontal bars, one per check that measured the metric, with the value in words."""
    bars = [
        (c.id, float(v))
        for c in checks
        if isinstance(v := c.metrics.get(metric), int | float) and not isinstance(v, bool)
    ]
    if not bars:
        return ""
    top = _nice_max(max(v for _, v in bars))
    height = len(bars) * ROW + 58
    plot_h = len(bars) * ROW + 8
    label = f"{metric} per check: " + "; ".join(f"{i} {duration(v)}" for i, v in bars)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" class="chart" '
        f'role="img" aria-label={quoteattr(label)}>',
        f"<title>{escape(label)}</title>",
    ]
    parts += _axis(top, plot_h, height - 16, f"{metric}: time until ready again")
    for i, (check_id, seconds) in enumerate(bars):
        y = 4 + i * ROW
        # A bar is never thinner than 2 units: a microsecond recovery must still be visible.
        w = max(_x(seconds, top) - PLOT_X0, 2.0)
        parts.append(_text(LABEL_W, y + ROW / 2 + 4, check_id, anchor="end", cls="label"))
        parts.append(
            f'<rect x="{PLOT_X0}" y="{y + 4}" width="{w:.1f}" height="{ROW - 8}" class="bar">'
            f"<title>{escape(f'{check_id}: {duration(seconds)}')}</title></rect>"
        )
        right = PLOT_X0 + w + 6
        anchor, x = ("start", right) if right < PLOT_X1 - 60 else ("end", PLOT_X0 + w - 6)
        parts.append(
            _text(
                x,
                y + ROW / 2 + 4,
                duration(seconds),
                anchor=anchor,
                cls="value" if anchor == "start" else "value inside",
            )
        )
    parts.append("</svg>")
    return "\n".join(parts)
