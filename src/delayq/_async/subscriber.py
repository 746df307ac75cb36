"""The wake-up channels of every queue of one connection, over one pub/sub connection per node.

A :class:`Subscriber` belongs to one client (``Runner.subscriber``; every queue and shard
opened on that runner shares it). It hands out :class:`Notifier` handles, one per queue
channel and waiter, and carries all their channels over one pub/sub connection per Redis
node: one for a standalone or Sentinel deployment, one per node that serves a subscribed
slot on a cluster. Channels are subscribed and unsubscribed on the live connection.

A connection lost is dialled again with the runner's backoff; its channels are subscribed
again and every handle hears None ("unknown, look at Redis"), when the connection is lost
and again once it is back. On a cluster a channel whose slot moved follows it to its new
node. A Sentinel failover (``+switch-master`` seen by the runner's watch) drops the
connection at once, so that it subscribes on the new master instead of waiting for
Sentinel to demote the old one.

The logic is in ``_core/subscriptions.py``; this shell does the asyncio I/O, one task per
connection. Its thread twin, ``_sync/subscriber.py``, is kept by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from typing import Any

from redis.crc import key_slot
from redis.exceptions import AskError, MovedError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError

from .._core.connection import Backoff, Failure, classify_connection_error
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
START_WAIT_S = 1.0  # how long start() waits for a first subscription to go live


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
        self._was_live = False
        self._changed = asyncio.Event()
        self._log = WakeLog()

    async def start(self) -> None:
        """Subscribe (once); returns when the subscription is live or after a short wait."""
        if not self._joined:
            self._joined = True
            self._subscriber._join(self)
        if not self._was_live:
            self._was_live = await self._subscriber._until_live(self.channel, START_WAIT_S)

    def mark(self) -> int:
        return self._log.generation

    def news(self, mark: int) -> tuple[int, int | None]:
        """(new mark, earliest due ms announced after ``mark``, None if unknown), now."""
        return self._log.news_since(mark)

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
        if self._bell is not None:
            self._bell.ring()

    async def close(self) -> None:
        """Unsubscribe this handle (the connection closes with its last channel)."""
        if self._joined:
            self._joined = self._was_live = False
            await self._subscriber._leave(self)
            self._push(None)  # waiters look at the queue again, and find it closed


class Subscriber:
    """Every wake-up channel of one client, over one pub/sub connection per node."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._cluster = backend.is_cluster(client)
        self._channels = Channels()
        self._handles: dict[str, list[Notifier]] = {}
        self._home: dict[str, Address] = {}  # channel -> the node whose connection carries it
        self._links: dict[Address, _Link] = {}
        self._sharded = True  # SSUBSCRIBE, until a server (Redis 6.2) refuses it
        self._live_news = asyncio.Event()
        self._closed = False

    def notifier(self, channel: str, bell: Any = None) -> Notifier:
        """A handle on ``channel`` (it subscribes on its ``start()``)."""
        return Notifier(self, channel, bell)

    @property
    def connections(self) -> int:
        """How many pub/sub connections this subscriber keeps (one per node in use)."""
        return len(self._links)

    def switched(self, master: tuple[str, int] | None = None) -> None:
        """The master changed (a Sentinel failover): every connection that is not on the new
        ``master`` (None: unknown) dials again now."""
        for link in list(self._links.values()):
            if master is None or link.peer != master:
                link.kick()

    def follow_master(self) -> None:
        """The runner reconnected: if its client now points at another master than the one
        a connection is on, that connection dials again now."""
        master = backend.master_address(self._client)
        for link in list(self._links.values()):
            if master is not None and link.peer is not None and link.peer != master:
                link.kick()

    async def close(self) -> None:
        """End every connection; every handle hears None and is unsubscribed. The client's
        next ``subscriber_of`` gets a new subscriber."""
        self._closed = True
        if _SUBSCRIBERS.get(id(self._client)) is self:
            del _SUBSCRIBERS[id(self._client)]
        links, self._links = list(self._links.values()), {}
        for link in links:
            await link.close()
        handles = [h for hs in self._handles.values() for h in hs]
        self._handles, self._home, self._channels = {}, {}, Channels()
        for handle in handles:
            handle._joined = handle._was_live = False
            handle._push(None)

    # -- channels ---------------------------------------------------------------------------

    def _join(self, handle: Notifier) -> None:
        if self._closed:
            return
        channel = handle.channel
        self._handles.setdefault(channel, []).append(handle)
        if self._channels.join(channel):
            self._place(channel, self._node_of(channel))

    async def _leave(self, handle: Notifier) -> None:
        channel = handle.channel
        handles = self._handles.get(channel, [])
        if handle not in handles:
            return
        handles.remove(handle)
        if not self._channels.leave(channel):
            return
        del self._handles[channel]
        link = self._links.get(self._home.pop(channel, UNPLACED))
        if link is not None and link.remove(channel):
            await self._end(link)

    def _node_of(self, channel: str) -> Address:
        if not self._cluster:
            return None
        return backend.known_slot_address(self._client, key_slot(channel.encode())) or UNPLACED

    def _place(self, channel: str, address: Address) -> None:
        self._home[channel] = address
        link = self._links.get(address)
        if link is None or link._closing:
            link = self._links[address] = _Link(self, address)
            link.begin()
        link.add(channel)

    async def _end(self, link: _Link) -> None:
        if self._links.get(link.address) is link:
            del self._links[link.address]
        await link.close()

    async def _until_live(self, channel: str, timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self._is_live(channel):
            remaining = deadline - loop.time()
            if remaining <= 0 or channel not in self._channels:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._live_news.wait(), remaining)
        return True

    def _is_live(self, channel: str) -> bool:
        link = self._links.get(self._home.get(channel, UNPLACED))
        return link is not None and channel in link.state.live

    # -- what a connection heard ------------------------------------------------------------

    def _deliver(self, channel: str, due_ms: int | None) -> None:
        for handle in list(self._handles.get(channel, ())):
            handle._push(due_ms)

    def _unknown(self, channels: set[str]) -> None:
        for channel in sorted(channels):
            self._deliver(channel, None)

    def _went_live(self, channel: str) -> None:
        if self._channels.went_live(channel):
            self._deliver(channel, None)  # back after a loss or a move: news may be missed
        news, self._live_news = self._live_news, asyncio.Event()
        news.set()

    async def _moved(self, link: _Link, channel: str, address: Address) -> None:
        """``channel``'s slot moved away from ``link``'s node: subscribe it at its new one."""
        if address is None:  # the server only said it dropped the channel: ask the cluster
            with contextlib.suppress(Exception):
                await backend.refresh_topology(backend.resolve(self._client))
            if channel not in link.state.wanted:
                return  # its last handle left meanwhile
            address = self._node_of(channel)
        link.state.forget(channel)
        self._deliver(channel, None)
        self._place(channel, address)

    async def _settle(self, link: _Link) -> bool:
        """Cluster: before ``link`` dials, send each of its channels to the node that serves
        the channel's slot now; whether any are left for it."""
        homes: dict[str, Address] = {}
        try:
            for channel in list(link.state.wanted):
                slot = key_slot(channel.encode())
                homes[channel] = await backend.slot_address(backend.resolve(self._client), slot)
        except Exception:
            if link.address == UNPLACED:
                raise  # nowhere to dial yet: a failed try
            return True  # dial the node it knows; a lost or moved channel says otherwise
        staying = [channel for channel in homes if channel in link.state.wanted]
        for address, channels in regroup(staying, link.address, homes.__getitem__).items():
            for channel in channels:
                link.state.forget(channel)
                self._place(channel, address)
        return not link.state.empty


