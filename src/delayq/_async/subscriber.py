"""The wake-up channels of every queue of one connection, over one pub/sub connection per node.

A :class:`Subscriber` belongs to one client (``Runner.subscriber``; every queue and shard
opened on that runner shares it). It hands out :class:`Notifier` handles, one per queue
channel and waiter, and carries all their channels over one pub/sub connection per Redis
node: one for a standalone or Sentinel deployment, one per node that serves a subscribed
slot on a cluster. Channels are subscribed and unsubscribed on the live connection.

A connection lost is dialled again with the runner's backoff; its channels are subscribed
again and every handle hears None ("unknown, look at Redis"), when the connection is lost
and again once it is back; so do the handles of a channel that goes live only after they
stopped waiting for it (an offer may have been announced before). On a cluster a channel
whose slot moved follows it to its new node. A Sentinel failover (``+switch-master`` seen by
the runner's watch) drops the connection at once, so that it subscribes on the new master
instead of waiting for Sentinel to demote the old one.

The logic is in ``_core/subscriptions.py``; this shell does the I/O, each connection through
a ``backend.Wire`` (a task that reads it; threads: a thread that alone reads and writes it).
The sync subscriber in ``_sync/subscriber.py`` is generated from this file by
``scripts/unasync.py``; edit here. ``_lock`` guards what several threads touch (the asyncio
one is a no-op).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import weakref
from typing import Any

from redis.crc import key_slot
from redis.exceptions import AskError, MovedError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError

from .._core.connection import Backoff, Failure, classify_connection_error
from .._core.outages import OUTAGES
from .._core.subscriptions import (
    PING_S,
    Broken,
    Channels,
    Command,
    Deliver,
    Event,
    LinkState,
    Live,
    Moved,
    Outage,
    Resend,
    regroup,
    retry_pause,
)
from .._core.text import printable
from .._core.wakeups import WakeLog
from . import backend

log = logging.getLogger("delayq")

Address = tuple[str, int] | None  # a cluster node; None: the one server of any other client
UNPLACED: Address = ("", 0)  # a cluster channel whose node is not known yet
# How long a handle's first start() waits for its channel to go live; once per stall of a
# connection (LinkState.stalled), so that the shards of a queue do not wait one by one.
START_WAIT_S = 1.0


class Notifier:
    """One waiter's wake-ups from one queue channel: a handle on a :class:`Subscriber`.

    Messages carry the new earliest due time; they are hints only. When the connection is
    lost, and again when it is back, the handle hears None: waiters look at Redis again.
    ``bell`` (a :class:`backend.Bell`) is rung on every message, for a waiter on several.
    """

    def __init__(self, subscriber: Subscriber, channel: str, bell: Any = None) -> None:
        self._subscriber = subscriber
        self.channel = channel
        self._bell = bell
        self._joined = False
        self._waited = False  # a start waited for the channel: it went live, or hears so later
        self._closed = False
        self._lock = backend.Lock()
        self._changed = backend.Bell()
        self._log = WakeLog()

    async def start(self) -> None:
        """Subscribe (once; never after ``close()``). Until one call has waited for the
        subscription to go live (or given up after a short wait: the handle hears None when
        it does go live), each call waits so."""
        subscriber = self._subscriber
        if subscriber._pid != backend.process_id():
            subscriber._forked()
        if not self._joined and not self._closed:
            self._joined = True
            subscriber._join(self)
        if self._joined and not self._waited:
            await subscriber._until_live(self.channel)
            self._waited = True

    def mark(self) -> int:
        return self._log.generation

    def news(self, mark: int) -> tuple[int, int | None]:
        """(new mark, earliest due ms announced after ``mark``, None if unknown), now."""
        with self._lock:
            return self._log.news_since(mark)

    async def wait(self, mark: int, timeout: float) -> tuple[int, int | None] | None:
        """Wait for news after ``mark``: (new mark, earliest announced due ms, None if
        unknown), or None on timeout."""
        if not await self._changed.wait(lambda: self._log.generation != mark, timeout):
            return None
        return self.news(mark)

    def _push(self, due_ms: int | None) -> None:
        with self._lock:
            self._log.push(due_ms)
        self._changed.ring()
        if self._bell is not None:
            self._bell.ring()

    async def close(self) -> None:
        """Unsubscribe this handle for good (the connection closes with its last channel):
        a ``start()`` still on its way does not subscribe it again."""
        self._closed = True
        if self._joined:
            self._joined = False
            await self._subscriber._leave(self)
            self._push(None)  # waiters look at the queue again, and find it closed

    def drop(self) -> None:
        """Its queue was collected unclosed (a weakref finalizer, which may run anywhere,
        calls this): unsubscribed at the subscriber's next safe point, no lock taken here."""
        self._closed = True
        self._subscriber._dropped.append(self)


