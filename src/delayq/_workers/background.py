"""Workers embedded in an application: started in the background, stopped with the app.

``Worker(...).start_background()`` runs a thread worker in a thread of its own;
``AsyncWorker(...).start_background()`` runs an asyncio worker as a task of the running loop.
Neither takes over the process's signals (the host application owns them): the host stops
the worker from its own shutdown, e.g. a FastAPI/Starlette lifespan or a Django/Flask atexit.
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING

from .._core.timing import Duration, setting_s

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

    def stop(self, timeout: Duration | None = None) -> None:
        """Shut the worker down gracefully and wait for it (up to ``timeout``, seconds or a
        timedelta; None: as long as it takes): fetching stops, running handlers get the
        worker's ``grace``, the tasks it held go back at once. Raises what ended the worker,
        if it failed (e.g. :class:`~delayq.WorkerFailed`)."""
        timeout_s = None if timeout is None else setting_s(timeout, "timeout")
        self.worker.stop()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise TimeoutError(f"the delayq worker did not stop within {timeout_s:g}s")
        if self._error is not None:
            raise self._error

    def __enter__(self) -> BackgroundWorker:
        return self

    def __exit__(self, *exc_info: object) -> None:
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

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
