"""Bookkeeping of wake-up messages, shared by the thread and asyncio listeners."""

from __future__ import annotations

import collections

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
