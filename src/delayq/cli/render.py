"""Output: exact JSON for scripts, tables (or plain lines when piped) for people.

Everything shown comes from Redis, where another producer (or an attacker) may have written
it: queue and counter names, ids, keys, headers, payloads, error texts. In a table it goes
into a :class:`rich.text.Text`, which rich never parses for markup (no ``[link=...]``, no
``MarkupError`` on ``[/]``, no ``:emoji:`` codes), after :func:`~delayq._core.text.printable`
has escaped every control, bidi and lone surrogate character. JSON is written with ASCII
escapes only (``\\u001b``), so it is exact and still cannot drive a terminal.

Payloads are walked without recursion: a payload nested a thousand deep is valid, and must
print, not raise ``RecursionError``.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import sys
import textwrap
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from enum import Enum
from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from .._core.errors_text import error_summary
from .._core.history import HistoryEvent
from .._core.models import DeadTask, Stats, TaskInfo
from .._core.text import printable
from .._core.timing import format_duration

# -- JSON ------------------------------------------------------------------------------------


class _Token(str):
    """Literal JSON text on the walk's stack (punctuation), as opposed to a value to encode."""

    __slots__ = ()


def _plain(value: Any) -> Any:
    """``value`` one step closer to JSON types: datetimes as ISO 8601, bytes as base64,
    enums as their values, dataclasses and pydantic models as dicts; other unknown types as
    their repr. Containers are returned as they are (the walk goes into them)."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return {"base64": base64.b64encode(bytes(value)).decode()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    dump = getattr(value, "model_dump", None)  # pydantic payloads
    if callable(dump) and not isinstance(value, Mapping):
        return dump(mode="json")
    return value


def json_tokens(value: Any, *, ascii_only: bool = True) -> Iterator[str]:
    """The JSON text of ``value`` in pieces, as ``json.dumps`` writes it (same separators;
    non-string keys as ``str()``), walked with a stack instead of recursion."""
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if type(item) is _Token:
            yield item
            continue
        item = _plain(item)
        if item is None or isinstance(item, bool | int | float | str):
            yield json.dumps(item, ensure_ascii=ascii_only)
        elif isinstance(item, Mapping):
            pending: list[Any] = [_Token("}")]
            entries = list(item.items())
            for n, (key, entry) in reversed(list(enumerate(entries))):
                name = _key(key)
                pending.append(entry)
                pending.append(_Token(("" if n == 0 else ", ") + _dumps_str(name, ascii_only)))
            pending.append(_Token("{"))
            stack.extend(pending)
        elif isinstance(item, Sequence | set | frozenset):
            elements = list(item)
            pending = [_Token("]")]
            for n in range(len(elements) - 1, -1, -1):
                pending.append(elements[n])
                if n:
                    pending.append(_Token(", "))
            pending.append(_Token("["))
            stack.extend(pending)
        else:
            yield json.dumps(repr(item), ensure_ascii=ascii_only)


def _key(key: Any) -> str:
    """A mapping key as a JSON object name (msgpack maps may have int or bytes keys)."""
    if isinstance(key, str):
        return key
    if isinstance(key, bytes | bytearray):
        return bytes(key).decode("utf-8", errors="backslashreplace")
    if isinstance(key, Enum):
        return str(key.value)
    return str(key)


def _jsonable(value: Any) -> Any:
    """``value`` as plain JSON types, recursively (the fast path of :func:`to_json`)."""
    value = _plain(value)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Mapping):
        return {_key(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, Sequence | set | frozenset):
        return [_jsonable(v) for v in value]
    return repr(value)


def _dumps_str(name: str, ascii_only: bool) -> str:
    return json.dumps(name, ensure_ascii=ascii_only) + ": "


def to_json(value: Any) -> str:
    """``value`` as one line of JSON, ASCII only."""
    try:  # recursion in C: three times faster on a page of 10,000 tasks
        return json.dumps(_jsonable(value))
    except RecursionError:  # a payload nested too deep for it: the same text, by the walk
        return "".join(json_tokens(value))


def print_json(value: Any) -> None:
    sys.stdout.write(to_json(value) + "\n")
    sys.stdout.flush()


def stats_json(stats: Stats) -> dict[str, Any]:
    doc = {f.name: getattr(stats, f.name) for f in dataclasses.fields(stats)}
    doc["total"] = stats.total
    return doc


def preview(value: Any, width: int = 60) -> str:
    """A payload as one line of JSON, safe to show, cut to ``width`` characters; only as
    much of the payload is walked as fits."""
    parts: list[str] = []
    size = 0
    for token in json_tokens(value, ascii_only=False):
        parts.append(token)
        size += len(token)
        if size > width:
            break
    text = printable("".join(parts))
    return text if len(text) <= width else text[: width - 1] + "…"


# -- times -----------------------------------------------------------------------------------


def relative(moment: datetime | None) -> str:
    """``in 5m03s`` or ``4.2s ago``, by this machine's clock."""
    if moment is None:
        return "-"
    delta = moment.timestamp() - time.time()
    return f"in {format_duration(delta)}" if delta >= 0 else f"{format_duration(delta)} ago"


