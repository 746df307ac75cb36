"""The dashboard's view of Redis: the queue registry and every queue's stats in one round.

A page with 100 queues must not cost 100 round trips. :class:`BatchingRedis` sends the
commands issued in one event-loop turn as a single pipeline, so ``asyncio.gather`` over the
public ``AsyncDelayQueue.stats()`` of every queue is one network round (plus one more the first
time, to load the script).
"""

from __future__ import annotations

import asyncio
import logging
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

    ``timeout`` bounds how long a page waits for an unreachable Redis before it says so.
    """

    def __init__(self, url: str, prefix: str = "dq", *, timeout: float = 2.0) -> None:
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
        self._queues: dict[str, AsyncDelayQueue] = {}

    def queue(self, name: str) -> AsyncDelayQueue:
        """The (cached) queue object of ``name``; raises ConfigError for an invalid name."""
        q = self._queues.get(name)
        if q is None:
            q = AsyncDelayQueue(
                name, self.client, prefix=self.prefix, reconnect_timeout=self.timeout / 2
            )
            self._queues[name] = q
        return q

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
                log.warning("dashboard: skipping invalid queue name %r", value)
                continue
            names.append(value)
        return names

    async def server_now(self) -> datetime:
        """Redis's clock (all due and lease times are on it)."""
        try:
            seconds, micros = await self.client.time()
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"Redis did not answer TIME: {exc}") from exc
        return datetime.fromtimestamp(seconds + micros / 1e6, UTC)

    async def snapshot(self, names: Sequence[str] | None = None) -> Snapshot:
        """Stats of ``names`` (default: every registered queue) and the server's time."""
        if names is None:
            names = await self.names()
        now, stats = await asyncio.gather(
            self.server_now(), asyncio.gather(*(self.queue(name).stats() for name in names))
        )
        return Snapshot(now, stats)

    async def close(self) -> None:
        for q in self._queues.values():
            await q.close()
        await self.client.aclose()
