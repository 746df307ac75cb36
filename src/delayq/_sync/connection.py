# Generated from _async/connection.py by scripts/unasync.py: do not edit.
"""Connection: one handle per Redis, shared by every queue, tool and worker on it.

A handle owns what a process should have once per Redis, not once per queue: the runner of
the connection layer (a pool per node, the retry budget, the log policy of outages), the
subscriber (one pub/sub connection per node carrying the wake-up channels of every queue
opened on the handle) and the reads of the queue registry. ``delayq.connect(url)`` makes
one; the CLI, the dashboard, the exporter, the outbox relay, Django and ``delayq worker``
each use one.

The sync ``Connection`` in ``_sync/connection.py`` is generated from this file by
``scripts/unasync.py``; edit here and regenerate.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

from .._core import sharding
from .._core.codecs import PayloadT
from .._core.connection import Topology
from .._core.keys import QueueKeys
from .._core.models import Stats
from .._core.registry import Registry, read_registry, registry_key
from .._core.timing import Duration, duration_ms
from ..exceptions import ConfigError, QueueClosed
from . import runner as layer
from .queue import DelayQueue
from .subscriber import Subscriber

DEFAULT_CLIENT_NAME = "delayq"


def connect(
    redis: Any = None,
    *,
    reconnect_timeout: Duration | None = None,
    prefix: str = "dq",
    client_name: str = DEFAULT_CLIENT_NAME,
) -> Connection:
    """A connection handle to ``redis``, for the synchronous front end: ``with
    delayq.connect(url) as conn: orders = conn.queue("orders")``. The arguments are
    :class:`Connection`'s."""
    return Connection(
        redis, reconnect_timeout=reconnect_timeout, prefix=prefix, client_name=client_name
    )


def shared_or_new(
    redis: Any,
    *,
    reconnect_timeout: Duration | None = None,
    prefix: str | None = None,
    client_name: str = DEFAULT_CLIENT_NAME,
) -> tuple[Connection, bool]:
    """For a tool given ``redis`` (the exporter, the dashboard, the relay): ``redis`` itself
    if it is a handle, else a new handle on it; and whether the tool made it (and closes it).
    A handle passed in keeps its own settings: a ``reconnect_timeout`` or ``prefix`` given
    that differs from its own is a :class:`ConfigError`."""
    if not isinstance(redis, Connection):
        handle = Connection(
            redis,
            reconnect_timeout=reconnect_timeout,
            prefix="dq" if prefix is None else prefix,
            client_name=client_name,
        )
        return handle, True
    if prefix is not None and prefix != redis.prefix:
        raise ConfigError(
            f"prefix {prefix!r} differs from the connection handle's ({redis.prefix!r}): "
            "leave it out, or connect with that prefix"
        )
    if reconnect_timeout is not None:
        layer.connect(redis, client_name, _seconds(reconnect_timeout))  # the same, or raises
    return redis, False


def _seconds(duration: Duration) -> float:
    try:
        return duration_ms(duration, "reconnect_timeout") / 1000
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


