"""Task history (issue #22, docs/history.md): its settings, the events the scripts write and
what a reader makes of them. Pure: no I/O.

A queue keeps histories once a client turned them on: the settings live in Redis (the
``hist`` hash under the queue's prefix), so every producer, worker and CLI records. Each
event is one entry ``ms|kind|attempt|detail`` of the task's list, written by the script that
makes the change it records, in the same atomic step (lua/_lib.lua has the format's writer).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Final, Literal

from ..exceptions import ConfigError
from .models import TaskInfo, TaskState, to_datetime
from .text import printable
from .timing import Duration, duration_ms

DEFAULT_RETENTION: Final = timedelta(days=1)
MAX_RETENTION: Final = timedelta(days=30)
DEFAULT_MAX_EVENTS: Final = 50
MAX_EVENTS: Final = 1000
MIN_EVENTS: Final = 3  # the offer, the count of those dropped, the latest
DEFAULT_MAX_DETAIL_BYTES: Final = 200
MIN_DETAIL_BYTES: Final = 16
MAX_DETAIL_BYTES: Final = 4000


class HistoryKind(StrEnum):
    """What happened to a task (a :class:`HistoryEvent`'s ``kind``)."""

    OFFERED = "offered"  # by whom (host/pid, a schedule) and when it is due
    REPLACED = "replaced"  # an offer with its dedup key and dedup="replace" took it over
    RESCHEDULED = "rescheduled"  # its new due time
    DELIVERED = "delivered"  # to which consumer (host/pid), and how late
    EXTENDED = "extended"  # its lease
    RETRIED = "retried"  # the error's last line (a retry, a nack or a lease that ran out)
    RELEASED = "released"  # handed back unstarted (a worker's shutdown)
    THROTTLED = "throttled"  # a handler raised RateLimited
    DEAD_LETTERED = "dead-lettered"  # why
    REQUEUED = "requeued"  # from the dead letters
    ACKED = "acked"
    CANCELLED = "cancelled"
    EXPIRED = "expired"  # its ttl ran out before a delivery
    PURGED = "purged"
    TRIMMED = "trimmed"  # stands for events dropped past max_events: detail says how many


# How a task ended, by its history's last event: the state q.get() reports afterwards.
ENDINGS: Final = {
    HistoryKind.ACKED: TaskState.DONE,
    HistoryKind.DELIVERED: TaskState.DONE,  # at-most-once: taken is done
    HistoryKind.CANCELLED: TaskState.CANCELLED,
    HistoryKind.EXPIRED: TaskState.CANCELLED,
    HistoryKind.PURGED: TaskState.CANCELLED,
}


@dataclass(frozen=True, slots=True)
class HistoryEvent:
    """One event of a task's history (:meth:`DelayQueue.history`), in Redis's clock."""

    at: datetime  # UTC
    kind: str  # a HistoryKind value (compare with HistoryKind members or plain strings)
    attempt: int  # deliveries so far when it happened (0 before the first)
    detail: str  # one line, at most max_detail_bytes: by whom, why, when due


@dataclass(frozen=True, slots=True)
class HistorySettings:
    """How a queue keeps task histories: ``retention`` after a task ends (seconds or a
    timedelta, at most 30 days), at most ``max_events`` events per task (3-1000: past it
    the first event and the latest are kept, and one that counts those dropped) and
    ``max_detail_bytes`` per event's detail (16-4000, cut at a character)."""

    retention: timedelta = DEFAULT_RETENTION
    max_events: int = DEFAULT_MAX_EVENTS
    max_detail_bytes: int = DEFAULT_MAX_DETAIL_BYTES

    def __post_init__(self) -> None:
        try:
            ms = duration_ms(self.retention, "history retention", allow_zero=False)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        if ms > MAX_RETENTION.total_seconds() * 1000:
            raise ConfigError(
                f"history retention of {self.retention!r} is more than {MAX_RETENTION.days} "
                "days: a history is for looking back on recent tasks"
            )
        object.__setattr__(self, "retention", timedelta(milliseconds=ms))
        for value, low, high, what in (
            (self.max_events, MIN_EVENTS, MAX_EVENTS, "max_events"),
            (self.max_detail_bytes, MIN_DETAIL_BYTES, MAX_DETAIL_BYTES, "max_detail_bytes"),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise ConfigError(
                    f"history {what} must be an int from {low} to {high}, got {value!r}"
                )

    @classmethod
    def of(
        cls,
        retention: Duration = DEFAULT_RETENTION,
        max_events: int = DEFAULT_MAX_EVENTS,
        max_detail_bytes: int = DEFAULT_MAX_DETAIL_BYTES,
    ) -> HistorySettings:
        """The settings with ``retention`` in seconds or as a timedelta."""
        try:
            ms = duration_ms(retention, "history retention", allow_zero=False)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        return cls(timedelta(milliseconds=ms), max_events, max_detail_bytes)

    @property
    def retention_ms(self) -> int:
        return round(self.retention.total_seconds() * 1000)


HistoryOption = HistorySettings | Literal[False] | None  # as QueueOptions keeps it


def history_option(value: object) -> HistoryOption:
    """A queue's ``history=``: None (leave Redis's setting as it is), False (turn it off),
    True (on, the defaults), a retention (seconds or a timedelta) or :class:`HistorySettings`."""
    if value is None or value is False or isinstance(value, HistorySettings):
        return value
    if value is True:
        return HistorySettings()
    if isinstance(value, int | float | timedelta):
        return HistorySettings.of(value)
    raise ConfigError(
        f"history must be a retention (seconds or a timedelta), True, False or HistorySettings, "
        f"got {value!r}"
    )


# -- script arguments and replies ---------------------------------------------------------


def set_args(settings: HistorySettings) -> list[Any]:
    return ["set", settings.retention_ms, settings.max_events, settings.max_detail_bytes]


def parse_settings(reply: Sequence[Any]) -> HistorySettings | None:
    """The history script's settings reply: None when history is off."""
    if not reply:
        return None
    ret, events, detail = (int(v) for v in reply)
    return HistorySettings(timedelta(milliseconds=ret), events, detail)


_EPOCH: Final = datetime.fromtimestamp(0, UTC)


def parse_event(raw: bytes | str) -> HistoryEvent:
    """One stored event; an entry another client wrote badly shows as ``unreadable``."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    ms, kind, attempt, detail = [*text.split("|", 3), "", "", ""][:4]
    try:
        at, tries = to_datetime(int(ms)) or _EPOCH, int(attempt)
    except ValueError:
        return HistoryEvent(_EPOCH, "unreadable", 0, printable(text))
    if kind not in HistoryKind._value2member_map_:
        return HistoryEvent(at, kind, tries, detail)  # written by a newer delayq, perhaps
    if kind == HistoryKind.TRIMMED:  # its detail is the count (the scripts read it back)
        detail = f"{detail} events dropped here (max_events)"
    return HistoryEvent(at, HistoryKind(kind), tries, detail)


def parse_history(reply: Sequence[Any]) -> list[HistoryEvent]:
    return [parse_event(entry) for entry in reply]


def ended_info(task_id: str, last_event: bytes | str) -> TaskInfo | None:
    """What ``get()`` says of a task the queue no longer holds, from its history's last
    event: done or cancelled (and how, when); None if that event is no ending (history was
    turned off meanwhile)."""
    event = parse_event(last_event)
    state = ENDINGS.get(event.kind)  # type: ignore[call-overload]
    if state is None:
        return None
    return TaskInfo(
        id=task_id,
        state=state,
        payload=None,
        attempts=event.attempt,
        ended_at=event.at,
        outcome=str(event.kind),
    )


_origin: tuple[int, str] = (0, "")


def origin() -> str:
    """Who this process is in a history (an offer's ``by``, a delivery's ``to``): host/pid."""
    global _origin
    pid = os.getpid()
    if _origin[0] != pid:  # a forked child is someone else
        _origin = (pid, printable(f"{socket.gethostname()}/{pid}").replace("|", "/"))
    return _origin[1]
