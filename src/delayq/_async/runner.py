"""The connection layer: one runner per client carries every Redis call delayq makes.

It runs scripts by SHA on the slot of their keys (loading them on NOSCRIPT), follows cluster
redirections, retries what a failover or a lost connection interrupted until the call's
deadline, and sends ``WAIT`` on the connection that took the write. Wake-up channels ride on
its ``subscriber`` (``subscriber.py``: one pub/sub connection per node). The sync runner in
``_sync/runner.py`` is generated from this file by ``scripts/unasync.py``; edit here.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.crc import key_slot
from redis.exceptions import (
    AskError,
    BusyLoadingError,
    ClusterDownError,
    DataError,
    MasterDownError,
    MovedError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
    TryAgainError,
)

from .._core.connection import (
    DEFAULT_RECONNECT_S,
    Backoff,
    Failure,
    Topology,
    classify_connection_error,
    classify_reply,
    default_url,
    parse_url,
    redirect_of,
    socket_timeout_s,
)
from .._core.errors_text import redis_error_text
from .._core.outages import OUTAGES
from .._core.scripts import Op, script
from .._core.urls import safe_url
from ..exceptions import ConfigError, QueueClosed, RedisUnavailable, ServerError
from . import backend
from .sentinel import SentinelWatch
from .subscriber import (
    Subscriber,
    close_subscriber,
    master_reconnected,
    master_switched,
    subscriber_of,
)

log = logging.getLogger("delayq")

Command = tuple[Any, ...]
# A connection lost, refused or timed out, or a cluster client that could not find a node.
_LOST: tuple[type[BaseException], ...] = (
    RedisError,
    *backend.CONNECTION_ERRORS,
    *backend.CLIENT_ERRORS,
)
# How many redirections (MOVED, ASK) one try follows before it counts as a failed try.
MAX_REDIRECTS = 5


class _Redirected(Exception):
    """The slot moved; try again at once on its new node."""


class Handle:
    """A connection handle (``delayq.aconnect()``, ``delayq.connect()``): what
    :func:`connect` takes besides a URL or a client. The queues built on it share its runner,
    which it owns and closes."""

    __slots__ = ()

    @property
    def runner(self) -> Runner:
        """The handle's runner (raises :class:`QueueClosed` once the handle is closed)."""
        raise NotImplementedError

    def _adopt(self, queue: Any) -> None:
        """A queue was built on the handle: close it with the handle."""
        raise NotImplementedError


def shared(redis: object) -> bool:
    """Whether ``redis`` is a runner or a handle: its user shares it and must not close it."""
    return isinstance(redis, Runner | Handle)


def connect(
    redis: object,
    client_name: str,
    reconnect_s: float | None = None,
    *,
    label: str = "",
    wait_s: float = 0.0,
) -> Runner:
    """The runner for ``redis``: a URL (None for ``$REDIS_URL``), a client passed in, or a
    connection handle (its runner, shared: the handle closes it).

    ``reconnect_s``: how long a call rides out a lost connection (None: long enough for a
    failover with default server settings, see DEFAULT_RECONNECT_S). A client made here
    times out after ``socket_timeout_s(reconnect_s)`` and never retries by itself; the runner
    closes it. A client passed in is used through its own methods (its hooks see each call)
    and left open. ``label`` names the caller in log lines (a queue's name); ``wait_s`` is
    the longest ``WAIT`` its calls send, which the socket timeout must outlast. A handle's
    runner keeps its own budget and sockets: a ``reconnect_s`` other than the handle's, or a
    ``wait_s`` its sockets would not outlast, is a :class:`ConfigError`.
    """
    if isinstance(redis, Runner):
        return redis  # shared, e.g. by the shards of a sharded queue: its maker closes it
    if isinstance(redis, Handle):
        return _of_handle(redis.runner, reconnect_s, wait_s)
    if redis is None or isinstance(redis, str):
        url = redis or default_url()
        target = parse_url(url)
        if reconnect_s is None:
            reconnect_s = DEFAULT_RECONNECT_S[target.topology]
        timeout_s = socket_timeout_s(reconnect_s) + wait_s
        client, extras = backend.make_client(target, client_name, timeout_s)
        where = safe_url(url)
        runner = Runner(client, True, where, reconnect_s, extras, target.topology, label or where)
        runner.socket_timeout_s = timeout_s
        return runner
    client = backend.check_client(redis)
    topology = Topology.CLUSTER if backend.is_cluster(client) else Topology.STANDALONE
    if reconnect_s is None:
        reconnect_s = DEFAULT_RECONNECT_S[topology]
    where = type(client).__name__
    return Runner(client, False, where, reconnect_s, [], topology, label or where)


