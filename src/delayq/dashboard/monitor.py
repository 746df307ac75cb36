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

from .. import AsyncDelayQueue, Stats
from .._async import runner
from .._core import sharding
from .._core.keys import QueueKeys
from .._core.text import printable
from ..exceptions import ConfigError

log = logging.getLogger(__name__)

# The overdue threshold of the dashboard's stats, as a queue's default overdue_after.
OVERDUE_MS = 1000


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Stats of every registered queue, read in one round, with the server's clock."""

    server_now: datetime
    stats: Sequence[Stats]


class Monitor:
    """Reads queues for the dashboard; one client shared by every page and the sampler.

    ``timeout`` bounds how long a page waits for an unreachable Redis before it says so. Queue
    objects (~5 KB each) are cached for registered queues only (the pages answer 404 for any
    other name, so another site making a browser request 10,000 names adds nothing); each
    read of the registry drops the ones that left it, and at most ``max_cached`` are kept
    (least recently used dropped first).
    """

    def __init__(
        self, url: str, prefix: str = "dq", *, timeout: float = 2.0, max_cached: int = 4096
    ) -> None:
        self.registry = QueueKeys(prefix, "x").registry  # validates the prefix
        self.url, self.prefix, self.timeout = url, prefix, timeout
        # Any URL form (Sentinel and Cluster too); a page gives up on Redis after ``timeout``.
        self.runner = runner.connect(url, "delayq-dashboard", timeout)
        self.max_cached = max_cached
        self._queues: OrderedDict[str, AsyncDelayQueue] = OrderedDict()
        self._layouts: dict[str, sharding.Layout] = {}

    def queue(self, name: str) -> AsyncDelayQueue:
        """The (cached) queue object of ``name``; raises ConfigError for an invalid name."""
        q = self._queues.get(name)
        if q is None:
            q = AsyncDelayQueue(  # it follows the layout Redis recorded for it
                name, self.runner, prefix=self.prefix, reconnect_timeout=self.timeout / 2
            )
            self._queues[name] = q
            while len(self._queues) > self.max_cached:
                # Dropped without close(): on the shared runner, a queue that never waited
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
        return bool(await self.runner.command("SISMEMBER", self.registry, name))

    async def names(self) -> list[str]:
        """Registered queue names (the set ``<prefix>:queues``), valid ones only, sorted; and
        the recorded layouts of the sharded ones."""
        raw = await self.runner.command("SMEMBERS", self.registry)
        counts = await self.runner.command("HGETALL", sharding.shards_key(self.prefix))
        layouts = sharding.layouts_of(counts)
        changed = {n for n, layout in layouts.items() if self._layouts.get(n) != layout}
        self._layouts = layouts
        names = []
        for value in sorted({bytes(v).decode(errors="replace") for v in raw}):
            try:
                QueueKeys(self.prefix, value)
            except ConfigError:
                log.warning("dashboard: skipping invalid queue name %s", printable(value))
                continue
            names.append(value)
        registered = set(names)
        for gone in [n for n in self._queues if n not in registered or n in changed]:
            del self._queues[gone]  # left the registry, or resharded: open it afresh
        return names

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
            plan = sharding.StatsPlan(
                self.prefix, names[start : start + step], self._layouts, OVERDUE_MS
            )
            stats += plan.stats(await self.runner.many(plan.calls))
            if start + step < len(names):
                await asyncio.sleep(0)  # let pages in between rounds
        return Snapshot(now, stats)

    async def close(self) -> None:
        for q in self._queues.values():
            await q.close()
        await self.runner.close()
