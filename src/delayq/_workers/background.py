"""Workers embedded in an application: started in the background, stopped with the app.

``Worker(...).start_background()`` runs a thread worker in a thread of its own;
``AsyncWorker(...).start_background()`` runs an asyncio worker as a task of the running loop.
Neither takes over the process's signals (the host application owns them): the host stops
the worker from its own shutdown, e.g. a FastAPI/Starlette lifespan or a Django/Flask atexit.
"""

from __future__ import annotations

import asyncio
import threading
from types import TracebackType
from typing import TYPE_CHECKING, Any, overload

from .._async.queue import AsyncDelayQueue
from .._sync.queue import DelayQueue

if TYPE_CHECKING:
    from .async_worker import AsyncWorker
    from .thread_worker import Worker


class BackgroundWorker:
    """A thread :class:`~delayq.Worker` running in a background thread of this process."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="delayq-background", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.worker.run()
        except BaseException as exc:  # kept for stop(): a background thread has no caller
            self._error = exc

    @property
    def running(self) -> bool:
        """Whether the worker is still working (False once it stopped or failed)."""
        return self._thread.is_alive()

    def stop(self, timeout: float | None = None) -> None:
        """Shut the worker down gracefully and wait for it (up to ``timeout`` seconds): fetching
        stops, running handlers get the worker's ``grace``, the tasks it held go back at once.
        Raises what ended the worker, if it failed (e.g. :class:`~delayq.WorkerFailed`)."""
        self.worker.stop()
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the delayq worker did not stop within {timeout}s")
        if self._error is not None:
            raise self._error

    def __enter__(self) -> BackgroundWorker:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class AsyncBackgroundWorker:
    """An :class:`~delayq.AsyncWorker` running as a task of the event loop that started it."""

    def __init__(self, worker: AsyncWorker) -> None:
        self.worker = worker
        self._task = asyncio.get_running_loop().create_task(worker.run(), name="delayq-background")

    @property
    def running(self) -> bool:
        """Whether the worker is still working (False once it stopped or failed)."""
        return not self._task.done()

    async def stop(self) -> None:
        """Shut the worker down gracefully and wait for it; see :meth:`BackgroundWorker.stop`.
        Raises what ended the worker, if it failed."""
        self.worker.stop()
        await asyncio.shield(self._task)

    async def __aenter__(self) -> AsyncBackgroundWorker:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


@overload
def listen(queue: DelayQueue, handler: Any, **options: Any) -> BackgroundWorker: ...
@overload
def listen(queue: AsyncDelayQueue, handler: Any, **options: Any) -> AsyncBackgroundWorker: ...
def listen(queue: Any, handler: Any, **options: Any) -> Any:
    """Run ``handler`` for every due task of ``queue`` in the background (Redisson's listener)
    and return a handle whose ``stop()`` ends it gracefully: a thread :class:`~delayq.Worker`
    for a :class:`~delayq.DelayQueue` (plain handler), an :class:`~delayq.AsyncWorker` task of
    the running loop for an :class:`~delayq.AsyncDelayQueue` (``async def`` handler).
    ``options`` are the worker's (concurrency, timeout, visibility_timeout, ...)."""
    from .async_worker import AsyncWorker
    from .thread_worker import Worker

    if isinstance(queue, AsyncDelayQueue):
        return AsyncWorker(queue, handler, **options).start_background()
    if isinstance(queue, DelayQueue):
        return Worker(queue, handler, **options).start_background()
    raise TypeError(f"listen() needs a DelayQueue or an AsyncDelayQueue, got {queue!r}")
