"""The pub/sub connection layer's pure parts: what one connection carries and what its
replies mean, which node a channel belongs on, when to say an outage began and ended.

One :class:`Subscriber` per connection handle (``_async/subscriber.py``; the thread one is
generated from it) carries the wake-up channel of every queue opened on it, over one
pub/sub connection per Redis node. Each connection's bookkeeping is a :class:`LinkState`:
the channels it should carry, those the server confirmed, and the commands sent and not yet
answered, in order (Redis answers a connection's commands in the order it got them, pushed
messages in between). The shell does the I/O and acts on what these objects return.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from .connection import Backoff, Failure, classify_reply, redirect_of
from .wakeups import due_of

A = TypeVar("A", bound=Hashable)
H = TypeVar("H")
Command = tuple[str, ...]

# How long a pub/sub connection may be silent before it is asked for a PONG, and then how
# long the PONG may take before the connection counts as lost (a hung server or a dead link
# that TCP has not noticed).
PING_S = 30.0


def is_shard_channel(channel: str) -> bool:
    """A cluster queue's channel, for SSUBSCRIBE and SPUBLISH (see ``QueueKeys``)."""
    return channel.endswith(":sevents")


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


# -- what a reply means -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Deliver:
    """A wake-up message for ``channel``: the due time it announces (None: unreadable)."""

    channel: str
    due_ms: int | None


@dataclass(frozen=True, slots=True)
class Live:
    """The server confirmed the subscription to ``channel`` on this connection."""

    channel: str


@dataclass(frozen=True, slots=True)
class Moved:
    """``channel``'s slot is served by another node: ``address`` if the server said which
    (a MOVED reply), None if it only dropped the subscription (SUNSUBSCRIBE from the server)."""

    channel: str
    address: tuple[str, int] | None


@dataclass(frozen=True, slots=True)
class Resend:
    """Send these commands now (SUBSCRIBE where the server has no SSUBSCRIBE)."""

    commands: tuple[Command, ...]


@dataclass(frozen=True, slots=True)
class Broken:
    """The connection cannot go on: reconnect (after a pause); ``reason`` for the log."""

    reason: str


Event = Deliver | Live | Moved | Resend | Broken

_SUBSCRIBES = ("subscribe", "ssubscribe")
_UNSUBSCRIBES = ("unsubscribe", "sunsubscribe")


class LinkState:
    """The bookkeeping of one pub/sub connection, without the connection.

    ``sharded``: whether shard channels are SSUBSCRIBEd (Redis 7+) or SUBSCRIBEd (Redis 6.2,
    which has no sharded pub/sub; its scripts PUBLISH there); it turns False for good when a
    server refuses SSUBSCRIBE. One command per channel, so that an error reply names one.
    """

    __slots__ = ("_pinged", "_sent", "connected", "live", "sharded", "stalled", "wanted")

    def __init__(self, sharded: bool = True) -> None:
        self.sharded = sharded
        self.wanted: set[str] = set()  # the channels this connection should carry
        self.live: set[str] = set()  # confirmed by the server on the current connection
        self.connected = False
        # A handle's start gave up waiting for a channel here, and the server has answered no
        # (un)subscription since (an outage, a connection that does not answer): later starts
        # do not wait, one wait told all there was to tell. The next answer ends it.
        self.stalled = False
        self._sent: collections.deque[tuple[str, str]] = collections.deque()  # unanswered
        self._pinged = False

    @property
    def empty(self) -> bool:
        return not self.wanted

    def _command(self, verb: str, channel: str) -> Command:
        """``verb`` (subscribe, unsubscribe) for ``channel``, sharded where it should be."""
        if self.sharded and is_shard_channel(channel):
            verb = "s" + verb
        self._sent.append((verb, channel))
        return (verb.upper(), channel)

    def connect(self) -> list[Command]:
        """A new connection is up: the commands that subscribe it to every channel."""
        self.lose()
        self.connected = True
        return [self._command("subscribe", channel) for channel in sorted(self.wanted)]

    def lose(self) -> None:
        """The connection is gone; nothing on it is live or pending any more."""
        self.connected, self._pinged = False, False
        self.live.clear()
        self._sent.clear()

    def add(self, channel: str) -> Command | None:
        """Carry ``channel``; the command to send now, if connected (else on connect)."""
        if channel in self.wanted:
            return None
        self.wanted.add(channel)
        return self._command("subscribe", channel) if self.connected else None

    def remove(self, channel: str) -> Command | None:
        """Stop carrying ``channel``; the command to send now, if it was subscribed."""
        if channel not in self.wanted:
            return None
        self.forget(channel)
        return self._command("unsubscribe", channel) if self.connected else None

    def forget(self, channel: str) -> None:
        """Stop carrying ``channel`` without a command (the server already dropped it, or it
        was never sent: it moves to another node's connection)."""
        self.wanted.discard(channel)
        self.live.discard(channel)

    def idle(self) -> Command | Broken:
        """Nothing came for PING_S: a PING to ask, or Broken if the last one went unanswered."""
        if self._pinged:
            return Broken(f"no reply to PING within {PING_S:g} s")
        self._pinged = True
        return ("PING",)

    def on_reply(self, reply: Any) -> Event | None:
        """What a reply read from the connection means (a pushed message, a confirmation)."""
        self._pinged = False
        if not isinstance(reply, list | tuple) or not reply:
            return None
        kind = _text(reply[0]).lower()
        channel = _text(reply[1]) if len(reply) > 1 else ""
        if kind in ("message", "smessage"):
            if channel in self.wanted and len(reply) > 2:
                return Deliver(channel, due_of(reply[2]))
            return None
        if kind in _SUBSCRIBES or kind in _UNSUBSCRIBES:
            if self._sent and self._sent[0] == (kind, channel):
                self._sent.popleft()
                self.stalled = False
                if kind in _UNSUBSCRIBES or channel not in self.wanted or channel in self.live:
                    return None
                self.live.add(channel)
                return Live(channel)
            if kind == "sunsubscribe" and channel in self.wanted:
                # Not asked for: the slot of the channel moved to another node.
                self.live.discard(channel)
                return Moved(channel, None)
        return None  # a PONG, or a confirmation of a command a lost connection sent

    def on_error(self, message: str) -> Event | None:
        """What an error reply (a redis-py ``ResponseError``'s text with its first word) means:
        it answers the oldest unanswered command."""
        self._pinged = False
        if not self._sent:
            return Broken(f"unexpected error reply: {message}")
        verb, channel = self._sent.popleft()
        self.stalled = False
        kind = classify_reply(message)
        if kind is Failure.MOVED or kind is Failure.ASK:
            _, host, port = redirect_of(message)
            return Moved(channel, (host, port)) if channel in self.wanted else None
        if verb.startswith("s") and "unknown command" in message.lower():
            # Redis 6.2: no sharded pub/sub. From now on SUBSCRIBE instead.
            self.sharded = False
            if verb == "ssubscribe" and channel in self.wanted:
                return Resend((self._command("subscribe", channel),))
            return None
        return Broken(f"Redis refused {verb.upper()} {channel}: {message}")