def when(moment: datetime | None) -> str:
    """``2030-01-31 08:30:00Z (in 5m03s)``."""
    if moment is None:
        return "-"
    return f"{moment.strftime('%Y-%m-%d %H:%M:%S')}Z ({relative(moment)})"


# -- tables ----------------------------------------------------------------------------------


# Tables for 80 columns: a rule under the header, no vertical borders, two spaces between columns.
COMPACT: dict[str, Any] = {"box": box.SIMPLE_HEAD, "padding": (0, 1, 0, 0), "pad_edge": False}


def one_line(value: object) -> Text:
    """A cell cut to one line with an ellipsis, however narrow its column gets."""
    text = safe(value)
    text.no_wrap, text.overflow = True, "ellipsis"
    return text


def safe(value: object, *, keep_newlines: bool = False, style: str = "") -> Text:
    """Text from Redis as a table cell: escaped of controls, never parsed for markup."""
    return Text(printable(value, keep_newlines=keep_newlines), style=style)


def _counters(stats: Stats) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(stats.counters.items())) or "-"


def paused_label(stats: Stats) -> str:
    """'' for a queue handing out, else ' [paused]' or ' [paused until <time>Z]'."""
    if not stats.paused:
        return ""
    if stats.paused_until is None:
        return " [paused]"
    return f" [paused until {stats.paused_until.strftime('%Y-%m-%d %H:%M:%S')}Z]"


def _count(n: int, style: str) -> Text:
    return Text(str(n), style=style if n else "")


def with_shards(rows: Sequence[Stats]) -> list[Stats]:
    """Each queue's row, then its shards' rows (a sharded queue's breakdown) named
    ``<queue>  shard <i>: <sub-queue>``."""
    out = []
    for row in rows:
        out.append(row)
        out += [
            dataclasses.replace(part, queue=f"{row.queue}  shard {i}: {part.queue}")
            for i, part in enumerate(row.shards)
        ]
    return out


def stats_table(rows: Sequence[Stats], title: str | None = None, width: int = 200) -> Group:
    """The counts table; lifetime counters go in it on wide screens, else in a second one.
    A queue name is never cut: at worst it folds onto a second line."""
    wide = width >= 130
    table = Table(title=safe(title) if title else None, **COMPACT)
    # The name column may fold, never end in an ellipsis (two queues must not look alike);
    # it takes whatever width the numbers leave.
    table.add_column("queue", overflow="fold", min_width=16, ratio=1)
    for name in ("delayed", "ready", "inflight", "expired", "dead", "overdue", "oldest due",
                 "next due"):  # fmt: skip
        table.add_column(name, justify="right")
    counters = Table(show_edge=False, box=None)
    counters.add_column("queue", style="bold", overflow="fold")
    counters.add_column("lifetime counters", overflow="fold")
    if wide:
        table.add_column("counters", overflow="fold")
    for s in with_shards(rows):
        cells: list[Text | str] = [
            safe(s.queue) + Text(paused_label(s), style="yellow"),
            str(s.delayed),
            str(s.ready),
            str(s.inflight),
            _count(s.expired, "yellow"),  # leases no consumer came back for
            _count(s.dead, "red"),
            _count(s.overdue, "yellow"),
            format_duration(s.oldest_overdue_age) if s.oldest_overdue_age > 0 else "-",
            relative(s.next_due_at),
        ]
        counts = safe(_counters(s))
        table.add_row(*cells, *([counts] if wide else []))
        counters.add_row(safe(s.queue), counts)
    return Group(table) if wide else Group(table, counters)


STATS_COLUMNS = ("queue", "delayed", "ready", "inflight", "expired", "dead", "overdue",
                 "oldest-due", "next-due", "counters")  # fmt: skip


def stats_lines(rows: Sequence[Stats]) -> list[str]:
    """The stats as plain aligned lines, for a pipe: a header, then one line per queue, never
    cut (``delayq stats | grep orders`` finds the queue)."""
    table = [list(STATS_COLUMNS)]
    for s in with_shards(rows):
        table.append(
            [
                printable(s.queue) + paused_label(s),
                str(s.delayed),
                str(s.ready),
                str(s.inflight),
                str(s.expired),
                str(s.dead),
                str(s.overdue),
                format_duration(s.oldest_overdue_age) if s.oldest_overdue_age > 0 else "-",
                relative(s.next_due_at),
                printable(_counters(s)),
            ]
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(STATS_COLUMNS) - 1)]
    lines = []
    for row in table:
        cells = [cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in
                 enumerate(zip(row, widths, strict=False))]  # fmt: skip
        lines.append("  ".join([*cells, row[-1]]))
    return lines


def _time_of(task: TaskInfo) -> datetime | None:
    return task.due_at or task.lease_expires_at or task.dead_at


