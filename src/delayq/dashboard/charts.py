"""Line charts as inline SVG, rendered on the server (no JavaScript, no CDN)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape

from .series import Bin

WIDTH, HEIGHT = 560, 170
LEFT, RIGHT, TOP, BOTTOM = 48, 10, 12, 24


@dataclass(frozen=True, slots=True)
class Line:
    label: str
    css: str  # class of the line: s1 (blue), s2 (orange)
    values: Sequence[float | None]


def nice_max(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten that is >= ``value`` (at least 1)."""
    if value <= 1:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if step * power >= value:
            return float(step * power)
    return float(10 * power)  # pragma: no cover


def _fmt(value: float) -> str:
    if value >= 100 or value == int(value):
        return f"{value:,.0f}"
    return f"{value:.3g}"


def line_chart(title: str, unit: str, lines: Sequence[Line], window_min: float) -> Markup:
    """A chart of equally spaced points over the last ``window_min`` minutes; None values
    (no data) break the line."""
    n = max((len(line.values) for line in lines), default=0)
    finite = [v for line in lines for v in line.values if v is not None]
    top = nice_max(max(finite, default=0.0))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(i: int) -> float:
        return LEFT + (plot_w * (i + 0.5) / n if n else 0)

    def y(v: float) -> float:
        return TOP + plot_h * (1 - v / top)

    parts = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(title)}</title>",
    ]
    for k in range(3):
        tick = top * k / 2
        parts.append(
            f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(tick):.1f}" '
            f'y2="{y(tick):.1f}"/><text class="axis" x="{LEFT - 4}" y="{y(tick) + 4:.1f}" '
            f'text-anchor="end">{_fmt(tick)}</text>'
        )
    for frac in (0.0, 0.25, 0.5, 0.75, 1.0):
        minutes = window_min * (1 - frac)
        label = "now" if minutes == 0 else f"-{minutes:g}m"
        anchor = "start" if frac == 0 else "end" if frac == 1 else "middle"
        parts.append(
            f'<text class="axis" x="{LEFT + plot_w * frac:.1f}" y="{HEIGHT - 6}" '
            f'text-anchor="{anchor}">{label}</text>'
        )
    for line in lines:
        segment: list[str] = []
        segments = []
        for i, v in enumerate(line.values):
            if v is None:
                if segment:
                    segments.append(segment)
                segment = []
            else:
                segment.append(f"{x(i):.1f},{y(v):.1f}")
        if segment:
            segments.append(segment)
        for seg in segments:
            if len(seg) == 1:
                cx, cy = seg[0].split(",")
                parts.append(f'<circle class="{line.css}" cx="{cx}" cy="{cy}" r="2"/>')
            else:
                parts.append(f'<polyline class="{line.css}" points="{" ".join(seg)}"/>')
    legend_x = LEFT + 6
    for line in lines:
        last = next((v for v in reversed(line.values) if v is not None), None)
        shown = "no data" if last is None else f"{_fmt(last)} {unit}"
        parts.append(
            f'<text class="legend {line.css}" x="{legend_x}" y="{TOP + 10}">'
            f"{escape(line.label)}: {escape(shown)}</text>"
        )
        legend_x += 170
    if not finite:
        parts.append(
            f'<text class="empty" x="{LEFT + plot_w / 2}" y="{TOP + plot_h / 2}" '
            'text-anchor="middle">no data yet: history starts when the dashboard starts</text>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))


def throughput_chart(bins: Sequence[Bin], window_min: float) -> Markup:
    return line_chart(
        "Throughput (tasks per minute)",
        "/min",
        [
            Line("delivered", "s1", [b.per_minute(b.delivered) for b in bins]),
            Line("acked", "s2", [b.per_minute(b.acked) for b in bins]),
        ],
        window_min,
    )


def lateness_chart(bins: Sequence[Bin], window_min: float) -> Markup:
    return line_chart(
        "Lateness of deliveries (ms after due time)",
        "ms",
        [
            Line("p50", "s1", [b.quantile_ms(0.5) for b in bins]),
            Line("p99", "s2", [b.quantile_ms(0.99) for b in bins]),
        ],
        window_min,
    )
