"""Thread primitives the connection layer needs: the client, sleeping, connections."""

from __future__ import annotations

import collections
import contextlib
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis as redis_lib
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool

from .._core.connection import Target, Topology
from .._core.urls import safe_url
from ..exceptions import ConfigError

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


def ensure_connected(conn: Any) -> None:
    """Connect ``conn`` through its own ``connect()``: redis-py's send path reconnects with
    the base class's, which makes a Sentinel connection dial the old master's address again
    instead of asking the sentinels where the master is now."""
    if conn._sock is None:
        conn.connect()


Lock = threading.RLock
JOIN_S = 2.0  # how long close() waits for a wire's thread to end


class Interrupted(Exception):
    """A kick: drop the connection and dial again at once (a failover)."""


class Wire:
    """One pub/sub connection and the thread that alone reads and writes its socket (a TLS
    socket must not be written by one thread while another reads it): other threads queue
    commands with ``send()`` and wake it through a socket pair, as ``kick()`` (it raises
    Interrupted there) and ``close()`` do. It never lets redis-py reconnect by itself inside
    a read, so that ``close()`` can end it without Redis answering."""

    def __init__(self) -> None:
        self.closing = False
        self._kicked = False
        self._thread: threading.Thread | None = None
        self._conn: Any = None
        self._selector: selectors.BaseSelector | None = None
        self._outbox: collections.deque[tuple[str, ...]] = collections.deque()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)

    def start(self, run: Callable[[], None], name: str) -> None:
        self._thread = threading.Thread(target=self._main, args=(run,), name=name, daemon=True)
        self._thread.start()

    def _main(self, run: Callable[[], None]) -> None:
        try:
            with contextlib.suppress(Interrupted):  # a kick that came with close(): it ends
                run()
        finally:
            self.end()

    def kick(self) -> None:
        """Drop the connection and dial again at once."""
        self._kicked = True
        self._poke()

    def kick_taken(self) -> bool:
        """An Interrupted came: whether it was a kick (go on, dialling again at once)."""
        if self.closing or not self._kicked:
            return False
        self._kicked = False
        return True

    def retire(self) -> None:
        """No more tries after this one."""
        self.closing = True
        self._poke()

    def close(self) -> None:
        self.retire()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(JOIN_S)

    def dial(self, conn: Any) -> None:
        self._conn = conn
        conn.connect()
        self._selector = selectors.DefaultSelector()
        self._selector.register(conn._sock, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._check()  # a failover announced while it dialled: maybe to the old master

    def send(self, commands: Sequence[tuple[str, ...]]) -> None:
        """Queue ``commands`` for the thread to send, in this order (from any thread)."""
        self._outbox.extend(commands)
        self._poke()

    def read(self, timeout: float) -> Any:
        """The next reply or pushed message; None after ``timeout`` seconds of silence."""
        conn, deadline = self._conn, time.monotonic() + timeout
        assert self._selector is not None
        while True:
            self._check()
            if self._outbox:
                commands = [self._outbox.popleft() for _ in range(len(self._outbox))]
                conn.send_packed_command(conn.pack_commands(commands), check_health=False)
            if conn.can_read(0):
                return conn.read_response(push_request=True)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self._selector.select(remaining)
            self._drain()

    def pause(self, seconds: float) -> None:
        """Sleep ``seconds``; a kick or close() ends the pause (a kick raises Interrupted)."""
        if not self._kicked and not self.closing:
            with selectors.DefaultSelector() as selector:
                selector.register(self._wake_r, selectors.EVENT_READ)
                selector.select(seconds)
        self._drain()
        if self._kicked and not self.closing:
            raise Interrupted

    def hang_up(self) -> None:
        conn, self._conn = self._conn, None
        self._outbox.clear()
        if self._selector is not None:
            self._selector.close()
            self._selector = None
        if conn is not None:
            disconnect(conn)

    def end(self) -> None:
        """Close the socket pair (the thread is over, or, in a forked child, is not ours)."""
        self._wake_r.close()
        self._wake_w.close()

    def _check(self) -> None:
        if self.closing:  # after close() anything may fail: the caller ends quietly
            raise RedisConnectionError("the connection is being closed")
        if self._kicked:
            raise Interrupted

    def _poke(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"!")

    def _drain(self) -> None:
        with contextlib.suppress(OSError):
            while self._wake_r.recv(4096):
                pass


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
    """Wakes whoever waits for a condition when it may have changed: news on any of a sharded
    queue's shards, a subscription gone live, the end of a Sentinel promotion."""

    def __init__(self) -> None:
        self._cond = threading.Condition()

    def ring(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def wait(self, changed: Callable[[], bool], timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for ``changed()``; its last value."""
        with self._cond:
            return self._cond.wait_for(changed, timeout)
