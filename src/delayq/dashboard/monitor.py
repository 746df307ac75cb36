"""The dashboard's view of Redis: the queue registry and every queue's stats in one round.

A page with 100 queues must not cost 100 round trips. :class:`BatchingRedis` sends the
commands issued in one event-loop turn as a single pipeline, so ``asyncio.gather`` over the
public ``AsyncDelayQueue.stats()`` of every queue is one network round (plus one more the first
time, to load the script).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from .. import AsyncDelayQueue, Stats
from .._core.keys import QueueKeys
from .._core.text import printable
from ..exceptions import ConfigError, RedisUnavailable

log = logging.getLogger(__name__)

_Pending = tuple[tuple[Any, ...], dict[str, Any], "asyncio.Future[Any]"]


class BatchingRedis(aioredis.Redis):
    """A ``redis.asyncio`` client that pipelines the commands issued in one loop turn."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pending: list[_Pending] = []
        self._flushing: set[asyncio.Task[None]] = set()

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.append((args, options, future))
        if len(self._pending) == 1:
            # Runs after every coroutine already scheduled had its turn to add its command.
            task = asyncio.ensure_future(self._flush())
            self._flushing.add(task)
            task.add_done_callback(self._flushing.discard)
        return await future

    async def _flush(self) -> None:
        batch, self._pending = self._pending, []
        try:
            async with self.pipeline(transaction=False) as pipe:
                for args, options, _ in batch:
                    pipe.execute_command(*args, **options)
                results = await pipe.execute(raise_on_error=False)
        except BaseException as exc:  # the whole round failed: every caller gets the error
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for (_, _, future), result in zip(batch, results, strict=True):
            if future.done():
                continue
            if isinstance(result, Exception):
                future.set_exception(result)
            else:
                future.set_result(result)


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
        try:
            self.client = BatchingRedis.from_url(
                url,
                client_name="delayq-dashboard",
                socket_timeout=timeout,
                socket_connect_timeout=timeout,
                retry=Retry(NoBackoff(), 0),
            )
        except ValueError as exc:
            raise ConfigError(f"invalid Redis URL: {exc}") from exc
        self.max_cached = max_cached
        self._queues: OrderedDict[str, AsyncDelayQueue] = OrderedDict()

    def queue(self, name: str) -> AsyncDelayQueue:
        """The (cached) queue object of ``name``; raises ConfigError for an invalid name."""
        q = self._queues.get(name)
        if q is None:
            q = AsyncDelayQueue(
                name, self.client, prefix=self.prefix, reconnect_timeout=self.timeout / 2
            )
            self._queues[name] = q
            while len(self._queues) > self.max_cached:
                # Dropped without close(): on a client it was given, a queue that never
                # waited for a task holds no connection and no listener of its own.
                self._queues.popitem(last=False)
        else:
            self._queues.move_to_end(name)
        return q

    @property
    def cached(self) -> int:
        return len(self._queues)

    async def is_registered(self, name: str) -> bool:
        """Whether ``name`` is in the registry (a queue registers on its first offer)."""
        try:
            return bool(await self.client.sismember(self.registry, name))
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"cannot read {self.registry}: {exc}") from exc

    async def names(self) -> list[str]:
        """Registered queue names (the set ``<prefix>:queues``), valid ones only, sorted."""
        try:
            raw = [v async for v in self.client.sscan_iter(self.registry, count=1000)]
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"cannot read {self.registry}: {exc}") from exc
        names = []
        for value in sorted({bytes(v).decode(errors="replace") for v in raw}):
            try:
                QueueKeys(self.prefix, value)
            except ConfigError:
                log.warning("dashboard: skipping invalid queue name %s", printable(value))
                continue
            names.append(value)
        registered = set(names)
        for gone in [n for n in self._queues if n not in registered]:
            del self._queues[gone]
        return names

    async def server_now(self) -> datetime:
        """Redis's clock (all due and lease times are on it)."""
        try:
            seconds, micros = await self.client.time()
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"Redis did not answer TIME: {exc}") from exc
        return datetime.fromtimestamp(seconds + micros / 1e6, UTC)

    async def snapshot(
        self, names: Sequence[str] | None = None, *, chunk: int | None = None
    ) -> Snapshot:
        """Stats of ``names`` (default: every registered queue) and the server's time, in one
        round, or in rounds of ``chunk`` queues: parsing 2,000 replies takes the event loop
        for ~50 ms, and pages served meanwhile would wait that long."""
        if names is None:
            names = await self.names()
        step = chunk or max(1, len(names))
        now, stats = await asyncio.gather(
            self.server_now(), asyncio.gather(*(self.queue(n).stats() for n in names[:step]))
        )
        for start in range(step, len(names), step):
            part = names[start : start + step]
            stats += await asyncio.gather(*(self.queue(n).stats() for n in part))
        return Snapshot(now, stats)

    async def close(self) -> None:
        for q in self._queues.values():
            await q.close()
        await self.client.aclose()