def _of_handle(conn: Runner, reconnect_s: float | None, wait_s: float) -> Runner:
    """A handle's runner for one more user, who must fit its retry budget and sockets."""
    if reconnect_s is not None and reconnect_s != conn.reconnect_s:
        raise ConfigError(
            f"reconnect_timeout={reconnect_s:g} differs from the connection handle's "
            f"({conn.reconnect_s:g} s), which applies to every queue on it: leave it out, or "
            "give the handle that reconnect_timeout"
        )
    if wait_s and conn.socket_timeout_s is not None and wait_s >= conn.socket_timeout_s:
        raise ConfigError(
            f"a Durability timeout of {wait_s:g} s outlasts the socket timeout of the "
            f"connection handle ({conn.socket_timeout_s:g} s): give the queue its own URL, or "
            "a shorter Durability timeout"
        )
    return conn


_UNREAD = object()  # a posted call's reply, not read yet
_UNSENT = object()  # not written, or its connection lost before its reply was read


@dataclass(eq=False)
class Posted:
    """A script call written on a :class:`_Line`, its reply read later (see
    :meth:`Runner.post`)."""

    op: Op
    keys: Sequence[str]
    args: Sequence[Any]
    reply: Any = _UNSENT
    line: _Line | None = None  # where it was written

    @property
    def written(self) -> bool:
        """Whether it went out (right after :meth:`Runner.post`: not, if it could not)."""
        return self.reply is not _UNSENT


@dataclass(eq=False)
class _Line:
    """A connection that calls are posted on: the runner's kept one (``address`` None), or
    on a cluster one per node, kept for such calls. ``hold``: one call at a time uses it."""

    address: tuple[str, int] | None
    hold: Any
    conn: Any = None
    posted: list[Posted] = field(default_factory=list)  # written, replies unread, in order
    loaded: set[Op] = field(default_factory=set)  # scripts sent on it since it connected

    def lose(self) -> None:
        """The connection is lost, and the replies of its posted calls with it (and the
        scripts: its server may have restarted without them)."""
        for posted in self.posted:
            posted.reply = _UNSENT
        self.posted.clear()
        self.loaded.clear()


@dataclass(eq=False)
class _Outage:
    """Calls of a runner failing since ``began`` (monotonic), ``tries`` failed tries so far."""

    began: float
    tries: int = 0


