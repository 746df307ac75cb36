"""Thread primitives the connection layer needs: the client, sleeping, connections."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import redis as redis_lib
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool

from .._core.connection import FailoverNews, Target, Topology, failover_news, new_master_of
from .._core.urls import safe_url
from ..exceptions import ConfigError

log = logging.getLogger("delayq")
monotonic = time.monotonic
CONNECTION_ERRORS = (ConnectionError, TimeoutError, OSError)


def sleep(seconds: float) -> None:
    time.sleep(seconds)


TIMER_SLACK = 0.0  # threads' timed waits end within ~0.1 ms of their time (see the asyncio side)


def wait_out(until: float) -> None:
    """Nothing to wait out: a thread's timed wait already ended at ``until``."""


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
        try:
            return redis_lib.Redis.from_url(target.url, **common), []
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
        client = sentinel.master_for(  # type: ignore[no-untyped-call]
            target.service, db=target.db, ssl=target.tls, **auth, **common
        )
        return client, list(sentinel.sentinels)
    # redis-py's sync cluster client connects in its constructor; it is made on first use.
    return _LazyCluster(target, auth, common), []


class _LazyCluster:
    """Builds the sync ``RedisCluster`` on first use, so that a queue can be made while the
    cluster is down (the asyncio client is lazy by itself)."""

    def __init__(self, target: Target, auth: dict[str, Any], common: dict[str, Any]) -> None:
        self._args = (target, auth, common)
        self._client: redis_lib.RedisCluster | None = None

    def build(self) -> redis_lib.RedisCluster:
        if self._client is None:
            self._client = self._make()
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def _make(self) -> redis_lib.RedisCluster:
        target, auth, common = self._args
        return redis_lib.RedisCluster(
            startup_nodes=[
                ClusterNode(host, port)  # type: ignore[no-untyped-call]
                for host, port in target.hosts
            ],
            require_full_coverage=False,
            ssl=target.tls,
            **auth,
            **common,
        )


def resolve(client: Any) -> Any:
    """The client itself, built now if it was made lazily."""
    return client.build() if isinstance(client, _LazyCluster) else client


def check_client(redis: object) -> Any:
    """A client passed in, if delayq can use it."""
    if not isinstance(redis, redis_lib.Redis | redis_lib.RedisCluster):
        raise ConfigError("DelayQueue needs a redis.Redis or redis.RedisCluster client, or a URL")
    if redis.get_encoder().decode_responses:
        raise ConfigError("pass a client created with decode_responses=False (tasks are bytes)")
    return redis


def is_cluster(client: Any) -> bool:
    return isinstance(client, redis_lib.RedisCluster | _LazyCluster)


def is_sentinel(client: Any) -> bool:
    """A client whose connections a Sentinel group points at the master."""
    return isinstance(getattr(client, "connection_pool", None), SentinelConnectionPool)


def is_plain(client: Any) -> bool:
    """A plain client whose pooled connections the runner may use directly."""
    return type(client) is redis_lib.Redis and client.connection is None


CLIENT_ERRORS: tuple[type[BaseException], ...] = (RedisClusterException,)


def slot_address(client: Any, slot: int) -> tuple[str, int]:
    """The node that serves ``slot``, as the cluster client last heard."""
    node = client.nodes_manager.get_node_from_slot(slot)
    return node.host, int(node.port)


def _pool(client: Any, address: tuple[str, int]) -> Any:
    node = client.get_node(host=address[0], port=address[1])
    if node is None:  # a node the client has not met yet: the runner refreshes the topology
        raise RedisConnectionError(f"no known cluster node at {address[0]}:{address[1]}")
    return client.get_redis_connection(node).connection_pool


def node_checkout(client: Any, address: tuple[str, int]) -> Any:
    return _pool(client, address).get_connection()


def node_checkin(client: Any, address: tuple[str, int], conn: Any) -> None:
    _pool(client, address).release(conn)


def refresh_topology(client: Any) -> None:
    """Ask the cluster again which node serves which slot (after a node was lost)."""
    client.nodes_manager.initialize()