class _Link:
    """One pub/sub connection and the task that reads it (and dials it again when lost)."""

    def __init__(self, subscriber: Subscriber, address: Address) -> None:
        self.sub = subscriber
        self.address = address
        self.state = LinkState(subscriber._sharded)
        self.peer: tuple[str, int] | None = None  # where the connection went (Sentinel)
        self._conn: Any = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._kicked = False
        self._up = False  # the current try got connected (a new outage starts from scratch)

    @property
    def where(self) -> str:
        if self.address is not None:
            return f"{self.address[0]}:{self.address[1]}" if self.address[0] else "a cluster"
        return backend.pubsub_where(self.sub._client)

    def begin(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"delayq:pubsub:{self.where}")

    def add(self, channel: str) -> None:
        command = self.state.add(channel)
        if command is not None:
            backend.write_now(self._conn, [command])

    def remove(self, channel: str) -> bool:
        """Stop carrying ``channel``; whether none is left (then close, unsubscribing none)."""
        command = self.state.remove(channel)
        if self.state.empty:
            return True
        if command is not None:
            backend.write_now(self._conn, [command])
        return False

    def kick(self) -> None:
        """Drop the connection and dial again at once (wherever the task is)."""
        if self._task is not None and not self._closing and not self._kicked:
            self._kicked = True
            self._task.cancel()

    async def close(self) -> None:
        self._closing = True
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def _kick_taken(self) -> bool:
        """A cancel came: whether it was a kick (go on, dialling again at once)."""
        task = asyncio.current_task()
        if self._closing or not self._kicked or task is None:
            return False
        task.uncancel()
        self._kicked = False
        return True

    def _retire(self) -> None:
        """Take this link out of its subscriber's hands: a channel placed from now on gets a
        new one (done before any await, so that no channel lands on a link that ends)."""
        self._closing = True
        if self.sub._links.get(self.address) is self:
            del self.sub._links[self.address]

    async def _run(self) -> None:
        backoff, outage = Backoff(), Outage()
        try:
            while True:
                try:
                    if await self._try(backoff, outage):
                        return
                except asyncio.CancelledError:  # a kick outside a session: dial again now
                    if not self._kick_taken():
                        raise
        finally:
            self._retire()

    async def _try(self, backoff: Backoff, outage: Outage) -> bool:
        """One connection, from dialling to its loss and the pause after; whether the link
        is done (no channel left)."""
        sub, state = self.sub, self.state
        at_once, failure, error = False, Failure.RETRY, ""
        self._up = False
        try:
            if sub._cluster and not await sub._settle(self):
                return True
            await self._session(outage)
            return True  # no channel left here
        except asyncio.CancelledError:
            if not self._kick_taken():
                raise
            at_once, error = True, "the master changed"
        except Exception as exc:
            failure, error = classify_connection_error(exc), printable(str(exc))
            if not isinstance(exc, backend.LOST_ERRORS):
                log.exception("delayq: pub/sub listener on %s failed", self.where)
        finally:
            if state.empty:
                self._retire()
            await self._hang_up()  # (no await inside that a kick could land on)
        if state.empty:
            return True
        if self._up or at_once:
            backoff.current = 0.0  # a new outage: from the shortest pause again
        if self._up:  # once per outage: messages may be missed while away
            sub._unknown(state.wanted)
        if at_once:
            log.info("delayq: pub/sub listener on %s follows a failover", self.where)
            return False  # dial again at once
        if outage.failed():
            log.warning(
                "delayq: pub/sub listener on %s lost Redis (%s); resubscribing %d channels "
                "when it is back",
                self.where, error, len(state.wanted),
            )  # fmt: skip
        else:
            log.debug("delayq: pub/sub listener on %s: still lost (%s)", self.where, error)
        if sub._cluster:  # the node may be gone: who serves what now
            with contextlib.suppress(Exception):
                await backend.refresh_topology(backend.resolve(sub._client))
        await asyncio.sleep(retry_pause(backoff, failure, _now()))
        return False

    async def _session(self, outage: Outage) -> None:
        """Dial, subscribe every channel, and read until the connection fails or is left
        empty."""
        state = self.state
        state.sharded = state.sharded and self.sub._sharded
        conn = backend.pubsub_connection(self.sub._client, self.address)
        self._conn = conn
        await conn.connect()
        self.peer = backend.peer_of(conn)
        backend.write_now(conn, state.connect())
        self._up = True
        failures = outage.ended()
        if failures:
            log.info(
                "delayq: pub/sub listener on %s is back after %d failed tries; resubscribed %d "
                "channels", self.where, failures, len(state.wanted),
            )  # fmt: skip
        while not state.empty:
            try:
                reply = await conn.read_response(timeout=PING_S, push_request=True)
            except ResponseError as exc:
                event: Event | Command | None = state.on_error(_error_text(exc))
            else:
                event = state.idle() if reply is None else state.on_reply(reply)
            await self._act(event)

    async def _act(self, event: Event | Command | None) -> None:
        sub = self.sub
        if isinstance(event, Deliver):
            sub._deliver(event.channel, event.due_ms)
        elif isinstance(event, Live):
            sub._went_live(event.channel)
        elif isinstance(event, Resend):
            sub._sharded = False
            backend.write_now(self._conn, list(event.commands))
        elif isinstance(event, Moved):
            await sub._moved(self, event.channel, event.address)
        elif isinstance(event, Broken):
            raise RedisConnectionError(event.reason)
        elif isinstance(event, tuple):  # a PING, after a silence
            backend.write_now(self._conn, [event])

    async def _hang_up(self) -> None:
        conn, self._conn = self._conn, None
        self.state.lose()
        self.peer = None
        if conn is not None:
            await backend.disconnect(conn)