class Runner:
    """Every Redis call of one client: scripts per slot, plain commands, retries.

    A call retries connection errors and the replies that mean "not here, not now"
    (READONLY, MASTERDOWN, NOREPLICAS, LOADING, CLUSTERDOWN, TRYAGAIN) with backoff until its
    deadline, then raises :class:`RedisUnavailable`; other error replies raise
    :class:`ServerError` at once. Every delayq script is safe to send again after a lost
    reply (receipts, caller ids and fenced leases), so a retried call never acts twice.

    On a plain client it made itself, the runner sends on one connection it keeps checked out
    of the pool (redis-py's own command path costs ~30 us of a ~120 us call); calls made while
    that connection is busy check one out. On a cluster it sends each call to the node of its
    slot, on that node's own connection, and follows MOVED and ASK.
    """

    def __init__(
        self,
        client: Any,
        owned: bool,
        where: str,
        reconnect_s: float,
        extras: list[Any],
        topology: Topology,
        label: str,
    ) -> None:
        self._client = client
        self._label = label
        self.owned = owned
        self.where = where  # for messages: the URL without its password, or the client's type
        self.topology = topology
        self.reconnect_s = reconnect_s
        # The socket timeout of a client made here (None: a client passed in, its own).
        self.socket_timeout_s: float | None = None
        self._extras = extras
        self._cluster = topology is Topology.CLUSTER
        self._direct = owned and not self._cluster and backend.is_plain(client)
        self._kept = _Line(None, backend.Hold())  # its conn: made on first use
        self._kept_pid = 0
        self._lines: dict[tuple[str, int], _Line] = {}  # cluster: posting lines per node
        self._slots: dict[int, tuple[str, int]] = {}  # cluster: slot -> node
        self._watch = (
            SentinelWatch(client, on_switch=lambda master: master_switched(client, master))
            if backend.is_sentinel(client)
            else None
        )
        self._subscriber: Subscriber | None = None
        # The outage under way, if any, under one key: dict.setdefault and dict.pop are atomic,
        # so of the threads sharing a sync runner, one logs an outage's start and one its end.
        self._outage: dict[str, _Outage] = {}
        self._connected = False
        self._closed = False

    @property
    def client(self) -> Any:
        """The redis-py client (for plain commands)."""
        return self._client

    @property
    def subscriber(self) -> Subscriber:
        """The wake-up channels of every queue on this runner, over one pub/sub connection
        per node (made on first use; closed with the runner if the runner made the client).
        A queue listens with ``runner.subscriber.notifier(channel, bell)``."""
        if self._subscriber is None:
            self._subscriber = subscriber_of(self._client)
            self._subscriber.where = self.where  # its outages are this Redis's
        return self._subscriber

    async def close(self) -> None:
        """Hand back the kept connection and close the clients this runner made."""
        if self._closed:
            return
        self._closed = True
        OUTAGES.forget(self)
        if self._watch is not None:
            await self._watch.close()
        if self.owned:  # no other runner shares its client, nor its subscriber
            await close_subscriber(self._client)
        for line in self._lines.values():
            await self._drop_line(line)
        self._kept.lose()
        conn, self._kept.conn = self._kept.conn, None
        if conn is not None and self._kept_pid == backend.process_id():
            await backend.disconnect(conn)
        if self.owned:
            for client in (self._client, *self._extras):
                await backend.close_client(client)

    def _check_open(self) -> None:
        if self._closed:
            raise QueueClosed(f"the connection to {self.where} is closed")

    # -- calls ------------------------------------------------------------------------------

    async def run(
        self, op: Op, keys: Sequence[str], args: Sequence[Any], *, deadline: float | None = -1.0
    ) -> Any:
        """Run the script of ``op`` once; its reply. ``deadline``: a monotonic time to give up
        at; -1 for the runner's reconnect timeout; None to retry for as long as it takes."""
        command = ("EVALSHA", script(op).sha, len(keys), *keys, *args)
        if self._direct:  # the hot path: one script on the kept connection
            return await self._retrying(lambda: self._direct_run(op, command), deadline)
        replies = await self._retrying(lambda: self._exchange(op, keys[0], [command]), deadline)
        return replies[0]

    async def _direct_run(self, op: Op, command: Command) -> Any:
        (reply,) = await self._on_own_connection((command,))
        if isinstance(reply, ResponseError):
            if not _noscript(reply):
                raise reply
            await self._on_own_connection((("SCRIPT", "LOAD", script(op).source),))
            (reply,) = await self._on_own_connection((command,))
            if isinstance(reply, ResponseError):
                raise reply
        return reply

    async def batch(
        self,
        op: Op,
        keys: Sequence[str],
        arg_lists: Sequence[Sequence[Any]],
        *,
        tail: Sequence[Command] = (),
        again: Sequence[Command] = (),
        deadline: float | None = -1.0,
    ) -> list[Any]:
        """Run the script of ``op`` once per argument list, in order, on one connection to the
        slot of ``keys``, then the ``tail`` commands (``WAIT``) on the same connection; the
        replies, scripts' first. A call sent again (its connection lost) sends ``again``
        before the tail: its replies stand between the scripts' and the tail's."""
        sha = script(op).sha
        scripts = [("EVALSHA", sha, len(keys), *keys, *args) for args in arg_lists]
        sends = 0

        async def attempt() -> list[Any]:
            nonlocal sends
            sends += 1
            resent = again if sends > 1 else ()
            return await self._exchange(op, keys[0], [*scripts, *resent, *tail])

        return list(await self._retrying(attempt, deadline))

    async def many(
        self, calls: Sequence[tuple[Op, Sequence[str], Sequence[Any]]], *, deadline: float = -1.0
    ) -> list[Any]:
        """Run scripts on many slots in as few round trips as the topology allows (one per
        node); the replies in order, an error reply as a :class:`ServerError` in its place.
        The calls must be safe to send again (reads, or scripts with receipts)."""
        return list(await self._retrying(lambda: self._many(calls), deadline))

    async def _many(self, calls: Sequence[tuple[Op, Sequence[str], Sequence[Any]]]) -> list[Any]:
        groups: dict[Any, list[int]] = {}
        for i, (_, keys, _) in enumerate(calls):
            slot = key_slot(keys[0].encode())
            where = await self._address(slot) if self._cluster else None
            groups.setdefault(where, []).append(i)
        replies: list[Any] = [None] * len(calls)
        for indexes in groups.values():
            got = await self._exchange_mixed([calls[i] for i in indexes])
            for i, reply in zip(indexes, got, strict=True):
                replies[i] = reply
        return replies

    async def post(self, op: Op, keys: Sequence[str], args: Sequence[Any]) -> Posted:
        """Write the script of ``op`` and return without waiting for its reply, which
        :meth:`outcome` reads. It goes on the kept connection, where a later call reads it
        first (calls stay in order), or on a cluster on a connection to the node of its slot
        kept for such calls. Redis runs it while the caller goes on: a consumer loop acks a
        task while it handles the next. For scripts that are safe to send again: one that
        could not be written now (Redis away, or the connection busy with another call), or
        whose reply was lost, :meth:`outcome` runs again through :meth:`run`."""
        posted = Posted(op, keys, args)
        command = ("EVALSHA", script(op).sha, len(keys), *keys, *args)
        if self._closed:
            return posted
        if self._cluster:
            await self._post_on_node(posted, command)
        elif self._direct and self._kept.hold.take():
            try:
                await self._kept_connection()
                await _write_posted(self._kept, posted, command)
            except BaseException as exc:
                await self._drop_line(self._kept)
                if not isinstance(exc, Exception):
                    raise
            finally:
                self._kept.hold.give()
        return posted

    async def _post_on_node(self, posted: Posted, command: Command) -> None:
        try:
            address = await self._address(key_slot(posted.keys[0].encode()))
        except Exception:  # the cluster away: outcome() runs it, with retries
            return
        line = self._lines.get(address)
        if line is None:  # setdefault: of two threads making one, both use the same
            line = self._lines.setdefault(address, _Line(address, backend.Hold()))
        if not line.hold.take():
            return
        try:
            if line.conn is None:
                line.conn = await backend.node_checkout(backend.resolve(self._client), address)
            await _write_posted(line, posted, command)
        except BaseException as exc:
            await self._drop_line(line)
            if not isinstance(exc, Exception):
                raise
        finally:
            line.hold.give()

    async def outcome(self, posted: Posted, *, deadline: float | None = -1.0) -> Any:
        """The reply of a :meth:`post`; the call run again through :meth:`run` if it was not
        sent, its connection was lost, or Redis answered with an error (a script it no
        longer has, a failover under way, a slot moved: :meth:`run` knows what each means)."""
        line = posted.line
        if posted.reply is _UNREAD and line is not None and line.hold.take():
            try:
                if posted in line.posted:
                    await _read_replies(line, upto=posted)
            except BaseException as exc:
                await self._drop_line(line)
                if not isinstance(exc, Exception):
                    raise
            finally:
                line.hold.give()
        reply = posted.reply
        if reply is _UNREAD or reply is _UNSENT or isinstance(reply, ResponseError):
            return await self.run(posted.op, posted.keys, posted.args, deadline=deadline)
        return reply

    async def _drop_line(self, line: _Line) -> None:
        """A posting connection failed: its posted calls are lost with it. The kept one
        reconnects on its next use; a node's goes back to its pool."""
        line.lose()
        if line.conn is None:
            return
        await backend.disconnect(line.conn)
        if line.address is not None:
            conn, line.conn = line.conn, None
            with contextlib.suppress(Exception):  # a node gone from the cluster: no pool
                await backend.node_checkin(backend.resolve(self._client), line.address, conn)

    async def command(self, *args: Any, deadline: float | None = -1.0) -> Any:
        """A plain command (SADD, SMEMBERS, TIME, ...), routed by the client."""
        return await self._retrying(lambda: self._execute(args), deadline)

    async def _execute(self, args: Command) -> Any:
        client = self._client
        if self._cluster:
            client = backend.resolve(client)
        return await client.execute_command(*args)

    # -- one try ----------------------------------------------------------------------------

    async def _exchange(self, op: Op, key: str, commands: list[Command]) -> list[Any]:
        """Send ``commands`` on one connection to ``key``'s node; reload the script and send
        the rest again if Redis lost it; raise the first other error reply."""
        replies = await self._roundtrip(key_slot(key.encode()), commands)
        lost = next((i for i, reply in enumerate(replies) if _noscript(reply)), None)
        if lost is not None:
            await self._load(op, key)
            replies[lost:] = await self._roundtrip(key_slot(key.encode()), commands[lost:])
        for reply in replies:
            if isinstance(reply, ResponseError):
                raise reply
        return replies

    async def _exchange_mixed(
        self, calls: Sequence[tuple[Op, Sequence[str], Sequence[Any]]]
    ) -> list[Any]:
        """Scripts of many slots on one node, in one round trip; error replies in place. A
        slot that moved is noted and the whole round tried again (each slot on its node)."""
        slot = key_slot(calls[0][1][0].encode())
        commands = [
            ("EVALSHA", script(op).sha, len(keys), *keys, *args) for op, keys, args in calls
        ]
        replies = await self._roundtrip(slot, commands, follow=False)
        lost = {calls[i][0] for i, r in enumerate(replies) if _noscript(r)}
        if lost:
            for op in lost:
                await self._load(op, calls[0][1][0])
            replies = await self._roundtrip(slot, commands, follow=False)
        out = []
        for (_, keys, _), reply in zip(calls, replies, strict=True):
            if isinstance(reply, ResponseError):
                kind = _classify(reply)
                if kind is Failure.MOVED and not self._cluster:
                    raise reply  # a plain URL to a cluster node: a clear error, not a retry
                if kind is Failure.MOVED:
                    self._slots[key_slot(keys[0].encode())] = redirect_of(_reply_text(reply))[1:]
                    raise _Redirected(str(reply))
                if kind is not Failure.FATAL:
                    raise reply  # not here, not now: the whole round again
                reply = ServerError(
                    f"Redis refused a delayq call: {_reply_text(reply)}", where=self.where
                )
            out.append(reply)
        return out

    async def _load(self, op: Op, key: str) -> None:
        source = script(op).source
        reply = (await self._roundtrip(key_slot(key.encode()), [("SCRIPT", "LOAD", source)]))[0]
        if isinstance(reply, ResponseError):
            raise reply

    async def _roundtrip(
        self, slot: int, commands: Sequence[Command], *, follow: bool = True
    ) -> list[Any]:
        """Send ``commands`` on one connection; the replies, error replies as exceptions in
        place. On a cluster, follows MOVED (the slot's new home) and ASK (a migrating slot),
        unless ``follow`` is False (commands of several slots)."""
        if not self._cluster:
            if not self._direct:
                return await self._through_client(commands)
            return await self._on_own_connection(commands)
        client = backend.resolve(self._client)
        address, asking = await self._address(slot), False
        for _ in range(MAX_REDIRECTS):
            conn = await backend.node_checkout(client, address)
            try:
                sent = [("ASKING",), *commands] if asking else list(commands)
                replies = await _send(conn, sent)
            except BaseException:
                await backend.disconnect(conn)
                raise
            finally:
                await backend.node_checkin(client, address, conn)
            if asking:
                replies = replies[1:]
            redirect = next(
                (r for r in replies if isinstance(r, ResponseError) and _redirection(r)), None
            )
            if redirect is None or not follow:
                return replies
            kind = _classify(redirect)
            _, host, port = redirect_of(_reply_text(redirect))
            if kind is Failure.MOVED:
                self._slots[slot] = (host, port)
            address, asking = (host, port), kind is Failure.ASK
        raise _Redirected(f"slot {slot} still moving after {MAX_REDIRECTS} redirections")

    async def _on_own_connection(self, commands: Sequence[Command]) -> list[Any]:
        """Send on the kept connection, or on one from the pool while another call uses it."""
        kept = self._kept.hold.take()
        try:
            if kept:
                conn = await self._kept_connection()
            else:
                conn = await self._client.connection_pool.get_connection()
            try:
                if kept and self._kept.posted:
                    await _read_replies(self._kept)  # the calls posted before this one first
                return await _send(conn, commands)
            except BaseException:
                # A failed or cancelled call leaves a reply unread: never let the next call
                # read it. The connection reconnects (a Sentinel one asks again) on next use.
                if kept:
                    self._kept.lose()
                await backend.disconnect(conn)
                raise
            finally:
                if not kept:
                    await self._client.connection_pool.release(conn)
        finally:
            if kept:
                self._kept.hold.give()

    async def _kept_connection(self) -> Any:
        """The kept connection (the caller holds it)."""
        kept = self._kept
        if kept.conn is None or self._kept_pid != backend.process_id():
            # A first call, or the first in a forked child: the parent's is not ours.
            kept.lose()
            kept.conn = await self._client.connection_pool.get_connection()
            self._kept_pid = backend.process_id()
        elif not backend.connected(kept.conn):
            kept.lose()  # closed under it (a Sentinel switch disconnects the pool)
        return kept.conn

    async def _through_client(self, commands: Sequence[Command]) -> list[Any]:
        """A client passed in: its own methods, so that its hooks see every call."""
        if len(commands) == 1:
            try:
                return [await self._client.execute_command(*commands[0])]
            except ResponseError as exc:
                return [exc]
        pipe = self._client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        return list(await pipe.execute(raise_on_error=False))

    async def _address(self, slot: int) -> tuple[str, int]:
        address = self._slots.get(slot)
        if address is None:
            address = await backend.slot_address(backend.resolve(self._client), slot)
            self._slots[slot] = address  # until a MOVED or a lost node says otherwise
        return address

    # -- retries ----------------------------------------------------------------------------

    async def _retrying(self, attempt: Callable[[], Any], deadline: float | None) -> Any:
        """Call ``attempt`` until it gets through or ``deadline`` passes."""
        self._check_open()
        watch = self._watch
        if watch is not None:
            watch.start()  # once; in the caller's event loop, for the asyncio runner
        if deadline is not None and deadline < 0:
            deadline = backend.monotonic() + self.reconnect_s
        backoff, failures = Backoff(), 0
        while True:
            self._check_open()  # close() during a pause: the call does not go out after it
            if watch is not None and not await watch.wait(deadline):
                # A Sentinel promotion is under way and the call's time ran out meanwhile:
                # sending it now would reach the master that is being replaced.
                raise RedisUnavailable(
                    f"Redis at {self.where} is failing over (a replica is being promoted)",
                    where=self.where,
                )
            try:
                result = await attempt()
            except _Redirected as exc:
                error: BaseException = exc
            except ResponseError as exc:
                kind = _classify(exc)
                if kind is Failure.FATAL:
                    raise ServerError(
                        f"Redis refused a delayq call: {_reply_text(exc)}", where=self.where
                    ) from exc
                if kind in (Failure.MOVED, Failure.ASK) and not self._cluster:
                    raise ConfigError(
                        f"Redis at {self.where} is a cluster node: connect with "
                        "redis+cluster://host:port[,host:port...] or pass a RedisCluster client"
                    ) from exc
                if kind is Failure.DEMOTED:
                    await self._redial()
                error = exc
            except DataError as exc:  # redis-py refused an argument: input, not an outage
                raise ConfigError(f"a Redis call got an argument it cannot send: {exc}") from exc
            except _LOST as exc:
                if classify_connection_error(exc) is Failure.UNREACHABLE and not self._connected:
                    raise RedisUnavailable(
                        f"cannot reach Redis at {self.where}: {redis_error_text(exc)}",
                        where=self.where,
                    ) from exc
                error = exc
                if self._cluster:
                    await self._forget_topology()
            else:
                if self._outage:
                    self._recovered()
                self._connected = True
                if failures and self._watch is not None:
                    master_reconnected(self._client)  # the pub/sub connection follows it
                return result
            failures += 1
            self._check_open()
            now = backend.monotonic()
            if not isinstance(error, _Redirected):  # a slot that moved is no outage
                self._failed(error, now)
            if deadline is not None and now >= deadline:
                raise RedisUnavailable(
                    f"Redis at {self.where} unreachable after {failures} tries: "
                    f"{redis_error_text(error)}",
                    where=self.where,
                ) from error
            await backend.sleep(backoff.pause(now, deadline))

    # -- the log policy: an outage logs once when it starts and once when it ends -----------

    def _failed(self, error: BaseException, now: float) -> None:
        """A failed try: the first of an outage logs a warning, the others nothing (every
        call of every queue on this runner fails during it; one line says so, for the
        process: see _core/outages.py)."""
        outage = _Outage(now)
        began = self._outage.setdefault("now", outage)
        began.tries += 1
        OUTAGES.lost(self.where, self, error, "calls")

    def _recovered(self) -> None:
        """A call got through: if an outage was under way, it is over for this runner."""
        if self._outage.pop("now", None) is not None:
            OUTAGES.back(self.where, self)

    async def _redial(self) -> None:
        """A server answered as a replica: a failover demoted it. Its connections are closed,
        so that the next try dials again and reaches the master wherever the address (a DNS
        name, a virtual IP, the sentinels) now leads. A connection another call is using
        meets the same answer and is closed by that call."""
        if self._cluster:
            await self._forget_topology()
            return
        if self._kept.hold.take():
            try:
                if self._kept.conn is not None:
                    await self._drop_line(self._kept)
            finally:
                self._kept.hold.give()
        await self._client.connection_pool.disconnect(inuse_connections=False)

    async def _forget_topology(self) -> None:
        """A node was lost: forget what MOVED taught and ask the cluster again."""
        self._slots.clear()
        try:
            await backend.refresh_topology(backend.resolve(self._client))
        except Exception as exc:  # the next try fails the same way and is counted
            log.debug("delayq: cluster topology refresh failed: %s", exc)


