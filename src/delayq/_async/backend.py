"""asyncio primitives the connection layer needs: the client, sleeping, connections."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import NoBackoff
from redis.connection import HiredisRespSerializer
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError

from .._core.connection import Target, Topology
from .._core.urls import safe_url
from ..exceptions import ConfigError

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


def make_client(target: Target, client_name: str, timeout_s: float) -> tuple[Any, list[Any]]:
    """A client for ``target`` and the other clients to close with it (a Sentinel's own).

    It times out after ``timeout_s`` and never retries by itself: the runner's retry loop
    decides, so that its deadlines hold against a hung server or a failover.
    """
    common: dict[str, Any] = {
        "client_name": client_name,
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
        "retry": Retry(NoBackoff(), 0),
    }
    if target.topology is Topology.STANDALONE:
        if target.url.startswith("redis://"):
            common["connection_class"] = _HiredisPackConnection
        try:
            return aioredis.Redis.from_url(target.url, **common), []
        except ValueError as exc:
            raise ConfigError(f"invalid Redis URL {safe_url(target.url)!r}: {exc}") from exc
    auth: dict[str, Any] = {"username": target.username, "password": target.password}
    if target.topology is Topology.SENTINEL:
        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            list(target.hosts),
            sentinel_kwargs={
                "socket_timeout": timeout_s,
                "socket_connect_timeout": timeout_s,
                "username": target.sentinel_username,
                "password": target.sentinel_password,
                "ssl": target.sentinel_tls,
                "retry": Retry(NoBackoff(), 0),
            },
        )
        client = sentinel.master_for(target.service, db=target.db, ssl=target.tls, **auth, **common)
        return client, list(sentinel.sentinels)
    client = aioredis.RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in target.hosts],
        require_full_coverage=False,
        ssl=target.tls,
        **auth,
        **common,
    )
    return client, []


def resolve(client: Any) -> Any:
    """The client itself (the asyncio cluster client connects lazily by itself)."""
    return client


def check_client(redis: object) -> Any:
    """A client passed in, if delayq can use it."""
    if not isinstance(redis, aioredis.Redis | aioredis.RedisCluster):
        raise ConfigError(
            "AsyncDelayQueue needs a redis.asyncio Redis or RedisCluster client, or a URL"
        )
    if redis.get_encoder().decode_responses:
        raise ConfigError("pass a client created with decode_responses=False (tasks are bytes)")
    return redis


def is_cluster(client: Any) -> bool:
    return isinstance(client, aioredis.RedisCluster)


def is_sentinel(client: Any) -> bool:
    """A client whose connections a Sentinel group points at the master."""
    return isinstance(getattr(client, "connection_pool", None), SentinelConnectionPool)


def is_plain(client: Any) -> bool:
    """A plain client whose pooled connections the runner may use directly."""
    return type(client) is aioredis.Redis and client.connection is None


CLIENT_ERRORS: tuple[type[BaseException], ...] = (RedisClusterException,)


async def slot_address(client: Any, slot: int) -> tuple[str, int]:
    """The node that serves ``slot``, as the cluster client last heard."""
    await client.initialize()  # the asyncio cluster client learns its nodes lazily
    node = client.nodes_manager.get_node_from_slot(slot)
    return node.host, int(node.port)


def _node(client: Any, address: tuple[str, int]) -> Any:
    node = client.get_node(host=address[0], port=address[1])
    if node is None:  # a node the client has not met yet: the runner refreshes the topology
        raise RedisConnectionError(f"no known cluster node at {address[0]}:{address[1]}")
    return node


async def node_checkout(client: Any, address: tuple[str, int]) -> Any:
    return _node(client, address).acquire_connection()


async def node_checkin(client: Any, address: tuple[str, int], conn: Any) -> None:
    _node(client, address).release(conn)


async def refresh_topology(client: Any) -> None:
    """Ask the cluster again which node serves which slot (after a node was lost)."""
    await client.nodes_manager.initialize()


def known_slot_address(client: Any, slot: int) -> tuple[str, int] | None:
    """The node that serves ``slot`` as the cluster client last heard, without asking (None:
    it has not heard yet)."""
    try:
        node = client.nodes_manager.get_node_from_slot(slot)
    except Exception:  # an empty or partial slot table: KeyError, SlotNotCoveredError
        return None
    return node.host, int(node.port)


# -- pub/sub connections (the subscriber's) -------------------------------------------------

LOST_ERRORS: tuple[type[BaseException], ...] = (RedisError, *CONNECTION_ERRORS, *CLIENT_ERRORS)


def pubsub_connection(client: Any, address: tuple[str, int] | None) -> Any:
    """A new, unconnected connection for pub/sub, outside the pools' bookkeeping: to the
    cluster node at ``address``, or else to the client's server (a Sentinel client's asks
    the sentinels where the master is when it connects)."""
    if address is None:
        pool = client.connection_pool
        return pool.connection_class(**pool.connection_kwargs)
    node = _node(client, address)
    return node.connection_class(**node.connection_kwargs)


async def ensure_connected(conn: Any) -> None:
    """Connect ``conn`` through its own ``connect()``: redis-py's send path reconnects with
    the base class's, which makes a Sentinel connection dial the old master's address again
    instead of asking the sentinels where the master is now."""
    if not conn.is_connected:
        await conn.connect()


Lock = contextlib.nullcontext  # one task runs at a time: nothing to lock
Interrupted = asyncio.CancelledError  # what a kick raises in the task it lands in


class Wire:
    """One pub/sub connection and the task that reads it: the subscriber's and the Sentinel
    watch's I/O. ``kick()`` cancels the task wherever it is (it takes the cancel as a kick
    with ``kick_taken()``); ``close()`` cancels it for good."""

    def __init__(self) -> None:
        self.closing = False
        self._kicked = False
        self._task: asyncio.Task[None] | None = None
        self._conn: Any = None

    def start(self, run: Callable[[], Coroutine[Any, Any, None]], name: str) -> None:
        self._task = asyncio.create_task(run(), name=name)

    def kick(self) -> None:
        """Drop the connection and dial again at once (wherever the task is)."""
        if self._task is not None and not self.closing and not self._kicked:
            self._kicked = True
            self._task.cancel()

    def kick_taken(self) -> bool:
        """An Interrupted came: whether it was a kick (go on, dialling again at once)."""
        task = asyncio.current_task()
        if self.closing or not self._kicked or task is None:
            return False
        task.uncancel()
        self._kicked = False
        return True

    def retire(self) -> None:
        """No more tries after this one."""
        self.closing = True

    async def close(self) -> None:
        self.closing = True
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def dial(self, conn: Any) -> None:
        self._conn = conn
        await conn.connect()

    def send(self, commands: Sequence[tuple[str, ...]]) -> None:
        """Queue ``commands`` at once, in this order, without waiting: redis-py's own send may
        wait in a task of its own (``wait_for``), so two sends could swap; a failed write shows
        up in the reading task as a lost connection."""
        writer = getattr(self._conn, "_writer", None)
        if writer is None or not commands or writer.is_closing():
            return
        writer.writelines(self._conn.pack_commands(commands))

    async def read(self, timeout: float) -> Any:
        """The next reply or pushed message; None after ``timeout`` seconds of silence."""
        return await self._conn.read_response(timeout=timeout, push_request=True)

    async def pause(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def hang_up(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await disconnect(conn)

    def end(self) -> None:
        """Release what a forked child holds of the wire (nothing here: no fork with a loop)."""


class Hold:
    """A try-lock for the runner's kept connection: one call at a time uses it."""

    def __init__(self) -> None:
        self._busy = False

    def take(self) -> bool:
        if self._busy:
            return False
        self._busy = True
        return True

    def give(self) -> None:
        self._busy = False


def process_id() -> int:
    return 0  # an event loop does not survive a fork


class _HiredisPackConnection(aioredis.Connection):
    """redis.asyncio packs commands in pure Python, re-copying the buffer for every argument:
    a 4,000-argument batch took milliseconds. The sync client's hiredis packer does it in C."""

    _packer = HiredisRespSerializer()

    def pack_command(self, *args: Any) -> list[bytes]:
        return self._packer.pack(*args)  # type: ignore[no-any-return]


async def close_client(client: Any) -> None:
    await client.aclose()


async def disconnect(conn: Any) -> None:
    with contextlib.suppress(Exception):
        await conn.disconnect()


class Bell:
    """Wakes whoever waits for a condition when it may have changed: news on any of a sharded
    queue's shards, a subscription gone live, the end of a Sentinel promotion."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def ring(self) -> None:
        event, self._event = self._event, asyncio.Event()
        event.set()

    async def wait(self, changed: Callable[[], bool], timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for ``changed()``; its last value."""
        deadline = time.monotonic() + timeout
        while not changed():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), remaining)
        return True
