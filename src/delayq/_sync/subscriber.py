"""The wake-up channels of every queue of one connection, over one pub/sub connection per node
(threads).

The thread twin of ``_async/subscriber.py``, kept by hand (threads where that one has tasks):
see there for what a :class:`Subscriber` does. The logic is in ``_core/subscriptions.py``.

Each connection has one thread, which alone reads and writes its socket (a TLS socket must
not be written by one thread while another reads it): other threads queue their SUBSCRIBE
and UNSUBSCRIBE commands and wake it through a socket pair. It never lets redis-py reconnect
by itself inside a read, so that ``close()`` can end it without Redis answering.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import socket
import threading
import time
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
JOIN_S = 2.0  # how long close() waits for a connection's thread to end


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
        self._cond = threading.Condition()
        self._log = WakeLog()

    def start(self) -> None:
        """Subscribe (once); returns when the subscription is live or after a short wait."""
        if self._subscriber._pid != os.getpid():
            self._subscriber._forked()
        if not self._joined:
            self._joined = True
            self._subscriber._join(self)
        if not self._was_live:
            self._was_live = self._subscriber._until_live(self.channel, START_WAIT_S)

    def mark(self) -> int:
        return self._log.generation

    def news(self, mark: int) -> tuple[int, int | None]:
        """(new mark, earliest due ms announced after ``mark``, None if unknown), now."""
        with self._cond:
            return self._log.news_since(mark)

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
        if self._bell is not None:
            self._bell.ring()

    def close(self) -> None:
        """Unsubscribe this handle (the connection closes with its last channel)."""
        if self._joined:
            self._joined = self._was_live = False
            self._subscriber._leave(self)
            self._push(None)  # waiters look at the queue again, and find it closed


class Subscriber:
    """Every wake-up channel of one client, over one pub/sub connection per node."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._cluster = backend.is_cluster(client)
        self._lock = threading.RLock()  # everything below, and every link's state
        self._live_news = threading.Condition(self._lock)
        self._channels = Channels()
        self._handles: dict[str, list[Notifier]] = {}
        self._home: dict[str, Address] = {}  # channel -> the node whose connection carries it
        self._links: dict[Address, _Link] = {}
        self._sharded = True  # SSUBSCRIBE, until a server (Redis 6.2) refuses it
        self._closed = False
        self._pid = os.getpid()

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
        with self._lock:
            links = list(self._links.values())
        for link in links:
            if master is None or link.peer != master:
                link.kick()

    def follow_master(self) -> None:
        """The runner reconnected: if its client now points at another master than the one
        a connection is on, that connection dials again now."""
        master = backend.master_address(self._client)
        with self._lock:
            links = list(self._links.values())
        for link in links:
            if master is not None and link.peer is not None and link.peer != master:
                link.kick()

    def close(self) -> None:
        """End every connection; every handle hears None and is unsubscribed. The client's
        next ``subscriber_of`` gets a new subscriber."""
        with _REGISTRY_LOCK:
            if _SUBSCRIBERS.get(id(self._client)) is self:
                del _SUBSCRIBERS[id(self._client)]
        with self._lock:
            self._closed = True
            links, self._links = list(self._links.values()), {}
            handles = [h for hs in self._handles.values() for h in hs]
            self._handles, self._home, self._channels = {}, {}, Channels()
            self._live_news.notify_all()
        for link in links:
            link.close()
        for handle in handles:
            handle._joined = handle._was_live = False
            handle._push(None)

    # -- channels ---------------------------------------------------------------------------

    def _join(self, handle: Notifier) -> None:
        with self._lock:
            if self._closed:
                return
            channel = handle.channel
            self._handles.setdefault(channel, []).append(handle)
            if self._channels.join(channel):
                self._place(channel, self._node_of(channel))

    def _forked(self) -> None:
        """In a child process: the parent's connections and threads are not ours (left
        alone: closing them here would close the parent's); dial our own."""
        with self._lock:
            if self._pid == os.getpid():
                return
            self._pid = os.getpid()
            for link in self._links.values():
                link._wake_r.close()  # our copies of its socket pair only
                link._wake_w.close()
            self._links, self._home = {}, {}
            for channel in self._channels:
                self._place(channel, self._node_of(channel))

    def _leave(self, handle: Notifier) -> None:
        channel = handle.channel
        with self._lock:
            handles = self._handles.get(channel, [])
            if handle not in handles:
                return
            handles.remove(handle)
            if not self._channels.leave(channel):
                return
            del self._handles[channel]
            link = self._links.get(self._home.pop(channel, UNPLACED))
            if link is None or not link.remove(channel):
                return
            link.retire()
        link.close()

    def _node_of(self, channel: str) -> Address:
        if not self._cluster:
            return None
        return backend.known_slot_address(self._client, key_slot(channel.encode())) or UNPLACED

    def _place(self, channel: str, address: Address) -> None:
        """Carry ``channel`` on the connection to ``address`` (under the lock)."""
        self._home[channel] = address
        link = self._links.get(address)
        if link is None or link.closing:
            link = self._links[address] = _Link(self, address)
            link.begin()
        link.add(channel)

    def _until_live(self, channel: str, timeout: float) -> bool:
        with self._live_news:
            self._live_news.wait_for(
                lambda: self._is_live(channel) or channel not in self._channels, timeout
            )
            return self._is_live(channel)

    def _is_live(self, channel: str) -> bool:
        link = self._links.get(self._home.get(channel, UNPLACED))
        return link is not None and channel in link.state.live

    # -- what a connection heard ------------------------------------------------------------

    def _deliver(self, channels: list[str], due_ms: int | None) -> None:
        with self._lock:
            handles = [h for channel in channels for h in self._handles.get(channel, ())]
        for handle in handles:
            handle._push(due_ms)

    def _went_live(self, channel: str) -> None:
        with self._lock:
            again = self._channels.went_live(channel)
            self._live_news.notify_all()
        if again:
            self._deliver([channel], None)  # back after a loss or a move: news may be missed

    def _moved(self, link: _Link, channel: str, address: Address) -> None:
        """``channel``'s slot moved away from ``link``'s node: subscribe it at its new one."""
        if address is None:  # the server only said it dropped the channel: ask the cluster
            with contextlib.suppress(Exception):
                backend.refresh_topology(backend.resolve(self._client))
        with self._lock:
            if channel not in link.state.wanted:
                return  # its last handle left meanwhile
            link.state.forget(channel)
            self._place(channel, address or self._node_of(channel))
        self._deliver([channel], None)

    def _settle(self, link: _Link) -> bool:
        """Cluster: before ``link`` dials, send each of its channels to the node that serves
        the channel's slot now; whether any are left for it."""
        with self._lock:
            wanted = sorted(link.state.wanted)
        homes: dict[str, Address] = {}
        try:
            client = backend.resolve(self._client)
            for channel in wanted:
                homes[channel] = backend.slot_address(client, key_slot(channel.encode()))
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
            if link.state.empty:
                link.retire()
                return False
            return True