def tasks_table(tasks: Sequence[TaskInfo], title: str, width: int = 80) -> Table:
    """Tasks, two lines each at most: an id keeps one line (it is copied into ``delayq
    get``; up to 40 characters), the time breaks before its "(in 5m)" below 120 columns,
    payload and error are cut to one line (``delayq get`` shows them whole)."""
    id_width = min(max((len(printable(t.id)) for t in tasks), default=2), 40)
    two_lines = width < 120
    table = Table(title=safe(title), **COMPACT)
    # rich narrows only the columns that may wrap: id, state, time and the numbers may not.
    table.add_column("id", no_wrap=True, overflow="fold", min_width=id_width)
    table.add_column("state", no_wrap=True)
    table.add_column("due / lease / died", no_wrap=True)
    table.add_column("tries", justify="right", no_wrap=True)
    table.add_column("pri", justify="right", no_wrap=True)
    table.add_column("key", overflow="fold")
    table.add_column("payload", ratio=2)
    table.add_column("last error", ratio=1)
    for t in tasks:
        moment = when(_time_of(t))
        table.add_row(
            safe(t.id),
            t.state.value,
            moment.replace("Z (", "Z\n(") if two_lines else moment,
            str(t.attempts),
            str(t.priority),
            safe(t.key or "-"),
            one_line(preview(t.payload)),
            one_line(error_summary(t.last_error, 200) or "-"),
        )
    return table


def task_table(task: TaskInfo) -> Table:
    """One task, every field; the last error in full (a traceback keeps its lines)."""
    table = Table(show_header=False, title=safe(f"task {task.id}"))
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    headers = ", ".join(f"{k}={v}" for k, v in task.headers.items()) or "-"
    rows: list[tuple[str, Text]] = [
        ("id", safe(task.id)),
        ("state", safe(task.state.value)),
        ("attempts", safe(task.attempts)),
        ("priority", safe(task.priority)),
        ("key", safe(task.key or "-")),
        ("headers", safe(headers)),
    ]
    for label, moment in (
        ("due", task.due_at),
        ("lease expires", task.lease_expires_at),
        ("died", task.dead_at),
        ("ttl deadline", task.expires_at),
        ("ended", task.ended_at),
    ):
        if moment:
            rows.append((label, safe(when(moment))))
    if task.ended_at is not None:  # [H] known from its history: the payload went with it
        rows.append(("how", safe(task.outcome or "-")))
        rows.append(("payload", safe("- (not kept after the end; see: delayq history ID)")))
    else:
        rows.append(("last error", safe(task.last_error or "-", keep_newlines=True)))
        rows.append(("payload", safe(preview(task.payload, 2000))))
    for name, value in rows:
        table.add_row(name, value)
    return table


def history_table(events: Sequence[HistoryEvent], title: str) -> Table:
    """[H] A task's history as a timeline: when (UTC, Redis's clock), how long after the
    first event, what, on which attempt, and the detail (by whom, why, when due)."""
    table = Table(title=safe(title), **COMPACT)
    table.add_column("at (UTC)", no_wrap=True)
    table.add_column("after", no_wrap=True, justify="right")
    table.add_column("event", no_wrap=True)
    table.add_column("try", justify="right")
    table.add_column("detail", overflow="fold")
    first = events[0].at if events else None
    for event in events:
        since = (event.at - first).total_seconds() if first is not None else 0.0
        table.add_row(
            event.at.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3],
            f"+{format_duration(since)}" if since > 0 else "",
            safe(event.kind),
            str(event.attempt) if event.attempt else "",
            safe(event.detail),
        )
    return table


def dead_table(tasks: Sequence[DeadTask], title: str, width: int = 80) -> Table:
    """Dead letters, at most two lines each: the error's last line (type and message, cut to
    two lines of its column), not its traceback (``delayq get`` shows that)."""
    id_width = min(max(len(printable(t.id)) for t in tasks), 24)
    # Beside id, "died" (9), tries (5) and the gaps, two thirds for the error, the rest for
    # the payload: every column a fixed width, so that nothing wraps beyond two lines.
    room = max(width - 1 - id_width - 9 - 5 - 2 * 5, 24)
    error_width = room * 2 // 3
    table = Table(title=safe(title), **COMPACT)
    table.add_column("id", overflow="fold", width=id_width)
    table.add_column("died", no_wrap=True, justify="right", width=9)
    table.add_column("tries", justify="right", width=5)
    table.add_column("error", no_wrap=True, width=error_width)
    table.add_column("payload", no_wrap=True, overflow="ellipsis", width=room - error_width)
    for t in tasks:
        summary = printable(error_summary(t.error) or "-")
        lines = textwrap.wrap(summary, error_width, max_lines=2, placeholder=" …") or ["-"]
        table.add_row(
            safe(t.id),
            relative(t.dead_at),
            str(t.attempts),
            Text("\n".join(lines)),
            safe(preview(t.payload)),
        )
    return table
