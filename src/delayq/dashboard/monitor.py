"""The dashboard's view of Redis: the queue registry and every queue's stats in one round.

A page with 100 queues must not cost 100 round trips: the stats of every queue shown (a
sharded queue's shards included) are read through the connection layer's ``many()``, one
pipelined round per Redis node, as the exporter reads them.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from .. import AsyncDelayQueue, Stats
from .._async import runner
from .._async.connection import AsyncConnection, shared_or_new
from .._core import sharding
from .._core.text import printable
from .._core.timing import Duration

log = logging.getLogger(__name__)

# The overdue threshold of the dashboard's stats, as a queue's default overdue_after.
OVERDUE_S = 1.0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Stats of every registered queue, read in one round, with the server's clock."""

    server_now: datetime
    stats: Sequence[Stats]


class Monitor:
    """Reads queues for the dashboard, through one connection handle shared by every page
    and the sampler (its own, or one passed in as ``redis`` and left open by close()).

    ``reconnect_timeout`` bounds how long a page waits for an unreachable Redis before it
    says so. Queue objects (~5 KB each) are cached for registered queues only (the pages
    answer 404 for any other name, so another site making a browser request 10,000 names
    adds nothing); each read of the registry drops the ones that left it, and at most
    ``max_cached`` are kept (least recently used dropped first).
    """

    def __init__(
        self,
        redis: str | AsyncConnection,
        prefix: str | None = None,
        *,
        reconnect_timeout: Duration = 2.0,
        max_cached: int = 4096,
    ) -> None:
        # Any URL form (Sentinel and Cluster too); a page gives up on Redis after the timeout.
        self.connection, self._owns_connection = shared_or_new(
            redis,
            reconnect_timeout=None if isinstance(redis, AsyncConnection) else reconnect_timeout,
            prefix=prefix,
            client_name="delayq-dashboard",
        )
        self.prefix = self.connection.prefix  # None: the handle's, else "dq"
        self.max_cached = max_cached
        self._queues: OrderedDict[str, AsyncDelayQueue[Any]] = OrderedDict()
        self._layouts: dict[str, sharding.Layout] = {}

    @property
    def runner(self) -> runner.Runner:
        """The connection layer's runner under the handle."""
        return self.connection.runner

    def queue(self, name: str) -> AsyncDelayQueue[Any]:
        """The (cached) queue object of ``name``; raises ConfigError for an invalid name."""
        q = self._queues.get(name)
        if q is None:
            q = self.connection.queue(name)  # it follows the layout Redis recorded for it
            self._queues[name] = q
            while len(self._queues) > self.max_cached:
                # Dropped without close(): on the shared handle, a queue that never waited
                # for a task holds no connection and no listener of its own.
                self._queues.popitem(last=False)
        else:
            self._queues.move_to_end(name)
        return q

    @property
    def cached(self) -> int:
        return len(self._queues)

    async def is_registered(self, name: str) -> bool:
        """Whether ``name`` is in the registry (a queue registers on its first offer)."""
        return await self.connection.is_registered(name)

    async def names(self) -> list[str]:
        """Registered queue names (the set ``<prefix>:queues``), valid ones only, sorted;
        queue objects of names that left it, or whose layout changed, are dropped."""
        registry = await self.connection.registry()
        for value in registry.invalid:
            log.warning("dashboard: skipping invalid queue name %s", printable(value))
        layouts = dict(registry.layouts)
        changed = {n for n, layout in layouts.items() if self._layouts.get(n) != layout}
        self._layouts = layouts
        registered = set(registry.names)
        for gone in [n for n in self._queues if n not in registered or n in changed]:
            del self._queues[gone]  # left the registry, or resharded: open it afresh
        return list(registry.names)

    async def server_now(self) -> datetime:
        """Redis's clock (all due and lease times are on it)."""
        seconds, micros = await self.runner.command("TIME")
        return datetime.fromtimestamp(seconds + micros / 1e6, UTC)

    async def snapshot(
        self, names: Sequence[str] | None = None, *, chunk: int | None = None
    ) -> Snapshot:
        """Stats of ``names`` (default: every registered queue) and the server's time, in one
        round per Redis node, or in rounds of ``chunk`` queues: parsing 2,000 replies takes
        the event loop for ~50 ms, and pages served meanwhile would wait that long."""
        if names is None:
            names = await self.names()
        step = chunk or max(1, len(names))
        now = await self.server_now()
        stats: list[Stats] = []
        for start in range(0, len(names), step):
            part = names[start : start + step]
            stats += await self.connection.stats(part, overdue_after=OVERDUE_S)
            if start + step < len(names):
                await asyncio.sleep(0)  # let pages in between rounds
        return Snapshot(now, stats)

    async def close(self) -> None:
        queues, self._queues = list(self._queues.values()), OrderedDict()
        for q in queues:
            await q.close()
        if self._owns_connection:
            await self.connection.close()