class Subscriber:
    """Every wake-up channel of one client, over one pub/sub connection per node."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._cluster = backend.is_cluster(client)
        self._lock = backend.Lock()  # everything below, and every link's state
        self._live_news = backend.Bell()  # rung when a channel goes live
        self._channels: Channels[Notifier] = Channels()  # and their handles
        self._home: dict[str, Address] = {}  # channel -> the node whose connection carries it
        self._links: dict[Address, _Link] = {}
        self._sharded = True  # SSUBSCRIBE, until a server (Redis 6.2) refuses it
        self._closed = False
        self._pid = backend.process_id()
        self.where: str | None = None  # the Redis its runner names, for outages (outages.py)
        self._dropped: collections.deque[Notifier] = collections.deque()  # see Notifier.drop

    def notifier(self, channel: str, bell: Any = None) -> Notifier:
        """A handle on ``channel`` (it subscribes on its ``start()``)."""
        return Notifier(self, channel, bell)

    @property
    def connections(self) -> int:
        """How many pub/sub connections this subscriber keeps (one per node in use)."""
        return len(self._links)

    def switched(self, master: tuple[str, int] | None = None, *, dialling: bool = True) -> None:
        """The master changed (a Sentinel failover): every connection that is not on the new
        ``master`` (None: unknown) dials again now; ``dialling``: those not connected yet too
        (they may be on their way to the old one)."""
        with self._lock:
            links = list(self._links.values())
        for link in links:
            if master is None or (link.peer != master and (dialling or link.peer is not None)):
                link.wire.kick()

    async def close(self) -> None:
        """End every connection; every handle hears None and is unsubscribed. The client's
        next ``subscriber_of`` gets a new subscriber."""
        with _REGISTRY_LOCK:
            if _SUBSCRIBERS.get(id(self._client)) is self:
                del _SUBSCRIBERS[id(self._client)]
        with self._lock:
            self._closed = True
            links, self._links = list(self._links.values()), {}
            handles, self._channels = self._channels.handles(), Channels()
            self._home = {}
        self._live_news.ring()
        for link in links:
            await link.wire.close()
        for handle in handles:
            handle._joined = False
            handle._push(None)

    # -- channels ---------------------------------------------------------------------------

    def _join(self, handle: Notifier) -> None:
        with self._lock:
            if self._closed:
                return
            self._drop_collected()
            if self._channels.join(handle.channel, handle):
                self._place(handle.channel, self._node_of(handle.channel))

    def _forked(self) -> None:
        """In a child process: the parent's connections and threads are not ours (left
        alone: closing them here would close the parent's); dial our own."""
        with self._lock:
            if self._pid == backend.process_id():
                return
            self._pid = backend.process_id()
            for link in self._links.values():
                link.wire.end()  # our copies of its wake-up sockets only
            self._links, self._home = {}, {}
            for channel in self._channels:
                self._place(channel, self._node_of(channel))

    def _drop_collected(self) -> None:
        """(Under the lock.) The handles of queues collected unclosed leave: each channel left
        without a handle is unsubscribed, and a connection left without a channel ends when
        the server confirms (or at its next PING)."""
        while self._dropped:
            handle = self._dropped.popleft()
            if not handle._joined:
                continue  # closed meanwhile, or never started
            handle._joined = False
            link = self._link_left(handle)
            if link is None:
                continue
            command = link.state.remove(handle.channel)
            if link.state.empty:
                link.retire()
            if command is not None:
                link.wire.send([command])

    def _link_left(self, handle: Notifier) -> _Link | None:
        """(Under the lock.) ``handle`` leaves its channel; the connection that carried the
        channel if that was its last handle (else None)."""
        if not self._channels.leave(handle.channel, handle):
            return None
        return self._links.get(self._home.pop(handle.channel, UNPLACED))

    async def _leave(self, handle: Notifier) -> None:
        with self._lock:
            self._drop_collected()
            link = self._link_left(handle)
            if link is None or not link.remove(handle.channel):
                return
            link.retire()
        await link.wire.close()

    def _node_of(self, channel: str) -> Address:
        if not self._cluster:
            return None
        return backend.known_slot_address(self._client, key_slot(channel.encode())) or UNPLACED

    def _place(self, channel: str, address: Address) -> None:
        """Carry ``channel`` on the connection to ``address`` (under the lock)."""
        self._home[channel] = address
        link = self._links.get(address)
        if link is None or link.wire.closing:
            link = self._links[address] = _Link(self, address)
            link.wire.start(link._run, f"delayq:pubsub:{link.where}")
        link.add(channel)

    async def _until_live(self, channel: str) -> None:
        """Wait up to START_WAIT_S for ``channel`` to go live, unless its connection stalls.
        Given up, its handles hear None when it does go live."""
        with self._lock:
            link = self._link_of(channel)
            stalled = link is not None and link.state.stalled
        if not stalled:
            await self._live_news.wait(
                lambda: self._is_live(channel) or channel not in self._channels, START_WAIT_S
            )
        with self._lock:
            link = self._link_of(channel)
            if link is not None and channel not in link.state.live:
                link.state.stalled = True
                self._channels.gave_up(channel)

    def _link_of(self, channel: str) -> _Link | None:
        return self._links.get(self._home.get(channel, UNPLACED))

    def _is_live(self, channel: str) -> bool:
        link = self._link_of(channel)
        return link is not None and channel in link.state.live

    # -- what a connection heard ------------------------------------------------------------

    def _deliver(self, channels: list[str], due_ms: int | None) -> None:
        with self._lock:
            handles = self._channels.handles(channels)
        for handle in handles:
            handle._push(due_ms)

    def _went_live(self, channel: str) -> None:
        with self._lock:
            missed = self._channels.went_live(channel)
        if missed:
            self._deliver([channel], None)  # its handles went on without it: news may be missed
        self._live_news.ring()

    async def _moved(self, link: _Link, channel: str, address: Address) -> None:
        """``channel``'s slot moved away from ``link``'s node: subscribe it at its new one."""
        if address is None:  # the server only said it dropped the channel: ask the cluster
            with contextlib.suppress(Exception):
                await backend.refresh_topology(backend.resolve(self._client))
        with self._lock:
            if channel not in link.state.wanted:
                return  # its last handle left meanwhile
            link.state.forget(channel)
            self._place(channel, address or self._node_of(channel))
        self._deliver([channel], None)

    async def _settle(self, link: _Link) -> bool:
        """Cluster: before ``link`` dials, send each of its channels to the node that serves
        the channel's slot now; whether any are left for it."""
        with self._lock:
            wanted = sorted(link.state.wanted)
        homes: dict[str, Address] = {}
        try:
            client = backend.resolve(self._client)
            for channel in wanted:
                homes[channel] = await backend.slot_address(client, key_slot(channel.encode()))
        except Exception:
            if link.address == UNPLACED:
                raise  # nowhere to dial yet: a failed try
            return True  # dial the node it knows; a lost or moved channel says otherwise
        with self._lock:
            staying = [channel for channel in homes if channel in link.state.wanted]
            for address, channels in regroup(staying, link.address, homes.__getitem__).items():
                for channel in channels:
                    link.state.forget(channel)
                    self._place(channel, address)
            return not link.state.empty


