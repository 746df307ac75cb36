"""delayq: precise, reliable delayed queues for Python on Redis."""

import logging as _logging

from ._async.connection import AsyncConnection, aconnect
from ._async.queue import AsyncDelayQueue, AsyncTask
from ._core.durability import Durability
from ._core.handling import RateLimited, Reject, Retry, WorkerHealth
from ._core.history import HistoryEvent, HistoryKind, HistorySettings
from ._core.limits import Limit, LimitInfo, PauseInfo
from ._core.models import (
    Backoff,
    DeadTask,
    DedupMode,
    QueuePolicy,
    Stats,
    TaskInfo,
    TaskState,
)
from ._core.offers import Offer, OfferOptions, OfferOutcome, TaskId
from ._core.schedule import Schedule, ScheduleInfo
from ._sync.connection import Connection, connect
from ._sync.queue import DelayQueue, Task
from ._workers.async_worker import AsyncWorker
from ._workers.background import AsyncBackgroundWorker, BackgroundWorker
from ._workers.common import Hooks
from ._workers.thread_worker import Worker
from .exceptions import (
    ConfigError,
    DecodeError,
    DelayqError,
    EncodeError,
    InvalidDelay,
    InvalidTaskError,
    LeaseLost,
    NotDurable,
    PayloadTooLarge,
    QueueClosed,
    RedisUnavailable,
    ScheduleNotFound,
    ServerError,
    TaskIdConflict,
    WorkerFailed,
)

__version__ = "0.1.0"

# A library never configures logging; this keeps Python's last-resort handler from printing
# delayq's warnings in applications that have not set logging up.
_logging.getLogger("delayq").addHandler(_logging.NullHandler())

__all__ = [
    "AsyncBackgroundWorker",
    "AsyncConnection",
    "AsyncDelayQueue",
    "AsyncTask",
    "AsyncWorker",
    "BackgroundWorker",
    "Backoff",
    "ConfigError",
    "Connection",
    "DeadTask",
    "DecodeError",
    "DedupMode",
    "DelayQueue",
    "DelayqError",
    "Durability",
    "EncodeError",
    "HistoryEvent",
    "HistoryKind",
    "HistorySettings",
    "Hooks",
    "InvalidDelay",
    "InvalidTaskError",
    "LeaseLost",
    "Limit",
    "LimitInfo",
    "NotDurable",
    "Offer",
    "OfferOptions",
    "OfferOutcome",
    "PauseInfo",
    "PayloadTooLarge",
    "QueueClosed",
    "QueuePolicy",
    "RateLimited",
    "RedisUnavailable",
    "Reject",
    "Retry",
    "Schedule",
    "ScheduleInfo",
    "ScheduleNotFound",
    "ServerError",
    "Stats",
    "Task",
    "TaskId",
    "TaskIdConflict",
    "TaskInfo",
    "TaskState",
    "Worker",
    "WorkerFailed",
    "WorkerHealth",
    "aconnect",
    "connect",
]
