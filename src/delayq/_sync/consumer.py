# Generated from _async/consumer.py by scripts/unasync.py: do not edit.
"""Consumer: a queue's due tasks as an iterator, each acked when the next is asked for.

The sync ``Consumer`` in ``_sync/consumer.py`` is generated from this file by
``scripts/unasync.py``; edit here and regenerate.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Generic

from .._core.codecs import PayloadT
from .._core.handling import Verdict, outcome_of
from .._core.text import printable
from ..exceptions import LeaseLost

if TYPE_CHECKING:
    from .queue import DelayQueue, Task
    from .shard import AckPosted

log = logging.getLogger("delayq")


class Consumer(Generic[PayloadT]):
    """What ``queue.consume()`` returns: see :meth:`DelayQueue.consume`."""

    def __init__(self, queue: DelayQueue[PayloadT], timeout: float | None) -> None:
        self._queue = queue
        self._timeout = timeout
        self._current: Task[PayloadT] | None = None
        # Acks written and their replies not read yet (see _ack_in_loop): read once the loop
        # makes a round trip anyway, so that Redis runs them while the loop goes on.
        self._posted: list[tuple[Task[PayloadT], AckPosted]] = []

    def __iter__(self) -> Consumer[PayloadT]:
        return self

    def __next__(self) -> Task[PayloadT]:
        self._settle(None, fetch_ahead=True)
        if self._timeout is None:
            task = self._queue.take()
        else:
            found = self._queue.poll(self._timeout)
            if found is None:
                raise StopIteration
            task = found
        self._current = task
        return task

    def __enter__(self) -> Consumer[PayloadT]:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        try:
            self._settle(exc, fetch_ahead=False)
        finally:
            self._queue._hand_back_ahead()

    def _settle(self, error: BaseException | None, *, fetch_ahead: bool) -> None:
        """Ack the task in hand (``error`` None), or fail it as a worker would."""
        task, self._current = self._current, None
        if task is None or task._settled:
            self._read_posted()
            return
        queue = self._queue
        try:
            if error is None and fetch_ahead:
                acked = queue._ack_in_loop(task)
                if not isinstance(acked, bool):
                    self._posted.append((task, acked))
                    return
                settled = acked
            elif error is None:
                settled = queue._ack_one(task, fetch_ahead=False)
            elif not isinstance(error, Exception):
                queue.release(task)  # Ctrl-C, a cancellation: not the task's fault
                settled = True
            else:
                outcome = outcome_of(error, task.attempts, queue.policy.max_attempts)
                if outcome.verdict is Verdict.THROTTLE:  # [L] RateLimited
                    queue.throttle(task, outcome.delay or 0)
                elif outcome.verdict is Verdict.REJECT:
                    queue.reject(task, outcome.error)
                else:
                    queue.retry(task, outcome.delay, error=outcome.error)
                settled = True
        except LeaseLost:
            settled = False
        self._read_posted()  # their replies came before this call's (or they run again)
        self._settled(task, settled)

    def _read_posted(self) -> None:
        while self._posted:
            task, ack = self._posted.pop(0)
            self._settled(task, ack.acked())

    def _settled(self, task: Task[PayloadT], settled: bool) -> None:
        if settled:
            object.__setattr__(task, "_settled", True)
        else:
            log.warning(
                "delayq: lease on task %s of %s was lost before it was settled; it is or will "
                "be delivered again", printable(task.id), self._queue.name,
            )  # fmt: skip
