"""The service's background work: the outbox relay and the close worker.

Both run in the app's lifespan (``ORDER_SERVICE_BACKGROUND=1``, the default) or in processes
of their own, ``python -m examples.order_service.worker [--role relay|worker]``, next to API
processes started with ``ORDER_SERVICE_BACKGROUND=0``.
"""

from __future__ import annotations

import asyncio

from sqlalchemy.ext.asyncio import AsyncEngine

from delayq import AsyncDelayQueue, AsyncTask, AsyncWorker
from delayq.outbox import AsyncRelay

from .config import Settings
from .service import QUEUE, close_if_unpaid

ROLES = frozenset({"relay", "worker"})


class Background:
    """The relay (outbox -> Redis) and the worker (Redis -> close_if_unpaid), as tasks;
    ``roles`` picks one of them or both."""

    def __init__(
        self, settings: Settings, engine: AsyncEngine, roles: frozenset[str] = ROLES
    ) -> None:
        if not roles or not roles <= ROLES:
            raise ValueError(f"roles are some of {sorted(ROLES)}, not {sorted(roles)}")
        self.roles = roles
        self.relay = AsyncRelay(settings.dsn, settings.redis_url)
        # The service offers to this queue itself: a new one is expected, not a typo.
        self.queue = AsyncDelayQueue(QUEUE, settings.redis_url, prefix=settings.prefix, create=True)
        self._engine = engine

        async def close_order(task: AsyncTask) -> None:
            await close_if_unpaid(self._engine, task.payload["order_id"], task.due_at)

        # Inside an application the worker must not take over SIGTERM/SIGINT: uvicorn owns
        # them and ends the lifespan, which stops the worker gracefully.
        self.worker = AsyncWorker(
            self.queue, close_order, concurrency=settings.worker_concurrency,
            handle_signals=False,
        )  # fmt: skip
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        if "relay" in self.roles:
            self._tasks.append(asyncio.create_task(self.relay.run(), name="order_service:relay"))
        if "worker" in self.roles:
            self._tasks.append(asyncio.create_task(self.worker.run(), name="order_service:worker"))

    async def ready(self) -> None:
        """Until the relay (if it runs here) listens on the outbox's channel."""
        if "relay" in self.roles:
            await self.relay.connected.wait()

    async def wait(self) -> None:
        """Until both stop; the first failure is raised, after the other one is stopped."""
        try:
            await asyncio.gather(*self._tasks)
        finally:
            await self.stop()

    async def stop(self) -> None:
        self.relay.stop()
        self.worker.stop()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.queue.close()
