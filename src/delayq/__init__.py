"""delayq: precise, reliable delayed queues for Python on Redis."""

from ._async.queue import AsyncDelayQueue, AsyncTask
from ._core.models import Backoff, DeadTask, DedupMode, Stats, TaskInfo, TaskState
from ._core.offers import Offer
from ._sync.queue import DelayQueue, Task
from .exceptions import (
    ConfigError,
    DecodeError,
    DelayqError,
    EncodeError,
    InvalidDelay,
    InvalidTaskError,
    LeaseLost,
    PayloadTooLarge,
    QueueClosed,
    RedisUnavailable,
    ServerError,
    TaskNotFound,
)

__version__ = "0.1.0"

__all__ = [
    "AsyncDelayQueue",
    "AsyncTask",
    "Backoff",
    "ConfigError",
    "DeadTask",
    "DecodeError",
    "DedupMode",
    "DelayQueue",
    "DelayqError",
    "EncodeError",
    "InvalidDelay",
    "InvalidTaskError",
    "LeaseLost",
    "Offer",
    "PayloadTooLarge",
    "QueueClosed",
    "RedisUnavailable",
    "ServerError",
    "Stats",
    "Task",
    "TaskInfo",
    "TaskNotFound",
    "TaskState",
]
