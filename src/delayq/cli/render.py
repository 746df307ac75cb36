"""Output: JSON for scripts, rich tables for people."""

from __future__ import annotations

import base64
import dataclasses
import json
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from enum import Enum
from typing import Any

from rich.console import Group
from rich.markup import escape
from rich.table import Table

from .._core.models import DeadTask, Stats, TaskInfo


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON types (datetimes as ISO 8601, bytes as base64)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value.value if isinstance(value, Enum) else value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes | bytearray):
        return {"base64": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, Enum):
        return jsonable(value.value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, Sequence | set | frozenset):
        return [jsonable(v) for v in value]
    dump = getattr(value, "model_dump", None)  # pydantic payloads
    if callable(dump):
        return jsonable(dump(mode="json"))
    return repr(value)


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(jsonable(value)) + "\n")
    sys.stdout.flush()


def stats_json(stats: Stats) -> dict[str, Any]:
    doc: dict[str, Any] = jsonable(stats)
    doc["total"] = stats.total
    return doc


def span(seconds: float) -> str:
    """A short human duration: 250ms, 4.2s, 5m03s, 2h05m, 3d04h."""
    seconds = abs(seconds)
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def relative(moment: datetime | None) -> str:
    """``in 5m03s`` or ``4.2s ago``, by this machine's clock."""
    if moment is None:
        return "-"
    delta = moment.timestamp() - time.time()
    return f"in {span(delta)}" if delta >= 0 else f"{span(delta)} ago"


def when(moment: datetime | None) -> str:
    """``2030-01-31 08:30:00Z (in 5m03s)``."""
    if moment is None:
        return "-"
    return f"{moment.strftime('%Y-%m-%d %H:%M:%S')}Z ({relative(moment)})"


def short(value: Any, width: int = 60) -> str:
    """A payload as one line of JSON, cut to ``width`` characters."""
    try:
        text = json.dumps(jsonable(value), ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def stats_table(rows: Sequence[Stats], title: str | None = None, width: int = 200) -> Group:
    """The counts table; lifetime counters go in it on wide screens, else in a second one."""
    wide = width >= 130
    table = Table(title=title)
    for name in ("queue", "delayed", "ready", "in-flight", "dead", "overdue"):
        table.add_column(name, justify="left" if name == "queue" else "right")
    table.add_column("oldest overdue", justify="right")
    table.add_column("next due", justify="right")
    counters = Table(show_edge=False, box=None)
    counters.add_column("queue", style="bold")
    counters.add_column("lifetime counters")
    if wide:
        table.add_column("counters")
    for s in rows:
        cells = [
            escape(s.queue),
            str(s.delayed),
            str(s.ready),
            str(s.inflight),
            f"[red]{s.dead}[/]" if s.dead else "0",
            f"[yellow]{s.overdue}[/]" if s.overdue else "0",
            span(s.oldest_overdue_age) if s.oldest_overdue_age > 0 else "-",
            relative(s.next_due_at),
        ]
        counts = ", ".join(f"{k}={v}" for k, v in sorted(s.counters.items())) or "-"
        table.add_row(*cells, *([counts] if wide else []))
        counters.add_row(escape(s.queue), counts)
    return Group(table) if wide else Group(table, counters)


def _time_of(task: TaskInfo) -> datetime | None:
    return task.due_at or task.lease_expires_at or task.dead_at


TIME_LABEL = {"delayed": "due", "ready": "due", "inflight": "lease expires", "dead": "died"}


def tasks_table(tasks: Sequence[TaskInfo], title: str) -> Table:
    table = Table(title=title)
    table.add_column("id", no_wrap=True)
    table.add_column("state")
    table.add_column("time (due / lease / died)")
    table.add_column("tries", justify="right")
    table.add_column("pri", justify="right")
    table.add_column("key")
    table.add_column("payload")
    table.add_column("last error")
    for t in tasks:
        table.add_row(
            escape(t.id),
            t.state.value,
            when(_time_of(t)),
            str(t.attempts),
            str(t.priority),
            escape(t.key or "-"),
            escape(short(t.payload)),
            escape(t.last_error or "-"),
        )
    return table


def task_table(task: TaskInfo) -> Table:
    table = Table(show_header=False, title=f"task {escape(task.id)}")
    table.add_column("field", style="bold")
    table.add_column("value")
    rows: list[tuple[str, str]] = [
        ("id", task.id),
        ("state", task.state.value),
        ("attempts", str(task.attempts)),
        ("priority", str(task.priority)),
        ("key", task.key or "-"),
        ("headers", ", ".join(f"{k}={v}" for k, v in task.headers.items()) or "-"),
    ]
    if task.due_at:
        rows.append(("due", when(task.due_at)))
    if task.lease_expires_at:
        rows.append(("lease expires", when(task.lease_expires_at)))
    if task.dead_at:
        rows.append(("died", when(task.dead_at)))
    if task.expires_at:
        rows.append(("ttl deadline", when(task.expires_at)))
    rows.append(("last error", task.last_error or "-"))
    rows.append(("payload", short(task.payload, 2000)))
    for name, value in rows:
        table.add_row(name, escape(value))
    return table


def dead_table(tasks: Sequence[DeadTask], title: str) -> Table:
    table = Table(title=title)
    table.add_column("id", no_wrap=True)
    table.add_column("died")
    table.add_column("tries", justify="right")
    table.add_column("error")
    table.add_column("payload")
    for t in tasks:
        table.add_row(
            escape(t.id),
            when(t.dead_at),
            str(t.attempts),
            escape(t.error or "-"),
            escape(short(t.payload)),
        )
    return table
