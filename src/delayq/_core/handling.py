"""What a worker does with a handler's outcome: shared by the thread and asyncio workers."""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum
from typing import Any

from ..exceptions import DelayqError
from .text import utf8_safe
from .timing import duration_ms


class Retry(Exception):
    """Raise from a handler to have the task delivered again after ``delay`` seconds (None:
    the queue's backoff). Counts as a failed attempt."""

    def __init__(self, delay: float | None = None, reason: str = "retry requested") -> None:
        super().__init__(reason)
        self.delay = delay
        self.reason = reason


class Reject(Exception):
    """Raise from a handler to dead-letter the task at once with ``reason``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class RateLimited(Exception):
    """Raise from a handler when the downstream said "too many requests" (an HTTP 429):
    the task's ``limit_key`` (or, for a task without one, the whole queue) starts nothing for
    ``retry_after`` seconds, and the task waits first in line for it. The attempt is not
    counted, so a throttled task is never dead-lettered for it."""

    def __init__(self, retry_after: float | timedelta = 1.0, reason: str = "rate limited") -> None:
        super().__init__(reason)
        self.retry_after = retry_after
        self.reason = reason


class Verdict(StrEnum):
    ACK = "ack"
    RETRY = "retry"  # again after a delay or the backoff; dead after max_attempts
    REJECT = "reject"  # dead-letter now
    THROTTLE = "throttle"  # [L] RateLimited: the key waits ``delay``; no attempt counted


@dataclass(frozen=True, slots=True)
class Outcome:
    verdict: Verdict
    delay: float | None = None
    error: str = ""
    dead: bool = False  # this retry exhausts the attempts: the task is dead-lettered


ACKED = Outcome(Verdict.ACK)  # the verdict on nearly every run: made once (frozen)


def outcome_of(exc: BaseException | None, attempts: int, max_attempts: int) -> Outcome:
    """The verdict on one handler run that raised ``exc`` (None: it returned)."""
    if exc is None:
        return ACKED
    if isinstance(exc, Reject):
        return Outcome(Verdict.REJECT, error=f"rejected: {_text(exc.reason)}", dead=True)
    if isinstance(exc, RateLimited):
        try:
            wait = duration_ms(exc.retry_after, "retry_after") / 1000
        except DelayqError as bad:  # a handler's mistake: wait a second rather than lose it
            return Outcome(Verdict.THROTTLE, 1.0, f"{_text(exc.reason)} ({_text(bad)}: 1 s)")
        return Outcome(Verdict.THROTTLE, wait, _text(exc.reason))
    if isinstance(exc, Retry):
        reason, delay = _text(exc.reason), exc.delay
        if delay is not None:
            try:
                duration_ms(delay)
            except DelayqError as bad:  # a handler's mistake must not cost the task its retry
                reason, delay = f"{reason} (Retry delay ignored: {_text(bad)})", None
        return Outcome(Verdict.RETRY, delay, reason, attempts >= max_attempts)
    return Outcome(Verdict.RETRY, None, describe(exc), attempts >= max_attempts)


def describe(exc: BaseException, limit: int = 4000) -> str:
    """An error for the task's record: type, message and the innermost frames, always valid
    UTF-8 (a lone surrogate in a message, e.g. from ``surrogateescape``, is escaped)."""
    try:
        text = "".join(traceback.format_exception(exc, limit=-8))
    except Exception:  # an exception type broken enough to fail formatting still has a name
        text = f"{type(exc).__qualname__} (its traceback could not be formatted)"
    return utf8_safe(text)[-limit:]


def _text(value: object) -> str:
    """``value`` as valid UTF-8 text, whatever a handler put there."""
    try:
        return utf8_safe(value if isinstance(value, str) else str(value))
    except Exception:  # a __str__ that raises
        return f"<{type(value).__qualname__} without a readable text>"


@dataclass(slots=True)
class Counters:
    """What a worker has done, for health checks and logs."""

    started_at: float = field(default_factory=time.time)
    last_progress: float = field(default_factory=time.monotonic)
    last_fetch: float = field(default_factory=time.monotonic)
    processed: int = 0
    succeeded: int = 0
    failed: int = 0
    dead: int = 0
    timed_out: int = 0
    redis_errors: int = 0
    internal_errors: int = 0  # the worker's own machinery failed (see the worker's log)
    loop_restarts: int = 0

    def processed_one(self, now: float) -> None:
        """A handler run ended, at monotonic ``now``."""
        self.processed += 1
        self.last_progress = now


@dataclass(frozen=True, slots=True)
class WorkerHealth:
    """A worker's state for a supervisor: see :meth:`Worker.health`."""

    state: str  # starting, running, stopping, stopped
    alive: bool  # running, no loop given up on, and the fetch loop turned recently
    running: int  # handlers running now
    processed: int
    succeeded: int
    failed: int
    dead: int
    timed_out: int
    redis_errors: int
    seconds_since_progress: float  # since a task last finished (or the worker started)
    seconds_since_fetch: float
    internal_errors: int = 0
    loop_restarts: int = 0
    reason: str | None = None  # why the worker is not alive; None while it is
    # Queues Redis has never seen (nothing offered, not created): the worker waits on them,
    # alive, but a misspelt name would leave it idle for ever.
    unknown_queues: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}