async def _write_posted(line: _Line, posted: Posted, command: Command) -> None:
    """Write ``command`` on ``line``, after the script's source the first time: a posted
    call that met NOSCRIPT would run only when its reply is read."""
    if not backend.connected(line.conn):
        # Closed under the line (a Sentinel switch disconnects the pool, a topology refresh
        # a node's): the replies of the calls posted on it went with it, and it reconnects
        # to a server that may not have the script.
        line.lose()
    load = None if posted.op in line.loaded else Posted(posted.op, (), ())  # reply dropped
    commands = (
        [command] if load is None else [("SCRIPT", "LOAD", script(posted.op).source), command]
    )
    await backend.ensure_connected(line.conn)
    await backend.write(line.conn, commands)
    for written in (load, posted):
        if written is not None:
            written.reply, written.line = _UNREAD, line
            line.posted.append(written)
    line.loaded.add(posted.op)


async def _read_replies(line: _Line, upto: Posted | None = None) -> None:
    """Read the replies of the calls posted on ``line``, in order, up to ``upto`` (None:
    all)."""
    while line.posted:
        posted = line.posted[0]
        try:
            posted.reply = await line.conn.read_response()
        except ResponseError as exc:
            posted.reply = exc
        del line.posted[0]
        if posted is upto:
            return


