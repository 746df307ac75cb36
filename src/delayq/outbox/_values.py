"""What Outbox and AsyncOutbox return: the outbox's status and its dead rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True, slots=True)
class QueueBacklog:
    """Rows of one queue in the outbox."""

    prefix: str
    queue: str
    pending: int
    dead: int
    oldest_pending_age: float | None  # seconds, on the database's clock
    missed: int = 0  # cancels and reschedules that found no waiting task


@dataclass(frozen=True, slots=True)
class OutboxStatus:
    """What the outbox holds: rows not relayed yet, and rows no relay could apply."""

    pending: int
    dead: int
    oldest_pending_age: float | None  # the relay lag: seconds the oldest pending row waited
    queues: tuple[QueueBacklog, ...]
    missed: int = 0  # cancels and reschedules that found no waiting task (kept as rows)


@dataclass(frozen=True, slots=True)
class DeadRow:
    """A row the relay could not apply, with the reason."""

    seq: int
    prefix: str
    queue: str
    task_id: str
    op: str
    created: datetime
    error: str | None


def status_of(rows: Sequence[Mapping[str, Any]]) -> OutboxStatus:
    """The status from the rows of ``Schema.status`` (a count per queue and status)."""
    per: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        entry = per.setdefault(
            (row["prefix"], row["queue"]), {"pending": 0, "dead": 0, "missed": 0}
        )
        entry[row["status"]] = int(row["n"])
        if row["status"] == "pending":
            entry["oldest"] = float(row["oldest_s"])
    queues = tuple(
        QueueBacklog(prefix, queue, e["pending"], e["dead"], e.get("oldest"), e["missed"])
        for (prefix, queue), e in per.items()
    )
    ages = [q.oldest_pending_age for q in queues if q.oldest_pending_age is not None]
    return OutboxStatus(
        pending=sum(q.pending for q in queues),
        dead=sum(q.dead for q in queues),
        oldest_pending_age=max(ages) if ages else None,
        queues=queues,
        missed=sum(q.missed for q in queues),
    )


def dead_rows(rows: Sequence[Mapping[str, Any]]) -> list[DeadRow]:
    """The rows of ``Schema.dead`` as values."""
    return [
        DeadRow(r["seq"], r["prefix"], r["queue"], r["task_id"], r["op"], r["created"], r["error"])
        for r in rows
    ]