class Connection(layer.Handle):
    """One Redis for the synchronous front end: its pools, its pub/sub connections, its queues.

    Every queue opened with :meth:`queue` (or built as ``DelayQueue(name, conn)``)
    sends its calls through the handle's connections, one pool per Redis node, and hears its
    wake-ups over the handle's pub/sub connection, one per node for every channel of every
    queue. A Redis outage is logged once when it starts (a warning) and once when it ends
    (an info line), not once per call or per queue.

    Args:
        redis: a URL (every form a queue takes: ``redis://``, ``rediss://``, ``unix://``,
            ``redis+sentinel://``, ``redis+cluster://``), a ``redis`` client (left
            open by :meth:`close`), or None for ``$REDIS_URL``.
        reconnect_timeout: how long a call keeps retrying a lost connection or a failover
            before it raises :class:`RedisUnavailable`, for every queue on the handle (a
            queue given another one is a :class:`ConfigError`). None: as for a queue, 10 s on
            a single server, 40 s through Sentinel, 25 s on a cluster.
        prefix: the key prefix of the registry read by :meth:`queues` and :meth:`stats`,
            and of the queues :meth:`queue` opens (which may name another).
        client_name: the ``CLIENT SETNAME`` of the handle's connections (for ``CLIENT
            LIST``).
    """

    def __init__(
        self,
        redis: Any = None,
        *,
        reconnect_timeout: Duration | None = None,
        prefix: str = "dq",
        client_name: str = DEFAULT_CLIENT_NAME,
    ) -> None:
        self._registry = registry_key(prefix)  # validates the prefix
        self._prefix = prefix
        if layer.shared(redis):
            raise ConfigError("redis is already a connection handle: use it as it is")
        reconnect_s = None if reconnect_timeout is None else _seconds(reconnect_timeout)
        self._runner = layer.connect(redis, client_name, reconnect_s)
        # The queues opened here, to close with the handle; weakly, so that a caller may drop
        # one (a queue on a handle holds no connection of its own) without a leak.
        self._queues: weakref.WeakSet[DelayQueue[Any]] = weakref.WeakSet()
        self._closed = False

    # -- what the handle is -----------------------------------------------------------------

    @property
    def runner(self) -> layer.Runner:
        """The connection layer's runner of this handle (delayq's own tools send plain
        commands through it). Raises :class:`QueueClosed` once the handle is closed."""
        if self._closed:
            raise QueueClosed(f"the connection to {self._runner.where} is closed")
        return self._runner

    @property
    def subscriber(self) -> Subscriber:
        """The wake-up channels of every queue on this handle; ``subscriber.connections``
        is how many pub/sub connections carry them (one per Redis node in use)."""
        return self.runner.subscriber

    @property
    def prefix(self) -> str:
        """The key prefix of the registry this handle reads."""
        return self._prefix

    @property
    def where(self) -> str:
        """The Redis this handle connects to, for messages: the URL without its password,
        or the type of the client passed in."""
        return self._runner.where

    @property
    def topology(self) -> Topology:
        """``standalone``, ``sentinel`` or ``cluster``."""
        return self._runner.topology

    @property
    def reconnect_timeout(self) -> float:
        """Seconds a call of any queue on this handle rides out an outage."""
        return self._runner.reconnect_s

    @property
    def closed(self) -> bool:
        return self._closed

    # -- queues -----------------------------------------------------------------------------

    def queue(
        self, name: str, *, payload_type: type[PayloadT] | None = None, **options: Any
    ) -> DelayQueue[PayloadT]:
        """A queue on this handle: ``DelayQueue(name, conn, prefix=conn.prefix,
        **options)``, closed with the handle.

        Not cached: each call makes a new queue object (cheap: it holds no connection of its
        own), so that closing one, or a view made of it, never closes another caller's. Keep
        the one you use; a queue dropped without :meth:`DelayQueue.close` costs
        nothing once collected: its channels leave the handle's pub/sub connections when the
        handle next opens or closes a queue, or within 30 s (the connection's next PING).
        """
        options.setdefault("prefix", self._prefix)
        return DelayQueue(name, self, payload_type=payload_type, **options)

    def _adopt(self, queue: DelayQueue[Any]) -> None:
        """Close ``queue`` (built on this handle) with it: its channels leave the handle's
        pub/sub connections, which may belong to a client passed in that stays open."""
        self._queues.add(queue)

    def queues(self) -> list[str]:
        """The registered queue names under the handle's prefix (every queue ever offered to
        or created), the valid ones, sorted."""
        members = self.runner.command("SMEMBERS", self._registry)
        return list(read_registry(self._prefix, members).names)

    def is_registered(self, name: str) -> bool:
        """Whether the registry lists ``name`` (a queue registers on its first offer, or
        when opened with ``create=True``)."""
        return bool(self.runner.command("SISMEMBER", self._registry, name))

    def registry(self) -> Registry:
        """The registry as one value: the valid names, the members that are no queue name,
        and the recorded layout of each sharded queue (two commands)."""
        conn = self.runner
        members = conn.command("SMEMBERS", self._registry)
        layouts = conn.command("HGETALL", sharding.shards_key(self._prefix))
        return read_registry(self._prefix, members, layouts)

    def stats(
        self, names: Sequence[str] | None = None, *, overdue_after: Duration = 1.0
    ) -> list[Stats]:
        """The stats of ``names`` (default: every registered queue), in that order (sorted
        by default), in one round trip per Redis node whatever their number: each queue's
        (each shard's) read atomically, a sharded queue's summed as its own ``stats()``
        would. ``overdue_after`` as the queues' own option. Raises
        :class:`RedisUnavailable` or :class:`ServerError`."""
        try:
            overdue_ms = duration_ms(overdue_after, "overdue_after")
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        conn = self.runner
        if names is None:
            registry = self.registry()
            wanted, layouts = list(registry.names), dict(registry.layouts)
        else:
            if isinstance(names, str):
                raise ConfigError(f"names must be a list of queue names, not the string {names!r}")
            wanted = [QueueKeys(self._prefix, name).name for name in names]  # validated
            counts = conn.command("HGETALL", sharding.shards_key(self._prefix))
            layouts = sharding.layouts_of(counts)
        if not wanted:
            return []
        plan = sharding.StatsPlan(self._prefix, wanted, layouts, overdue_ms)
        return plan.stats(conn.many(plan.calls))

    # -- lifecycle --------------------------------------------------------------------------

    def close(self) -> None:
        """Close the queues built on the handle (with :meth:`queue` or as
        ``DelayQueue(name, conn)``: they hand back the tasks they fetched ahead and
        leave its pub/sub connections), then the connections (a client passed in is left
        open)."""
        if self._closed:
            return
        self._closed = True
        for queue in list(self._queues):
            queue.close()
        self._runner.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<{type(self).__name__} {self.where} prefix={self._prefix!r} {state}>"
