"""Formatting for the templates, and the actions the dashboard can take on a queue."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote

from .. import AsyncDelayQueue
from .._core.text import printable
from .._core.timing import format_duration, parse_duration
from .._core.urls import mask_secrets


def parse_delay(text: str) -> float:
    """Seconds from ``90``, ``30s``, ``5m``, ``1h30m``, ``250ms`` or ``2d``; ValueError else."""
    return parse_duration(text, "delay")


def duration(seconds: float | None) -> str:
    """``1h 02m``, ``3m 05s``, ``4.2s``, ``15ms``."""
    return "-" if seconds is None else format_duration(seconds, sep=" ")


def relative(when: datetime | None, now: datetime) -> str:
    """``in 5m 03s`` or ``2.1s ago`` against the server's clock."""
    if when is None:
        return "-"
    delta = (when - now).total_seconds()
    return f"in {duration(delta)}" if delta > 0 else f"{duration(delta)} ago"


def ago(when: datetime | None, now: datetime) -> str:
    """``in 3m``, ``5s ago``, ``now``: how a person reads a time at a glance (the exact time
    goes in the element's title)."""
    if when is None:
        return "-"
    delta = (when - now).total_seconds()
    if abs(delta) < 1:
        return "now"
    glance = format_duration(delta, sep=" ", coarse=True)
    return f"in {glance}" if delta > 0 else f"{glance} ago"


def iso(when: datetime | None) -> str:
    return "-" if when is None else when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def exact(when: datetime | None) -> str:
    """``2026-12-01 10:05:03.123 UTC`` (for a title: the exact time on hover)."""
    return "-" if when is None else when.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


# A payload is shown to this depth and this size; a deeper or bigger one says it was cut.
# Encoding is recursive, and the page is rendered deep inside a server's stack: a payload
# nested 950 deep (offer accepts it) must not raise RecursionError there.
PRETTY_DEPTH = 40
PRETTY_CHARS = 200_000
_CUT = "…"


def _clip(value: Any, depth: int) -> Any:
    """``value`` with containers below ``depth`` levels replaced by a marker."""
    if isinstance(value, dict | list | tuple) and depth <= 0:
        return f"{_CUT} ({type(value).__name__} nested deeper than {PRETTY_DEPTH} levels)"
    if isinstance(value, dict):
        return {_key(k): _clip(v, depth - 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clip(v, depth - 1) for v in value]
    return value


def _key(key: Any) -> str:
    return key if isinstance(key, str) else repr(key)  # msgpack maps may have any keys


def _dumps(payload: Any, indent: int | None) -> str:
    if isinstance(payload, bytes | bytearray | memoryview):
        return repr(bytes(payload))
    try:
        return json.dumps(
            _clip(payload, PRETTY_DEPTH), indent=indent, ensure_ascii=False, sort_keys=True,
            default=repr, separators=None if indent else (", ", ": "),
        )  # fmt: skip
    except (TypeError, ValueError, RecursionError):
        return repr(payload)


def pretty(payload: Any) -> str:
    """The payload as indented JSON (bytes and other objects as their repr), cut at
    :data:`PRETTY_DEPTH` levels and :data:`PRETTY_CHARS` characters, with control, bidi and
    lone surrogate characters escaped."""
    text = _dumps(payload, 2)
    if len(text) > PRETTY_CHARS:
        text = f"{text[:PRETTY_CHARS]}\n{_CUT} (cut: {len(text):,} characters in all)"
    return printable(text, keep_newlines=True)


def preview(payload: Any, limit: int = 120) -> str:
    text = printable(_dumps(payload, None)[: limit * 4])
    return text if len(text) <= limit else text[: limit - 1] + _CUT


def text(value: object, limit: int = 1000) -> str:
    """Any value from Redis as one safe line: controls, bidi and surrogates escaped; bytes a
    str carries as surrogate escapes (an id that is not UTF-8) shown as the bytes (``\\xff``)."""
    if isinstance(value, str):
        # Lone surrogates of another kind stay: printable() escapes them.
        with contextlib.suppress(UnicodeEncodeError):
            value = value.encode("utf-8", "surrogateescape")
    shown = printable(value)
    return shown if len(shown) <= limit else shown[: limit - 1] + _CUT


def block(value: object) -> str:
    """Multi-line text from Redis (a traceback): newlines kept, other controls escaped."""
    return printable(value, keep_newlines=True)


def header_rows(headers: Mapping[Any, Any] | None) -> list[tuple[str, str]]:
    """Headers as sorted (name, value) text pairs, whatever their types (a msgpack envelope
    written by another client may carry int or bytes keys)."""
    if not headers:
        return []
    return sorted((text(k, 200), text(v)) for k, v in headers.items())


def error_line(error: str | None, limit: int = 160) -> str:
    """The line of an error text that says what happened: the last non-blank one (a
    traceback ends with ``RuntimeError: ...``)."""
    if not error:
        return ""
    lines = [line for line in str(error).splitlines() if line.strip()]
    return text(lines[-1].strip() if lines else "", limit)


def masked(message: object) -> str:
    """An error message with its passwords masked (in URLs or not), safe to show."""
    return printable(mask_secrets(str(message)))


def quote_all(value: object) -> str:
    return quote(str(value), safe="", errors="surrogatepass")


@dataclass(frozen=True, slots=True)
class Action:
    """One thing a user can do; ``task`` actions need an id."""

    name: str
    title: str
    task: bool
    warning: str


ACTIONS = {
    a.name: a
    for a in (
        Action("cancel", "Cancel task", True, "The task is deleted and will never run."),
        Action("run_now", "Run now", True, "The task becomes due now."),
        Action("reschedule", "Reschedule", True, "The task's due time moves."),
        Action("requeue", "Requeue dead task", True, "The task is due now, attempts reset."),
        Action("requeue_all", "Requeue all dead tasks", False, "Every dead task is due now."),
        Action("purge_dead", "Purge dead tasks", False, "Every dead task is deleted for good."),
    )
}

DONE = {
    "cancelled": "Task {id} cancelled.",
    "cancel_missed": "Task {id} was not cancelled: it is no longer waiting.",
    "rescheduled": "Task {id} rescheduled.",
    "reschedule_missed": "Task {id} was not rescheduled: it is no longer waiting.",
    "requeued": "{n} dead task(s) requeued.",
    "purged": "{n} dead task(s) purged.",
}


async def perform(q: AsyncDelayQueue, action: Action, task_id: str, delay_s: float) -> str:
    """Run ``action``; returns the query string of the page to show next."""
    tid = quote_all(task_id)
    if action.name == "cancel":
        done = "cancelled" if await q.cancel(task_id) else "cancel_missed"
        return f"done={done}&id={tid}"
    if action.name in ("run_now", "reschedule"):
        ok = await q.reschedule(task_id, delay=delay_s if action.name == "reschedule" else 0)
        return f"done={'rescheduled' if ok else 'reschedule_missed'}&id={tid}"
    if action.name == "requeue":
        return f"done=requeued&n={await q.requeue_dead(task_id)}&id={tid}"
    if action.name == "requeue_all":
        return f"done=requeued&n={await q.requeue_dead()}"
    return f"done=purged&n={await q.purge(('dead',))}"
