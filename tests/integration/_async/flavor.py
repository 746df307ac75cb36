"""What the asyncio tests do their own way; ``_sync/flavor.py`` has the same names for
threads. The test modules beside this one import these, so that ``scripts/unasync.py`` can
turn them into the sync tests by removing ``async`` and ``await`` alone."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any, Generic, ParamSpec, TypeVar

from sqlalchemy.ext.asyncio import AsyncSession as Session
from sqlalchemy.ext.asyncio import create_async_engine as sqlalchemy_engine

from delayq.outbox import AsyncRelay

P = ParamSpec("P")
T = TypeVar("T")

__all__ = ["Pending", "blocking", "eventually", "relay_pending", "sleep", "spawn"]
__all__ += ["Session", "sqlalchemy_engine"]


class Pending(Generic[T]):
    """A call running in the background (an asyncio task here, a thread in the sync tests)."""

    def __init__(self, task: asyncio.Future[T]) -> None:
        self._task = task

    async def result(self, timeout: float) -> T:
        """Its result, waiting at most ``timeout`` seconds (TimeoutError after that)."""
        return await asyncio.wait_for(asyncio.shield(self._task), timeout)

    async def cancel(self) -> None:
        """Cancel it if it still runs (a thread cannot be: the sync twin leaves it be)."""
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


def spawn(
    call: Callable[P, Coroutine[Any, Any, T]], *args: P.args, **kwargs: P.kwargs
) -> Pending[T]:
    """Start ``call(*args, **kwargs)`` in the background."""
    return Pending(asyncio.ensure_future(call(*args, **kwargs)))


async def blocking(call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run a blocking call without stopping the event loop (in the sync tests: just call)."""
    return await asyncio.to_thread(call, *args, **kwargs)


async def sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


async def eventually(predicate: Callable[[], Any], timeout: float = 10.0) -> Any:
    """``tests.helpers.wait_until`` letting the event loop run while it waits."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(0.01)
    return value


async def relay_pending(dsn: str, redis_url: str, table: str) -> int:
    """Relay the outbox's pending rows once; the rows handled."""
    async with AsyncRelay(dsn, redis_url, table=table) as relay:
        return await relay.relay_pending()