def _now() -> float:
    return asyncio.get_running_loop().time()


def _error_text(exc: ResponseError) -> str:
    """The error reply as Redis sent it (redis-py drops the first word of these two)."""
    if isinstance(exc, MovedError):
        return f"MOVED {exc}"
    if isinstance(exc, AskError):
        return f"ASK {exc}"
    return str(exc)


# -- one subscriber per client ----------------------------------------------------------------

_SUBSCRIBERS: weakref.WeakValueDictionary[int, Subscriber] = weakref.WeakValueDictionary()


def subscriber_of(client: Any) -> Subscriber:
    """The subscriber of ``client`` (made on first use): every queue on it shares it."""
    found = _SUBSCRIBERS.get(id(client))
    if found is None or found._client is not client:
        found = _SUBSCRIBERS[id(client)] = Subscriber(client)
    return found


async def close_subscriber(client: Any) -> None:
    """Close the subscriber of ``client``, if it has one (the client is being closed)."""
    found = _SUBSCRIBERS.pop(id(client), None)
    if found is not None and found._client is client:
        await found.close()


def master_switched(client: Any, master: tuple[str, int] | None) -> None:
    """A Sentinel announced a new ``master`` for ``client``: its subscriber follows at once."""
    found = _SUBSCRIBERS.get(id(client))
    if found is not None and found._client is client:
        found.switched(master)


def master_reconnected(client: Any) -> None:
    """``client``'s calls got through again after failing: its subscriber follows if they
    reached another master."""
    found = _SUBSCRIBERS.get(id(client))
    if found is not None and found._client is client:
        found.follow_master()