class _Link:
    """One pub/sub connection (its ``wire``) and what it carries; ``_run`` reads it and dials
    it again when lost."""

    def __init__(self, subscriber: Subscriber, address: Address) -> None:
        self.sub = subscriber
        self.address = address
        self.state = LinkState(subscriber._sharded)
        self.peer: tuple[str, int] | None = None  # where the connection went (Sentinel)
        self.wire = backend.Wire()
        self._up = False  # the current try got connected (a new outage starts from scratch)

    @property
    def where(self) -> str:
        if self.address is not None:
            return f"{self.address[0]}:{self.address[1]}" if self.address[0] else "a cluster"
        pool = self.sub._client.connection_pool
        if backend.is_sentinel(self.sub._client):
            return f"the master of {pool.service_name}"
        kwargs = pool.connection_kwargs
        if kwargs.get("path"):
            return str(kwargs["path"])
        return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"

    @property
    def outage_key(self) -> str:
        """The Redis an outage of this link is one of: its runner's name for it."""
        return self.sub.where or self.where

    # Called under the subscriber's lock:

    def add(self, channel: str) -> None:
        command = self.state.add(channel)
        if command is not None:
            self.wire.send([command])

    def remove(self, channel: str) -> bool:
        """Stop carrying ``channel``; whether none is left (then close, unsubscribing none)."""
        command = self.state.remove(channel)
        if self.state.empty:
            return True
        if command is not None:
            self.wire.send([command])
        return False

    def retire(self) -> None:
        """Take this link out of its subscriber's hands: a channel placed from now on gets a
        new one (done before any wait, so that no channel lands on a link that ends)."""
        self.wire.retire()
        OUTAGES.forget(self)
        if self.sub._links.get(self.address) is self:
            del self.sub._links[self.address]

    # The link's own task (thread):

    async def _run(self) -> None:
        backoff, outage = Backoff(), Outage()
        try:
            while not self.wire.closing:
                try:
                    if await self._try(backoff, outage):
                        return
                except backend.Interrupted:  # a kick outside a session: dial again now
                    if not self.wire.kick_taken():
                        raise
        finally:
            with self.sub._lock:
                self.retire()

    async def _try(self, backoff: Backoff, outage: Outage) -> bool:
        """One connection, from dialling to its loss and the pause after; whether the link
        is done (closed, or no channel left)."""
        sub, state, wire = self.sub, self.state, self.wire
        at_once, failure, error = False, Failure.RETRY, ""
        lost: BaseException = ConnectionError("lost")
        self._up = False
        try:
            if sub._cluster and not await sub._settle(self):
                return True
            await self._session(outage)
            return True  # closed, or no channel left here
        except backend.Interrupted:
            if not wire.kick_taken():
                raise
            at_once, error = True, "the master changed"
        except Exception as exc:
            if wire.closing:
                return True  # after close() anything may fail: end quietly
            failure, error, lost = classify_connection_error(exc), printable(str(exc)), exc
            if not isinstance(exc, backend.LOST_ERRORS):
                log.exception("delayq: pub/sub listener on %s failed", self.where)
        finally:
            with sub._lock:
                state.lose()
                self.peer = None
                if state.empty:
                    self.retire()
            await wire.hang_up()
        with sub._lock:
            if wire.closing or state.empty:
                return True
            wanted = sorted(state.wanted)
        if self._up or at_once:
            backoff.current = 0.0  # a new outage: from the shortest pause again
        if self._up:  # once per outage: messages may be missed while away
            sub._deliver(wanted, None)
        if at_once:
            log.info("delayq: pub/sub listener on %s follows a failover", self.where)
            return False  # dial again at once
        outage.failed()
        # One line for the process (outages.py): the runner's calls fail in the same outage.
        OUTAGES.lost(self.outage_key, self, lost, f"pub/sub on {self.where}")
        log.debug(
            "delayq: pub/sub listener on %s lost Redis (%s); resubscribing %d channels when "
            "it is back", self.where, error, len(wanted),
        )  # fmt: skip
        if sub._cluster:  # the node may be gone: who serves what now
            with contextlib.suppress(Exception):
                await backend.refresh_topology(backend.resolve(sub._client))
        await wire.pause(retry_pause(backoff, failure, backend.monotonic()))
        return False

    async def _session(self, outage: Outage) -> None:
        """Dial, subscribe every channel, and read until the connection fails, is closed, or
        is left empty."""
        sub, state, wire = self.sub, self.state, self.wire
        conn = backend.pubsub_connection(sub._client, self.address)
        await wire.dial(conn)
        with sub._lock:
            state.sharded = state.sharded and sub._sharded
            wire.send(state.connect())
            host, port = getattr(conn, "host", None), getattr(conn, "port", None)
            self.peer = (host, int(port)) if isinstance(host, str) and port is not None else None
        self._up = True
        failures = outage.ended()
        if failures:
            OUTAGES.back(self.outage_key, self)
            log.debug(
                "delayq: pub/sub listener on %s is back after %d failed tries; resubscribed %d "
                "channels", self.where, failures, len(state.wanted),
            )  # fmt: skip
        while True:
            with sub._lock:
                sub._drop_collected()
                if wire.closing or state.empty:
                    return
            try:
                reply = await wire.read(PING_S)
            except ResponseError as exc:
                with sub._lock:
                    event: Event | Command | None = state.on_error(_error_text(exc))
            else:
                with sub._lock:
                    event = state.idle() if reply is None else state.on_reply(reply)
            await self._act(event)

    async def _act(self, event: Event | Command | None) -> None:
        sub = self.sub
        if isinstance(event, Deliver):
            sub._deliver([event.channel], event.due_ms)
        elif isinstance(event, Live):
            sub._went_live(event.channel)
        elif isinstance(event, Resend):
            with sub._lock:
                sub._sharded = False
                self.wire.send(event.commands)
        elif isinstance(event, Moved):
            await sub._moved(self, event.channel, event.address)
        elif isinstance(event, Broken):
            raise RedisConnectionError(event.reason)
        elif isinstance(event, tuple):  # a PING, after a silence
            self.wire.send([event])


