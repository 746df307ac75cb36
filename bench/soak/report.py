"""Tables and a plot from soak runs: ``python -m bench.soak.report RUN_DIR... --markdown
FILE --svg FILE``. Each run directory holds a history (``history/``) and the run's
``result.json``; the history is checked again, so the figures are the checker's of now.

One row per (topology, appendfsync, fault): the fault's windows in that run, the operations
invoked while it ran alone, the anomalies found then (lost, duplicated, early, double
leases: explained or not), the longest time to recover and the p99 lateness of first
deliveries then. The row ``(combined ...)`` is the time when faults of two or more kinds
overlapped; ``(none)`` the time outside every window.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from . import checker, history

NONE, COMBINED = "(none)", "(combined: 2+ kinds at once)"


@dataclass
class Run:
    name: str
    config: dict[str, Any]
    events: list[history.Event]
    report: checker.Report

    @classmethod
    def load(cls, directory: Path) -> Run:
        config = json.loads((directory / "result.json").read_text())["config"]
        events = history.load(directory / "history")
        report = checker.check(
            events, grace_s=config["grace_s"], late_bound_ms=config["late_bound_ms"],
            min_offers=int(config["duration_s"]),
        )  # fmt: skip
        return cls(directory.name, config, events, report)

    @property
    def label(self) -> tuple[str, str]:
        topology = self.config.get("topology", "standalone")
        if topology == "sentinel" and self.config.get("network"):
            topology = "sentinel, split-brain group"
        return topology, self.config["fsync"]


def rows(run: Run) -> list[dict[str, Any]]:
    r = run.report
    by_fault: dict[str, list[checker.Window]] = defaultdict(list)
    for w in r.windows:
        by_fault[w.fault].append(w)
    invokes = [e.t for e in run.events if e.type == history.INVOKE]
    out = []
    for fault in [*sorted(by_fault), COMBINED, NONE]:
        ws = by_fault.get(fault, [])

        # A fault's row covers the time it ran alone; overlaps go to the combined row.
        def inside(t: float, fault: str = fault) -> bool:
            active = {w.fault for w in r.windows if w.covers(t)}
            if fault == NONE:
                return not active
            if fault == COMBINED:
                return len(active) > 1
            return active == {fault}

        found = [a for a in r.anomalies if a.kind != "late" and inside(a.t)]
        late = [ms for t, ms in r.lateness_ms if inside(t)]
        recover = [s for w, s in r.recoveries if w.fault == fault]

        def n(kind: str, found: list[checker.Anomaly] = found) -> str:
            hits = [a for a in found if a.kind == kind]
            unexplained = sum(1 for a in hits if a.explained is None)
            return f"{len(hits)}" + (f" (**{unexplained} unexplained**)" if unexplained else "")

        out.append({
            "topology": run.label[0], "fsync": run.label[1], "fault": fault,
            "windows": len(ws) if ws else "", "operations": sum(1 for t in invokes if inside(t)),
            "lost": n("lost"), "duplicated": n("duplicate"), "early": n("early"),
            "double leases": n("double-lease"), "after cancel": n("after-cancel"),
            "dedup": n("dedup"), "outbox": n("outbox"), "stuck": n("stuck"),
            "recover s (max)": f"{max(recover):.1f}" if recover else "",
            "p99 late ms": f"{_p99(late):.0f}" if late else "",
        })  # fmt: skip
    return out


def _p99(values: Sequence[int]) -> float:
    if len(values) < 2:
        return float(values[0])
    return float(statistics.quantiles(values, n=100, method="inclusive")[98])


def markdown(runs: Sequence[Run]) -> str:
    table = [row for run in runs for row in rows(run)]
    if not table:
        return ""
    head = list(table[0])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(row[h]) for h in head) + " |" for row in table]
    return "\n".join(lines) + "\n"


def totals(runs: Sequence[Run]) -> str:
    lines = [
        "| run | duration s | operations | acknowledged offers | deliveries | lost: unexplained "
        "| lost: durable, in a failover | lost: not durable, after a server fault | duplicated "
        "| early | double leases | after cancel | dedup | outbox "
        "| p99 late ms outside / inside windows | verdict |",
        "|" + "---|" * 16,
    ]
    for run in runs:
        r = run.report
        lost = [a for a in r.anomalies if a.kind == "lost"]
        in_failover = sum(1 for a in lost if a.explained and "(durable)" in a.explained)
        lines.append(
            f"| {run.label[0]}, appendfsync {run.label[1]} | {run.config['duration_s']:.0f} "
            f"| {r.operations} | {r.offers_ok} | {r.deliveries} "
            f"| {sum(1 for a in lost if a.explained is None)} | {in_failover} "
            f"| {sum(1 for a in lost if a.explained) - in_failover} | {r.count('duplicate')} "
            f"({r.count('duplicate', explained=False)} unexplained) | {r.count('early')} "
            f"| {r.count('double-lease')} | {r.count('after-cancel')} | {r.count('dedup')} "
            f"| {r.count('outbox')} | {_ms(r.p99_outside_ms)} / {_ms(r.p99_inside_ms)} "
            f"| {'valid' if r.valid else '**invalid**'} |"
        )
    return "\n".join(lines) + "\n"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


COLOURS = {
    "consumer-kill": "#f4c7c3", "consumer-stop": "#fce8b2", "relay-kill": "#f8bbd0",
    "client-clock": "#d1c4e9", "redis-kill": "#ef9a9a", "redis-pause": "#b3e5fc",
    "redis-sleep": "#b2dfdb", "maxmemory": "#dcedc8", "server-clock": "#ffe0b2",
    "partition": "#cfd8dc", "failover": "#ffcdd2", "master-stop": "#c5cae9",
}  # fmt: skip


def _thinned(points: Sequence[tuple[float, int]], most: int) -> list[tuple[float, int]]:
    """An even sample of about ``most`` points, half of them from the late ones (50 ms or
    more), so that the plot stays small and the faults' effects stay visible."""
    late = [p for p in points if p[1] >= 50]
    rest = [p for p in points if p[1] < 50]
    half = most // 2
    return late[:: max(1, len(late) // half)] + rest[:: max(1, len(rest) // half)]


def svg(runs: Sequence[Run], width: int = 960, panel: int = 170, max_points: int = 1200) -> str:
    """Lateness (log scale) of first deliveries over time, one panel per run, each fault
    window shaded in its fault's colour."""
    import math

    left, top, gap = 60, 30, 40
    height = top + len(runs) * (panel + gap) + 60
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="18" font-size="13">Lateness of first deliveries (ms, log '
        "scale) over the run; shaded: fault windows (fault to heal)</text>",
    ]
    plot_w = width - left - 20
    for k, run in enumerate(runs):
        y0 = top + k * (panel + gap) + 15
        r = run.report
        points = r.lateness_ms
        if not points:
            continue
        t0 = min(min(t for t, _ in points), min((w.start for w in r.windows), default=1e18))
        t1 = max(t for t, _ in points)
        span = max(t1 - t0, 1.0)

        def x(t: float, t0: float = t0, span: float = span) -> float:
            return left + (t - t0) / span * plot_w

        def y(ms: float, y0: float = y0) -> float:
            return y0 + panel - math.log10(max(ms, 1)) / 5 * panel  # 1 ms .. 100 s

        parts.append(
            f'<text x="{left}" y="{y0 - 4}" font-size="12">{escape(run.label[0])}, appendfsync '
            f"{escape(run.label[1])}: {len(points)} first deliveries, "
            f"{run.config['duration_s']:.0f} s</text>"
        )
        for w in r.windows:
            parts.append(
                f'<rect x="{x(w.start):.1f}" y="{y0}" width="{max(x(w.stop) - x(w.start), 1):.1f}" '
                f'height="{panel}" fill="{COLOURS.get(w.fault, "#eeeeee")}" opacity="0.7">'
                f"<title>{escape(w.fault)} {escape(w.target)}</title></rect>"
            )
        parts.append(
            f'<rect x="{left}" y="{y0}" width="{plot_w}" height="{panel}" fill="none" '
            'stroke="#888"/>'
        )
        for decade in range(6):
            yy = y(10**decade)
            parts.append(
                f'<line x1="{left}" x2="{left + plot_w}" y1="{yy:.1f}" y2="{yy:.1f}" '
                'stroke="#ddd"/>'
                f'<text x="{left - 6}" y="{yy + 4:.1f}" text-anchor="end">{10**decade:g}</text>'
            )
        for t, ms in _thinned(points, max_points):
            parts.append(f'<circle cx="{x(t):.0f}" cy="{y(ms):.0f}" r="1.3" fill="#1a5fb4"/>')
        for sec in range(0, int(span) + 1, 60):
            parts.append(
                f'<text x="{x(t0 + sec):.1f}" y="{y0 + panel + 13}" text-anchor="middle">'
                f"{sec} s</text>"
            )
    legend_y = height - 25
    for k, (fault, colour) in enumerate(COLOURS.items()):
        lx = left + k * 75
        parts.append(
            f'<rect x="{lx}" y="{legend_y}" width="10" height="10" fill="{colour}"/>'
            f'<text x="{lx + 13}" y="{legend_y + 9}" font-size="9">{fault}</text>'
        )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.soak.report")
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--markdown", type=Path)
    p.add_argument("--svg", type=Path)
    a = p.parse_args(argv)
    runs = [Run.load(d) for d in a.runs]
    text = totals(runs) + "\n" + markdown(runs)
    if a.markdown:
        a.markdown.write_text(text)
    print(text)
    if a.svg:
        a.svg.write_text(svg(runs))


if __name__ == "__main__":
    main()
