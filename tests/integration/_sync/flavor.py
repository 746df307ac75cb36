"""What the sync tests do their own way: the thread twins of ``_async/flavor.py``, written
by hand (like ``delayq._sync.backend``), with the same names."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Generic, ParamSpec, TypeVar

from sqlalchemy import create_engine as sqlalchemy_engine
from sqlalchemy.orm import Session

from delayq.outbox import Relay
from tests.helpers import wait_until

P = ParamSpec("P")
T = TypeVar("T")

__all__ = ["Pending", "blocking", "eventually", "relay_pending", "sleep", "spawn"]
__all__ += ["Session", "sqlalchemy_engine"]


class Pending(Generic[T]):
    """A call running in a thread of its own."""

    def __init__(self, future: Future[T]) -> None:
        self._future = future

    def result(self, timeout: float) -> T:
        """Its result, waiting at most ``timeout`` seconds (TimeoutError after that)."""
        return self._future.result(timeout)

    def cancel(self) -> None:
        """A running thread cannot be cancelled: the call ends on its own timeout."""
        self._future.cancel()


def spawn(call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> Pending[T]:
    """Start ``call(*args, **kwargs)`` in a thread of its own."""
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="test-background")
    future = executor.submit(call, *args, **kwargs)
    executor.shutdown(wait=False)
    return Pending(future)


def blocking(call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    return call(*args, **kwargs)


def sleep(seconds: float) -> None:
    time.sleep(seconds)


def eventually(predicate: Callable[[], Any], timeout: float = 10.0) -> Any:
    return wait_until(predicate, timeout)


def relay_pending(dsn: str, redis_url: str, table: str) -> int:
    """Relay the outbox's pending rows once; the rows handled."""
    return Relay(dsn, redis_url, table=table).relay_pending()
