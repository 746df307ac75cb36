"""Formatting for the templates, and the actions the dashboard can take on a queue."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote

from .. import AsyncDelayQueue

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)(ms|s|m|h|d))+")
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def parse_delay(text: str) -> float:
    """Seconds from ``90``, ``30s``, ``5m``, ``1h30m``, ``250ms`` or ``2d``; ValueError else."""
    value = text.strip().replace(" ", "").lower()
    try:
        seconds = float(value)
    except ValueError:
        if not _DURATION.fullmatch(value):
            raise ValueError(f"not a delay: {text!r} (use 90, 30s, 5m, 1h30m)") from None
        seconds = sum(float(n) * _UNITS[u] for n, u in _PART.findall(value))
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"not a delay: {text!r} (must be >= 0)")
    return seconds


def duration(seconds: float | None) -> str:
    """``1h 02m``, ``3m 05s``, ``4.2s``, ``15ms``."""
    if seconds is None:
        return "-"
    s = abs(seconds)
    if s < 1:
        return f"{s * 1000:.0f}ms"
    if s < 60:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{int(s // 60)}m {int(s % 60):02d}s"
    if s < 86400:
        return f"{int(s // 3600)}h {int(s % 3600 // 60):02d}m"
    return f"{int(s // 86400)}d {int(s % 86400 // 3600):02d}h"


def relative(when: datetime | None, now: datetime) -> str:
    """``in 5m 03s`` or ``2.1s ago`` against the server's clock."""
    if when is None:
        return "-"
    delta = (when - now).total_seconds()
    return f"in {duration(delta)}" if delta > 0 else f"{duration(delta)} ago"


def iso(when: datetime | None) -> str:
    return "-" if when is None else when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def pretty(payload: Any) -> str:
    """The payload as indented JSON (bytes and other objects as their repr)."""
    if isinstance(payload, bytes | bytearray):
        return repr(bytes(payload))
    try:
        return json.dumps(payload, indent=2, ensure_ascii=False, sort_keys=True, default=repr)
    except (TypeError, ValueError):
        return repr(payload)


def preview(payload: Any, limit: int = 120) -> str:
    text = " ".join(pretty(payload).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def quote_all(value: object) -> str:
    return quote(str(value), safe="")


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