class _Kicked(Exception):
    """The connection is to be dropped and dialled again at once (a failover)."""


class _Link:
    """One pub/sub connection and the thread that reads it (and dials it again when lost)."""

    def __init__(self, subscriber: Subscriber, address: Address) -> None:
        self.sub = subscriber
        self.address = address
        self.state = LinkState(subscriber._sharded)
        self.peer: tuple[str, int] | None = None  # where the connection went (Sentinel)
        self.closing = False
        self._conn: Any = None
        self._outbox: list[Command] = []  # commands for the thread to send
        self._kicked = False
        self._up = False  # the current try got connected (a new outage starts from scratch)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._thread: threading.Thread | None = None

    @property
    def where(self) -> str:
        if self.address is not None:
            return f"{self.address[0]}:{self.address[1]}" if self.address[0] else "a cluster"
        return backend.pubsub_where(self.sub._client)

    def begin(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"delayq:pubsub:{self.where}", daemon=True
        )
        self._thread.start()

    # Called under the subscriber's lock:

    def add(self, channel: str) -> None:
        command = self.state.add(channel)
        if command is not None:
            self._outbox.append(command)
            self._poke()

    def remove(self, channel: str) -> bool:
        """Stop carrying ``channel``; whether none is left (then close, unsubscribing none)."""
        command = self.state.remove(channel)
        if self.state.empty:
            return True
        if command is not None:
            self._outbox.append(command)
            self._poke()
        return False

    def retire(self) -> None:
        """Take this link out of its subscriber's hands: a channel placed from now on gets a
        new one."""
        self.closing = True
        if self.sub._links.get(self.address) is self:
            del self.sub._links[self.address]
        self._poke()

    # Called from any thread:

    def kick(self) -> None:
        """Drop the connection and dial again at once."""
        self._kicked = True
        self._poke()

    def close(self) -> None:
        self.closing = True
        self._poke()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(JOIN_S)

    def _poke(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"!")

    def _drain(self) -> None:
        with contextlib.suppress(OSError):
            while self._wake_r.recv(4096):
                pass

    # The link's thread:

    def _run(self) -> None:
        backoff, outage = Backoff(), Outage()
        try:
            while not self.closing and not self._try(backoff, outage):
                pass
        finally:
            with self.sub._lock:
                self.retire()
            self._wake_r.close()
            self._wake_w.close()

    def _try(self, backoff: Backoff, outage: Outage) -> bool:
        """One connection, from dialling to its loss and the pause after; whether the link
        is done (closed, or no channel left)."""
        sub, state = self.sub, self.state
        at_once, failure, error = False, Failure.RETRY, ""
        self._up = self._kicked = False
        try:
            if sub._cluster and not sub._settle(self):
                return True
            self._session(outage)
            return True  # closed, or no channel left here
        except _Kicked:
            at_once, error = True, "the master changed"
        except Exception as exc:  # after close() anything may fail: end quietly
            if self.closing:
                return True
            failure, error = classify_connection_error(exc), printable(str(exc))
            if not isinstance(exc, backend.LOST_ERRORS):
                log.exception("delayq: pub/sub listener on %s failed", self.where)
        finally:
            self._hang_up()
        with sub._lock:
            if self.closing or state.empty:
                return True
            wanted = sorted(state.wanted)
        if self._up or at_once:
            backoff.current = 0.0  # a new outage: from the shortest pause again
        if self._up:  # once per outage: messages may be missed while away
            sub._deliver(wanted, None)
        if at_once:
            log.info("delayq: pub/sub listener on %s follows a failover", self.where)
            return False  # dial again at once
        if outage.failed():
            log.warning(
                "delayq: pub/sub listener on %s lost Redis (%s); resubscribing %d channels "
                "when it is back",
                self.where, error, len(wanted),
            )  # fmt: skip
        else:
            log.debug("delayq: pub/sub listener on %s: still lost (%s)", self.where, error)
        if sub._cluster:  # the node may be gone: who serves what now
            with contextlib.suppress(Exception):
                backend.refresh_topology(backend.resolve(sub._client))
        pause = retry_pause(backoff, failure, time.monotonic())
        with selectors.DefaultSelector() as selector:
            selector.register(self._wake_r, selectors.EVENT_READ)
            if not self._kicked and not self.closing:
                selector.select(pause)  # a kick or close() ends the pause
        self._drain()
        return False

    def _session(self, outage: Outage) -> None:
        """Dial, subscribe every channel, and read until the connection fails, is closed, or
        is left empty."""
        sub, state = self.sub, self.state
        conn = backend.pubsub_connection(sub._client, self.address)
        self._conn = conn
        conn.connect()
        with sub._lock:
            if self._kicked:
                raise _Kicked  # a failover was announced while it dialled: maybe the old master
            state.sharded = state.sharded and sub._sharded
            self._outbox = state.connect()
            self.peer = backend.peer_of(conn)
        self._up = True
        failures = outage.ended()
        if failures:
            log.info(
                "delayq: pub/sub listener on %s is back after %d failed tries; resubscribed %d "
                "channels", self.where, failures, len(state.wanted),
            )  # fmt: skip
        with selectors.DefaultSelector() as selector:
            selector.register(conn._sock, selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            while True:
                with sub._lock:
                    commands, self._outbox = self._outbox, []
                    if self.closing or state.empty:
                        return
                if self._kicked:
                    raise _Kicked
                if commands:
                    conn.send_packed_command(conn.pack_commands(commands), check_health=False)
                if not conn.can_read(0):
                    ready = selector.select(PING_S)
                    if not ready:
                        with sub._lock:
                            step = state.idle()
                            if isinstance(step, Broken):
                                raise RedisConnectionError(step.reason)
                            self._outbox.append(step)
                    self._drain()
                    continue
                try:
                    reply = conn.read_response(push_request=True)
                except ResponseError as exc:
                    with sub._lock:
                        event: Event | None = state.on_error(_error_text(exc))
                else:
                    with sub._lock:
                        event = state.on_reply(reply)
                self._act(event)

    def _act(self, event: Event | None) -> None:
        sub = self.sub
        if isinstance(event, Deliver):
            sub._deliver([event.channel], event.due_ms)
        elif isinstance(event, Live):
            sub._went_live(event.channel)
        elif isinstance(event, Resend):
            with sub._lock:
                sub._sharded = False
                self._outbox.extend(event.commands)
        elif isinstance(event, Moved):
            sub._moved(self, event.channel, event.address)
        elif isinstance(event, Broken):
            raise RedisConnectionError(event.reason)

    def _hang_up(self) -> None:
        with self.sub._lock:
            conn, self._conn = self._conn, None
            self.state.lose()
            self._outbox = []
            self.peer = None
        if conn is not None:
            backend.disconnect(conn)


def _error_text(exc: ResponseError) -> str:
    """The error reply as Redis sent it (redis-py drops the first word of these two)."""
    if isinstance(exc, MovedError):
        return f"MOVED {exc}"
    if isinstance(exc, AskError):
        return f"ASK {exc}"
    return str(exc)


# -- one subscriber per client ----------------------------------------------------------------

_SUBSCRIBERS: weakref.WeakValueDictionary[int, Subscriber] = weakref.WeakValueDictionary()
_REGISTRY_LOCK = threading.Lock()


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


def close_subscriber(client: Any) -> None:
    """Close the subscriber of ``client``, if it has one (the client is being closed)."""
    with _REGISTRY_LOCK:
        found = _registered(client)
        if found is not None:
            del _SUBSCRIBERS[id(client)]
    if found is not None:
        found.close()


def master_switched(client: Any, master: tuple[str, int] | None) -> None:
    """A Sentinel announced a new ``master`` for ``client``: its subscriber follows at once."""
    found = _registered(client)
    if found is not None:
        found.switched(master)


def _reset_locks_in_child() -> None:
    """A lock some thread of the parent held at the fork stays held in the child: new ones."""
    global _REGISTRY_LOCK
    _REGISTRY_LOCK = threading.Lock()
    for found in list(_SUBSCRIBERS.values()):
        found._lock = threading.RLock()
        found._live_news = threading.Condition(found._lock)


if hasattr(os, "register_at_fork"):  # not on Windows
    os.register_at_fork(after_in_child=_reset_locks_in_child)


def master_reconnected(client: Any) -> None:
    """``client``'s calls got through again after failing: its subscriber follows if they
    reached another master."""
    found = _registered(client)
    if found is not None:
        found.follow_master()