def known_slot_address(client: Any, slot: int) -> tuple[str, int] | None:
    """The node that serves ``slot`` as the cluster client last heard, without asking (None:
    it has not heard yet, or a lazy client is not built yet)."""
    if isinstance(client, _LazyCluster):
        if client._client is None:
            return None
        client = client._client
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
    the sentinels where the master is when it connects). Built from the pool's settings but
    outside its bookkeeping: make_connection() would count it against max_connections."""
    client = resolve(client)
    pool = client.connection_pool if address is None else _pool(client, address)
    return pool.connection_class(**pool.connection_kwargs)


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


def ensure_connected(conn: Any) -> None:
    """Connect ``conn`` through its own ``connect()``: redis-py's send path reconnects with
    the base class's, which makes a Sentinel connection dial the old master's address again
    instead of asking the sentinels where the master is now."""
    if conn._sock is None:
        conn.connect()


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
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._open = threading.Event()  # set: calls may go; clear: a promotion is under way
        self._open.set()
        self._held_until = 0.0
        self._conns: list[Any] = []

    def start(self) -> None:
        if self._pool is None or self._threads:
            return
        for sentinel in self._pool.sentinel_manager.sentinels:
            thread = threading.Thread(
                target=self._watch, args=(sentinel,), name="delayq-sentinel", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def wait(self, deadline: float | None) -> bool:
        """Wait while a promotion is under way, until ``deadline`` at the most (or HOLD_S
        after the promotion began); whether calls may go now."""
        if self._open.is_set():
            return True
        until = self._held_until if deadline is None else min(self._held_until, deadline)
        self._open.wait(max(until - time.monotonic(), 0))
        return self._open.is_set() or time.monotonic() >= self._held_until

    def _event(self, sentinel: Any, channel: str, data: bytes) -> None:
        assert self._pool is not None
        news = failover_news(channel, data, self._pool.service_name)
        if news is FailoverNews.SWITCHED:
            log.info("delayq: Sentinel switched the master: %s", data.decode(errors="replace"))
            # Ask this sentinel first from now on: the others may still name the old master
            # for a second or two, and a reconnect there would write to it again.
            sentinels = self._pool.sentinel_manager.sentinels
            if sentinel in sentinels:
                sentinels.remove(sentinel)
                sentinels.insert(0, sentinel)
            self._pool.disconnect()
            self._open.set()
            if self._on_switch is not None:
                self._on_switch(new_master_of(data))
        elif news is FailoverNews.PROMOTING:
            self._held_until = time.monotonic() + HOLD_S
            self._open.clear()
        elif news is FailoverNews.ABORTED:  # the old master stays
            self._open.set()

    def _watch(self, sentinel: Any) -> None:
        pool = sentinel.connection_pool
        backoff = 0.05
        while not self._stop.is_set():
            conn = pool.connection_class(**pool.connection_kwargs)
            self._conns.append(conn)
            try:
                conn.connect()
                conn.send_command("SUBSCRIBE", *SENTINEL_EVENTS)
                for _ in SENTINEL_EVENTS:
                    conn.read_response(push_request=True)
                backoff = 0.05
                while not self._stop.is_set():
                    if not conn.can_read(timeout=5.0):
                        if not self._open.is_set() and time.monotonic() > self._held_until:
                            self._open.set()  # no new master announced in time: go on
                        continue
                    message = conn.read_response(push_request=True)
                    if message and _str(message[0]) == "message":
                        self._event(sentinel, _str(message[1]), bytes(message[2]))
            except Exception as exc:  # a sentinel down: try it again after a pause
                if not self._stop.is_set():
                    log.debug("delayq: watching a sentinel failed (%s); retrying", exc)
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, 2.0)
            finally:
                self._conns.remove(conn)
                with contextlib.suppress(Exception):
                    conn.disconnect()

    def close(self) -> None:
        if not self._threads:
            return
        self._stop.set()
        self._open.set()
        for conn in list(self._conns):
            sock = getattr(conn, "_sock", None)
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(2.0)
        self._threads = []


class Hold:
    """A try-lock for the runner's kept connection: one thread at a time uses it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def take(self) -> bool:
        return self._lock.acquire(blocking=False)

    def give(self) -> None:
        self._lock.release()


process_id = os.getpid  # a connection kept before a fork belongs to the parent


def close_client(client: Any) -> None:
    client.close()


def disconnect(conn: Any) -> None:
    with contextlib.suppress(Exception):
        conn.disconnect()


class Bell:
    """Wakes a waiter on news from any of several notifiers (a sharded queue's shards)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()

    def ring(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def wait(self, changed: Callable[[], bool], timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for ``changed()``; its last value."""
        with self._cond:
            return self._cond.wait_for(changed, timeout)


def _str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
