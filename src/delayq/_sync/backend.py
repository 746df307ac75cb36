"""Thread primitives the queue needs: the client, sleeping, and the wake-up listener."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

import redis as redis_lib
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from .._core.wakeups import WakeLog, due_of
from ..exceptions import ConfigError

log = logging.getLogger("delayq")
monotonic = time.monotonic
CONNECTION_ERRORS = (ConnectionError, TimeoutError, OSError)


def sleep(seconds: float) -> None:
    time.sleep(seconds)


TIMER_SLACK = 0.0  # threads' timed waits end within ~0.1 ms of their time (see the asyncio side)


def wait_out(until: float) -> None:
    """Nothing to wait out: a thread's timed wait already ended at ``until``."""


def connect(redis: object, client_name: str, timeout_s: float) -> tuple[Any, bool]:
    """The client to use and whether the queue owns (and so closes) it.

    A client made here times out after ``timeout_s`` and never retries by itself: the queue's
    own retry loop decides, so that its deadlines hold against a hung server.
    """
    if redis is None or isinstance(redis, str):
        url = redis or "redis://127.0.0.1:6379/0"
        client = redis_lib.Redis.from_url(
            url,
            client_name=client_name,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
        )
        return client, True
    if not isinstance(redis, redis_lib.Redis | redis_lib.RedisCluster):
        raise ConfigError("DelayQueue needs a redis.Redis or redis.RedisCluster client, or a URL")
    if redis.get_encoder().decode_responses:
        raise ConfigError("pass a client created with decode_responses=False (tasks are bytes)")
    return redis, False


def pipelines_scripts(client: Any) -> bool:
    """Whether ``client`` sends EVALSHA in pipelines (redis-py's cluster clients refuse to)."""
    return not isinstance(client, redis_lib.RedisCluster)


class ScriptLane:
    """Runs the queue's EVALSHA calls on a connection it keeps checked out of the client's pool.

    redis-py's own path costs ~30 us of a ~120 us call here: its per-command retry and
    observability layers, and a socket poll on every pool checkout. The lane is used only on a
    plain client the queue made itself (a client passed in keeps its hooks and instrumentation);
    the queue retries by itself, and a connection that fails drops its socket and reconnects on
    the next call. A call made while another thread holds the lane goes through the pool.
    """

    def __init__(self, client: Any, owned: bool) -> None:
        self._client = client
        self._direct = owned and type(client) is redis_lib.Redis and client.connection is None
        self._lock = threading.Lock()
        self._conn: Any = None
        self._pid = 0

    def evalsha(self, sha: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        if not self._direct or not self._lock.acquire(blocking=False):
            return self._client.evalsha(sha, len(keys), *keys, *args)
        try:
            if self._conn is None or self._pid != os.getpid():  # after a fork: not ours
                self._conn = self._client.connection_pool.get_connection()
                self._pid = os.getpid()
            self._conn.send_command("EVALSHA", sha, len(keys), *keys, *args)
            return self._conn.read_response()
        finally:
            self._lock.release()

    def close(self) -> None:
        if not self._lock.acquire(blocking=False):  # a call in flight: closing the client ends it
            return
        try:
            conn, self._conn = self._conn, None
            if conn is not None and self._pid == os.getpid():
                self._client.connection_pool.release(conn)
        finally:
            self._lock.release()


def close_client(client: Any) -> None:
    client.close()


class Notifier:
    """Listens on the queue's channel in a daemon thread and wakes waiting consumers.

    Messages carry the new earliest due time; they are hints only. After a reconnect the
    listener wakes everybody with an unknown time, so waiters look at Redis again.
    """

    def __init__(self, client: Any, channel: str) -> None:
        self._client = client
        self._channel = channel
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._subscribed = threading.Event()
        self._cond = threading.Condition()
        self._log = WakeLog()
        self._conn: Any = None

    def start(self) -> None:
        """Subscribe (once); returns when the subscription is live or after a short wait."""
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._listen, name=f"delayq:{self._channel}", daemon=True
                )
                self._thread.start()
        self._subscribed.wait(1.0)

    def mark(self) -> int:
        return self._log.generation

    def wait(self, mark: int, timeout: float) -> tuple[int, int | None] | None:
        """Wait for news after ``mark``: (new mark, earliest announced due ms, None if
        unknown), or None on timeout."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._log.generation != mark, timeout):
                return None
            return self._log.news_since(mark)

    def _push(self, due_ms: int | None) -> None:
        with self._cond:
            self._log.push(due_ms)
            self._cond.notify_all()

    def _listen(self) -> None:
        # A connection of our own rather than redis-py's PubSub, which reconnects by itself
        # inside a failed read: close() must be able to end this thread without Redis.
        backoff = 0.05
        first = True
        while not self._stop.is_set():
            conn = None
            try:
                conn = _new_connection(self._client, self._channel)
                self._conn = conn
                conn.connect()
                conn.send_command("SUBSCRIBE", self._channel)
                conn.read_response(push_request=True)  # the subscribe confirmation
                self._subscribed.set()
                if not first:
                    log.info("delayq: resubscribed to %s", self._channel)
                    self._push(None)  # messages may have been missed while away
                first, backoff = False, 0.05
                while not self._stop.is_set():
                    if conn.can_read(timeout=30.0):
                        message = conn.read_response(push_request=True)
                        if message and _str(message[0]) == "message":
                            self._push(due_of(message[2]))
            except Exception as exc:  # after close() the socket dies under us: any error
                if self._stop.is_set():
                    break
                if not isinstance(exc, RedisError | OSError):
                    log.exception("delayq: listener on %s failed; restarting", self._channel)
                else:
                    log.warning(
                        "delayq: listener on %s lost Redis (%s); retrying", self._channel, exc
                    )
                self._push(None)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 2.0)
            finally:
                self._conn = None
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.disconnect()

    def close(self) -> None:
        thread = self._thread
        if thread is None:
            return
        self._stop.set()
        # Shutting the socket down makes the listener's blocking read fail at once, without a
        # round trip to Redis (which may hang); the listener then disconnects it itself.
        sock = getattr(self._conn, "_sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        thread.join(2.0)
        self._thread = None
        self._push(None)  # waiters look at the queue again, and find it closed


def _new_connection(client: Any, channel: str) -> Any:
    """A fresh connection, outside the pool's bookkeeping, to the node serving ``channel``."""
    pool = getattr(client, "connection_pool", None)
    if pool is None:  # RedisCluster: any node hears every PUBLISH; take the channel's node
        pool = client.get_node_from_key(channel).redis_connection.connection_pool
    # Built from the pool's settings but outside its bookkeeping: make_connection() would
    # count it against max_connections for good.
    return pool.connection_class(**pool.connection_kwargs)


def _str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Listener:
    """A background :class:`~delayq.Worker` thread on one queue, from ``add_listener``."""

    def __init__(self, worker: Any, thread: threading.Thread) -> None:
        self.worker = worker
        self._thread = thread

    @classmethod
    def start(cls, queue: Any, handler: Any, concurrency: int, timeout: float | None) -> Listener:
        from .._workers.thread_worker import Worker

        worker = Worker(
            queue, handler, concurrency=concurrency, timeout=timeout, handle_signals=False
        )
        thread = threading.Thread(target=worker.run, name="delayq-listener", daemon=True)
        thread.start()
        return cls(worker, thread)

    def stop(self) -> None:
        """Stop fetching, let running handlers finish, hand back the rest."""
        self.worker.stop()
        self._thread.join()