# -- the channels of a subscriber -------------------------------------------------------------


class Channels(Generic[H]):
    """Every channel a subscriber carries: the handles that listen on each, and which channels
    their handles rely on, live or not (live once, or waited for in vain): when such a channel
    goes live (again) its handles hear "unknown, look at Redis", as messages may have been
    published while no connection carried it (a reconnect, a move, a first subscription that
    came after its handles had stopped waiting)."""

    __slots__ = ("_handles", "_relied_on")

    def __init__(self) -> None:
        self._handles: dict[str, list[H]] = {}
        self._relied_on: set[str] = set()

    def __contains__(self, channel: object) -> bool:
        return channel in self._handles

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._handles))

    def handles(self, channels: Iterable[str] | None = None) -> list[H]:
        """The handles on ``channels`` (None: on every channel)."""
        chosen = self._handles if channels is None else channels
        return [h for channel in chosen for h in self._handles.get(channel, ())]

    def join(self, channel: str, handle: H) -> bool:
        """One more handle on ``channel``; whether it is the first (subscribe it)."""
        handles = self._handles.setdefault(channel, [])
        handles.append(handle)
        return len(handles) == 1

    def leave(self, channel: str, handle: H) -> bool:
        """One handle fewer (if it was on ``channel``); whether it was the last (unsubscribe
        the channel)."""
        handles = self._handles.get(channel, [])
        if handle not in handles:
            return False
        handles.remove(handle)
        if handles:
            return False
        del self._handles[channel]
        self._relied_on.discard(channel)
        return True

    def gave_up(self, channel: str) -> None:
        """A handle stopped waiting for ``channel`` to go live: it looks at Redis without it."""
        if channel in self._handles:
            self._relied_on.add(channel)

    def went_live(self, channel: str) -> bool:
        """``channel`` is live (again); whether its handles must look at Redis: it had been
        live before, or they had stopped waiting for it."""
        missed = channel in self._relied_on
        self._relied_on.add(channel)
        return missed


def regroup(channels: Iterable[str], here: A, home: Callable[[str], A]) -> dict[A, list[str]]:
    """The channels of the connection to node ``here`` that belong elsewhere now, by their
    new node (``home``: the node that serves a channel's slot)."""
    moves: dict[A, list[str]] = {}
    for channel in sorted(channels):
        where = home(channel)
        if where != here:
            moves.setdefault(where, []).append(channel)
    return moves


# -- retries ----------------------------------------------------------------------------------


@dataclass(slots=True)
class Outage:
    """Counts a connection's failed tries, so that an outage is logged when it begins and
    when it ends, not on every retry."""

    failures: int = 0

    def failed(self) -> bool:
        """One more failed try; whether it is the first of an outage (log it)."""
        self.failures += 1
        return self.failures == 1

    def ended(self) -> int:
        """The connection is back: how many tries had failed (0: there was no outage)."""
        failures, self.failures = self.failures, 0
        return failures


def retry_pause(backoff: Backoff, failure: Failure, now: float) -> float:
    """How long a lost pub/sub connection waits before it dials again: the longest pause when
    retrying soon cannot help (UNREACHABLE: a name that does not resolve, TLS refused), else
    the runner's doubling backoff. (After a failover it dials again at once: the new master
    is known.)"""
    if failure is Failure.UNREACHABLE:
        backoff.current = backoff.cap
        return backoff.cap
    return backoff.pause(now, None)
