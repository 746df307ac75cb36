"""Worker runtimes: :class:`Worker` (threads, plain handlers) and :class:`AsyncWorker`
(asyncio, ``async def`` handlers), with the same options and behaviour."""

from ._core.handling import Reject, Retry, WorkerHealth
from ._workers.async_worker import AsyncWorker
from ._workers.background import AsyncBackgroundWorker, BackgroundWorker
from ._workers.common import Hooks, is_coroutine_function
from ._workers.thread_worker import Worker
from .exceptions import WorkerFailed

__all__ = [
    "AsyncBackgroundWorker",
    "AsyncWorker",
    "BackgroundWorker",
    "Hooks",
    "Reject",
    "Retry",
    "Worker",
    "WorkerFailed",
    "WorkerHealth",
    "is_coroutine_function",
]
