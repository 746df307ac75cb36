"""Bookkeeping of wake-up messages, shared by the thread and asyncio listeners."""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass

_HISTORY = 256


class WakeLog:
    """Numbered wake-up hints: the due time a message announced, or None for "unknown, look at
    Redis" (a reconnect, a close, an unreadable message).

    A waiter remembers :attr:`generation` before it sleeps and asks :meth:`news_since` when it
    wakes: the earliest due time announced since, or None when any of it is unknown or fell
    out of the bounded history.
    """

    __slots__ = ("_history", "generation")

    def __init__(self) -> None:
        self.generation = 0
        self._history: collections.deque[tuple[int, int | None]] = collections.deque(
            maxlen=_HISTORY
        )

    def push(self, due_ms: int | None) -> None:
        self.generation += 1
        self._history.append((self.generation, due_ms))

    def news_since(self, mark: int) -> tuple[int, int | None]:
        """(current generation, earliest due ms announced after ``mark`` or None)."""
        dues = [due for gen, due in self._history if gen > mark]
        if len(dues) < self.generation - mark or None in dues:
            return self.generation, None
        return self.generation, min(due for due in dues if due is not None)


def due_of(data: object) -> int | None:
    """The due time a channel message announces, or None if it is not one."""
    if not isinstance(data, bytes | str | int):
        return None
    try:
        return int(data)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class WakePlan:
    """How a consumer with nothing to take waits: for news by the timer for ``timer_s``
    seconds (none if not positive), then yielding until ``until`` (monotonic), when it looks
    at Redis again."""

    until: float
    timer_s: float


def plan_wait(now: float, wakes: Sequence[float], deadline: float | None, slack: float) -> WakePlan:
    """The wait until the earliest of ``wakes`` (each shard's next due time or safety look)
    or the caller's ``deadline``. A timer may fire late (asyncio's by up to ~1 ms), so a wait
    for a due time stops ``slack`` short of it and the caller yields the rest away; a wait
    for a deadline needs no such care."""
    wake_at = min(wakes)
    until = wake_at if deadline is None else min(wake_at, deadline)
    return WakePlan(until, until - now - (slack if until == wake_at else 0.0))