async def _send(conn: Any, commands: Sequence[Command]) -> list[Any]:
    """Write ``commands`` at once and read every reply, error replies in place."""
    await backend.ensure_connected(conn)
    await backend.write(conn, commands)
    replies: list[Any] = []
    for _ in commands:
        try:
            replies.append(await conn.read_response())
        except ResponseError as exc:
            replies.append(exc)
    return replies


# redis-py turns these error replies into classes and drops their first word from the text.
_PREFIXES: tuple[tuple[type[Exception], str], ...] = (
    (NoScriptError, "NOSCRIPT"),
    (MovedError, "MOVED"),  # before AskError, its base class
    (AskError, "ASK"),
    (ReadOnlyError, "READONLY"),
    (BusyLoadingError, "LOADING"),
    (TryAgainError, "TRYAGAIN"),
    (MasterDownError, "MASTERDOWN"),  # before ClusterDownError, its base class
    (ClusterDownError, "CLUSTERDOWN"),
    (OutOfMemoryError, "OOM"),
)


def _reply_text(exc: ResponseError) -> str:
    """The error reply as Redis sent it."""
    for cls, prefix in _PREFIXES:
        if isinstance(exc, cls):
            return f"{prefix} {exc}"
    return str(exc)


def _classify(exc: ResponseError) -> Failure:
    return classify_reply(_reply_text(exc))


def _noscript(reply: Any) -> bool:
    return isinstance(reply, ResponseError) and _classify(reply) is Failure.NOSCRIPT


def _redirection(reply: ResponseError) -> bool:
    return _classify(reply) in (Failure.MOVED, Failure.ASK)
