"""The errors delayq raises.

::

    DelayqError
    ├── ConfigError (ValueError)          bad queue options: codec, name, limits
    ├── InvalidTaskError (ValueError)     a task that cannot be scheduled; nothing was written
    │   ├── InvalidDelay                  negative, NaN, infinite or absurd delays; naive datetimes
    │   ├── EncodeError (TypeError)       a payload the codec cannot encode
    │   └── PayloadTooLarge               an encoded task over the queue's size limit
    ├── DecodeError (ValueError)          a stored task that cannot be read back
    ├── LeaseLost                         ack/nack/extend on a lease that expired or moved on
    ├── RedisUnavailable (ConnectionError) Redis did not answer within the call's time
    ├── ServerError                       Redis answered with an error (BUSY, OOM, WRONGTYPE, ...)
    ├── NotDurable                        a write was made but not confirmed by enough replicas
    ├── TaskIdConflict                    an offer's own id is held by a task with other content
    ├── ScheduleNotFound (KeyError)       a recurring schedule the queue does not have
    ├── QueueClosed (RuntimeError)        the queue object was closed
    └── WorkerFailed (RuntimeError)       a worker loop kept dying: the worker stopped
"""

from __future__ import annotations


class DelayqError(Exception):
    """Base class of every error raised by delayq."""


class ConfigError(DelayqError, ValueError):
    """A queue was configured with an invalid option."""


class InvalidTaskError(DelayqError, ValueError):
    """A task cannot be scheduled as given; nothing was written."""


class InvalidDelay(InvalidTaskError):
    """A delay or due time is negative, not finite, naive, ambiguous or absurdly far."""


class EncodeError(InvalidTaskError, TypeError):
    """The codec cannot encode the payload."""


class PayloadTooLarge(InvalidTaskError):
    """The encoded task is larger than the queue's ``max_payload_bytes``."""


class DecodeError(DelayqError, ValueError):
    """A stored task cannot be decoded (corrupt bytes, unknown codec, payload type mismatch)."""


class LeaseLost(DelayqError):
    """The lease on a task expired or was handed to another consumer.

    Raised by ``ack``, ``nack`` and ``extend`` instead of touching a delivery that is no longer
    the caller's. The task will be (or already was) delivered again: handlers must be idempotent.
    """


class RedisUnavailable(DelayqError, ConnectionError):
    """Redis could not be reached within the call's retry window. ``where``: that Redis (its
    URL without the password), when known."""

    def __init__(self, *args: object, where: str | None = None) -> None:
        super().__init__(*args)
        self.where = where


class NotDurable(DelayqError):
    """A write was made but fewer copies than the queue's :class:`~delayq.Durability` asks
    for confirmed it in time. ``task_ids`` are the tasks concerned: they exist (on the master),
    and offering them again with the same ids is safe."""

    def __init__(self, message: str, task_ids: list[str]) -> None:
        super().__init__(message)
        self.task_ids = task_ids


class ServerError(DelayqError):
    """Redis answered a delayq script with an error (for example BUSY, OOM or WRONGTYPE).
    ``where``: that Redis (its URL without the password), when known."""

    def __init__(self, *args: object, where: str | None = None) -> None:
        super().__init__(*args)
        self.where = where


class TaskIdConflict(DelayqError):
    """An offer gave an ``id`` that a task with other content (payload, headers, priority or
    key) already holds. That task is kept unchanged and nothing was written for this offer.

    ``task_ids``: the ids in conflict. From ``offer_many``, the other items were written, and
    ``results`` holds every item's :class:`TaskId` in order (``outcome`` ``conflict`` here).
    """

    def __init__(
        self, message: str, task_ids: list[str] | None = None, results: list[str] | None = None
    ) -> None:
        super().__init__(message)
        self.task_ids = task_ids or []
        self.results = results or []


class ScheduleNotFound(DelayqError, KeyError):
    """``q.schedules.trigger``/``backfill``/``pause``/``resume`` of a schedule the queue does
    not have (``get`` returns None and ``remove`` False instead)."""


class QueueClosed(DelayqError, RuntimeError):
    """The queue was closed; create a new one."""


class WorkerFailed(DelayqError, RuntimeError):
    """A worker's own loop (fetch, run, ack or heartbeat) kept dying, so the worker stopped;
    ``run()`` raises it after the shutdown, and the health file says why."""
