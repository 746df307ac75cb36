"""Worker runtimes: :class:`Worker` (threads, plain handlers) and :class:`AsyncWorker`
(asyncio, ``async def`` handlers), with the same options and behaviour."""

from ._core.handling import Reject, Retry, WorkerHealth
from ._workers.async_worker import AsyncWorker
from ._workers.common import Hooks
from ._workers.thread_worker import Worker
from .exceptions import WorkerFailed

__all__ = ["AsyncWorker", "Hooks", "Reject", "Retry", "Worker", "WorkerFailed", "WorkerHealth"]