def _error_text(exc: ResponseError) -> str:
    """The error reply as Redis sent it (redis-py drops the first word of these two)."""
    if isinstance(exc, MovedError):
        return f"MOVED {exc}"
    if isinstance(exc, AskError):
        return f"ASK {exc}"
    return str(exc)


# -- one subscriber per client ----------------------------------------------------------------

_SUBSCRIBERS: weakref.WeakValueDictionary[int, Subscriber] = weakref.WeakValueDictionary()
_REGISTRY_LOCK = backend.Lock()


def _registered(client: Any) -> Subscriber | None:
    found = _SUBSCRIBERS.get(id(client))
    return found if found is not None and found._client is client else None


def subscriber_of(client: Any) -> Subscriber:
    """The subscriber of ``client`` (made on first use): every queue on it shares it."""
    with _REGISTRY_LOCK:
        found = _registered(client)
        if found is None:
            found = _SUBSCRIBERS[id(client)] = Subscriber(client)
        return found


async def close_subscriber(client: Any) -> None:
    """Close the subscriber of ``client``, if it has one (the client is being closed)."""
    found = _registered(client)
    if found is not None:
        await found.close()  # (which unregisters it)


def master_switched(client: Any, master: tuple[str, int] | None) -> None:
    """A Sentinel announced a new ``master`` for ``client``: its subscriber follows at once."""
    found = _registered(client)
    if found is not None:
        found.switched(master)


def master_reconnected(client: Any) -> None:
    """``client``'s calls got through again after failing: if they reached another master
    than the one a pub/sub connection is on, that connection dials again now."""
    found = _registered(client)
    address = getattr(getattr(client, "connection_pool", None), "master_address", None)
    if found is not None and address:  # a Sentinel client that found its master
        found.switched((str(address[0]), int(address[1])), dialling=False)


def _reset_locks_in_child() -> None:
    """A lock some thread of the parent held at the fork stays held in the child: new ones."""
    global _REGISTRY_LOCK
    _REGISTRY_LOCK = backend.Lock()
    for found in list(_SUBSCRIBERS.values()):
        found._lock = backend.Lock()
        found._live_news = backend.Bell()


if hasattr(os, "register_at_fork"):  # not on Windows
    os.register_at_fork(after_in_child=_reset_locks_in_child)
