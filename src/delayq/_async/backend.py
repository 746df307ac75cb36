"""asyncio primitives the connection layer needs: the client, sleeping, connections."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import NoBackoff
from redis.connection import HiredisRespSerializer
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError

from .._core.connection import FailoverNews, Target, Topology, failover_news, new_master_of
from .._core.urls import safe_url
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


def pubsub_where(client: Any) -> str:
    """The server a non-cluster client's pub/sub connection goes to, for log lines."""
    pool = client.connection_pool
    if isinstance(pool, SentinelConnectionPool):
        return f"the master of {pool.service_name}"
    kwargs = pool.connection_kwargs
    if kwargs.get("path"):
        return str(kwargs["path"])
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"


def peer_of(conn: Any) -> tuple[str, int] | None:
    """The address a connection went to (None for a Unix socket)."""
    host, port = getattr(conn, "host", None), getattr(conn, "port", None)
    return (host, int(port)) if isinstance(host, str) and port is not None else None


def master_address(client: Any) -> tuple[str, int] | None:
    """The master a Sentinel client's connections last went to (None: not a Sentinel one)."""
    address = getattr(getattr(client, "connection_pool", None), "master_address", None)
    return (str(address[0]), int(address[1])) if address else None


def write_now(conn: Any, commands: list[tuple[str, ...]]) -> None:
    """Queue ``commands`` on a connected ``conn`` at once, in this order, without waiting:
    redis-py's own send may wait in a task of its own (``wait_for``), so two sends could
    swap; a failed write shows up in the reader task as a lost connection."""
    writer = getattr(conn, "_writer", None) if conn is not None else None
    if writer is None or not commands or writer.is_closing():
        return
    writer.writelines(conn.pack_commands(commands))


async def hang_up(conn: Any) -> None:
    """Close ``conn`` without waiting on the server (which may be hung)."""
    with contextlib.suppress(Exception):
        await conn.disconnect(nowait=True)


async def ensure_connected(conn: Any) -> None:
    """Connect ``conn`` through its own ``connect()``: redis-py's send path reconnects with
    the base class's, which makes a Sentinel connection dial the old master's address again
    instead of asking the sentinels where the master is now."""
    if not conn.is_connected:
        await conn.connect()


# What a sentinel announces about a failover (SENTINEL's pub/sub channels), and how long calls
# wait between a promotion's start and the new master's announcement before they go on.
SENTINEL_EVENTS = (
    "+failover-state-send-slaveof-noone",
    "+switch-master",
    "-failover-abort-not-elected",
    "-failover-abort-no-good-slave",
    "-failover-abort-slave-timeout",
)
HOLD_S = 10.0


class SentinelWatch:
    """Follows the sentinels' announcements of a Sentinel client's failovers.

    When the leading sentinel is about to promote a replica (``+failover-state-send-slaveof-
    noone``), calls wait; when it announces the new master (``+switch-master``), the client's
    connections are dropped (they reconnect through the sentinels, to the new master) and
    calls go on. Without this, a graceful failover leaves the old master taking writes until
    Sentinel demotes it, seconds later, and its demotion discards them. Every sentinel is
    watched: only the leader announces the promotion. ``on_switch`` is called after each
    switch with the new master's address (the subscriber's pub/sub connections follow).
    Any other client: does nothing.
    """

    def __init__(
        self, client: Any, on_switch: Callable[[tuple[str, int] | None], None] | None = None
    ) -> None:
        pool = getattr(client, "connection_pool", None)
        self._pool = pool if isinstance(pool, SentinelConnectionPool) else None
        self._on_switch = on_switch  # told of a new master after the connections were dropped
        self._tasks: list[asyncio.Task[None]] = []
        self._open: asyncio.Event | None = None  # set: calls may go; clear: a promotion
        self._held_until = 0.0

    def start(self) -> None:
        if self._pool is None or self._tasks:
            return
        self._open = asyncio.Event()
        self._open.set()
        self._tasks = [
            asyncio.ensure_future(self._watch(sentinel))
            for sentinel in self._pool.sentinel_manager.sentinels
        ]

    async def wait(self, deadline: float | None) -> bool:
        """Wait while a promotion is under way, until ``deadline`` at the most (or HOLD_S
        after the promotion began); whether calls may go now."""
        if self._open is None or self._open.is_set():
            return True
        until = self._held_until if deadline is None else min(self._held_until, deadline)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._open.wait(), max(until - time.monotonic(), 0))
        return self._open.is_set() or time.monotonic() >= self._held_until

    async def _event(self, sentinel: Any, channel: str, data: bytes) -> None:
        assert self._pool is not None and self._open is not None
        news = failover_news(channel, data, self._pool.service_name)
        if news is FailoverNews.SWITCHED:
            log.info("delayq: Sentinel switched the master: %s", data.decode(errors="replace"))
            # Ask this sentinel first from now on: the others may still name the old master
            # for a second or two, and a reconnect there would write to it again.
            sentinels = self._pool.sentinel_manager.sentinels
            if sentinel in sentinels:
                sentinels.remove(sentinel)
                sentinels.insert(0, sentinel)
            await self._pool.disconnect()
            self._open.set()
            if self._on_switch is not None:
                self._on_switch(new_master_of(data))
        elif news is FailoverNews.PROMOTING:
            self._held_until = time.monotonic() + HOLD_S
            self._open.clear()
        elif news is FailoverNews.ABORTED:  # the old master stays
            self._open.set()

    async def _watch(self, sentinel: Any) -> None:
        assert self._open is not None
        backoff = 0.05
        while True:
            pubsub = sentinel.pubsub()
            try:
                await pubsub.subscribe(*SENTINEL_EVENTS)
                backoff = 0.05
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=5)
                    if message is None:
                        if not self._open.is_set() and time.monotonic() > self._held_until:
                            self._open.set()  # no new master announced in time: go on
                        continue
                    channel = message["channel"]
                    channel = channel.decode() if isinstance(channel, bytes) else channel
                    await self._event(sentinel, channel, bytes(message["data"]))
            except Exception as exc:  # a sentinel down: try it again after a pause
                log.debug("delayq: watching a sentinel failed (%s); retrying", exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()

    async def close(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._open is not None:
            self._open.set()


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
    """Wakes a waiter on news from any of several notifiers (a sharded queue's shards)."""

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
