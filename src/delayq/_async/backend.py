"""asyncio primitives the queue needs: the client, sleeping, and the wake-up listener."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.connection import HiredisRespSerializer
from redis.exceptions import RedisError

from .._core.wakeups import WakeLog, due_of
from ..exceptions import ConfigError

log = logging.getLogger("delayq")
monotonic = time.monotonic
CONNECTION_ERRORS = (ConnectionError, TimeoutError, OSError)


async def sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


# asyncio's timers fire on epoll's millisecond ticks, rounded up: ~0.7 ms late at the median,
# up to 1.1 ms (threads' timed waits: ~0.1 ms). A consumer waits for a due time by the timer
# until TIMER_SLACK before it, then yields to the loop until the time (wait_out).
TIMER_SLACK = 0.0012


async def wait_out(until: float) -> None:
    """Yield to the event loop until the monotonic time ``until`` (at most TIMER_SLACK away):
    other tasks run meanwhile; this one costs a loop turn at a time."""
    while time.monotonic() < until:
        await asyncio.sleep(0)


def connect(redis: object, client_name: str, timeout_s: float) -> tuple[Any, bool]:
    """The client to use and whether the queue owns (and so closes) it.

    A client made here times out after ``timeout_s`` and never retries by itself: the queue's
    own retry loop decides, so that its deadlines hold against a hung server.
    """
    if redis is None or isinstance(redis, str):
        url = redis or "redis://127.0.0.1:6379/0"
        extra: dict[str, Any] = {}
        if url.startswith("redis://"):
            extra["connection_class"] = _HiredisPackConnection
        client = aioredis.Redis.from_url(
            url,
            client_name=client_name,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
            **extra,
        )
        return client, True
    if not isinstance(redis, aioredis.Redis | aioredis.RedisCluster):
        raise ConfigError(
            "AsyncDelayQueue needs a redis.asyncio Redis or RedisCluster client, or a URL"
        )
    if redis.get_encoder().decode_responses:
        raise ConfigError("pass a client created with decode_responses=False (tasks are bytes)")
    return redis, False


def pipelines_scripts(client: Any) -> bool:
    """Whether ``client`` sends EVALSHA in pipelines (redis-py's cluster clients refuse to)."""
    return not isinstance(client, aioredis.RedisCluster)


class _HiredisPackConnection(aioredis.Connection):
    """redis.asyncio packs commands in pure Python, re-copying the buffer for every argument:
    a 4,000-argument batch took milliseconds. The sync client's hiredis packer does it in C."""

    _packer = HiredisRespSerializer()

    def pack_command(self, *args: Any) -> list[bytes]:
        return self._packer.pack(*args)  # type: ignore[no-any-return]


class ScriptLane:
    """Runs the queue's EVALSHA calls on a connection it keeps checked out of the client's pool.

    redis-py's own path costs ~30 us of a ~120 us call here: its per-command retry and
    observability layers, and a socket poll on every pool checkout. The lane is used only on a
    plain client the queue made itself (a client passed in keeps its hooks and instrumentation);
    the queue retries by itself, and a connection that fails (or whose call is cancelled) drops
    its socket and reconnects on the next call. Concurrent calls go through the pool.
    """

    def __init__(self, client: Any, owned: bool) -> None:
        self._client = client
        self._direct = owned and type(client) is aioredis.Redis and client.connection is None
        self._busy = False
        self._conn: Any = None

    async def evalsha(self, sha: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        if not self._direct or self._busy:
            return await self._client.evalsha(sha, len(keys), *keys, *args)
        self._busy = True
        try:
            if self._conn is None:
                self._conn = await self._client.connection_pool.get_connection()
            await self._conn.send_command("EVALSHA", sha, len(keys), *keys, *args)
            return await self._conn.read_response()
        finally:
            self._busy = False

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await self._client.connection_pool.release(conn)


async def close_client(client: Any) -> None:
    await client.aclose()


class Notifier:
    """Listens on the queue's channel and wakes waiting consumers.

    Messages carry the new earliest due time; they are hints only. After a reconnect the
    listener wakes everybody with an unknown time, so waiters look at Redis again.
    """

    def __init__(self, client: Any, channel: str) -> None:
        self._client = client
        self._channel = channel
        self._task: asyncio.Task[None] | None = None
        self._subscribed = asyncio.Event()
        self._changed = asyncio.Event()
        self._log = WakeLog()

    async def start(self) -> None:
        """Subscribe (once); returns when the subscription is live or after a short wait."""
        if self._task is None:
            self._task = asyncio.create_task(self._listen(), name=f"delayq:{self._channel}")
        if not self._subscribed.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._subscribed.wait(), 1.0)

    def mark(self) -> int:
        return self._log.generation

    async def wait(self, mark: int, timeout: float) -> tuple[int, int | None] | None:
        """Wait for news after ``mark``: (new mark, earliest announced due ms, None if
        unknown), or None on timeout."""
        while self._log.generation == mark:
            changed = self._changed
            try:
                await asyncio.wait_for(changed.wait(), timeout)
            except TimeoutError:
                return None
        return self._log.news_since(mark)

    def _push(self, due_ms: int | None) -> None:
        self._log.push(due_ms)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _listen(self) -> None:
        backoff = 0.05
        first = True
        while True:
            pubsub = self._client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self._channel)
                self._subscribed.set()
                if not first:
                    log.info("delayq: resubscribed to %s", self._channel)
                    self._push(None)  # messages may have been missed while away
                first, backoff = False, 0.05
                while True:
                    message = await pubsub.get_message(timeout=30.0)
                    if message is not None:
                        self._push(due_of(message["data"]))
            except Exception as exc:  # the listener must outlive any error; cancel ends it
                if not isinstance(exc, RedisError | OSError):
                    log.exception("delayq: listener on %s failed; restarting", self._channel)
                else:
                    log.warning(
                        "delayq: listener on %s lost Redis (%s); retrying", self._channel, exc
                    )
                self._push(None)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
            self._push(None)  # waiters look at the queue again, and find it closed


class Listener:
    """A background :class:`~delayq.AsyncWorker` on one queue, from ``add_listener``."""

    def __init__(self, worker: Any, task: asyncio.Task[None]) -> None:
        self.worker = worker
        self._task = task

    @classmethod
    def start(cls, queue: Any, handler: Any, concurrency: int, timeout: float | None) -> Listener:
        from .._workers.async_worker import AsyncWorker

        worker = AsyncWorker(
            queue, handler, concurrency=concurrency, timeout=timeout, handle_signals=False
        )
        return cls(worker, asyncio.ensure_future(worker.run()))

    async def stop(self) -> None:
        """Stop fetching, let running handlers finish, hand back the rest."""
        self.worker.stop()
        await self._task
