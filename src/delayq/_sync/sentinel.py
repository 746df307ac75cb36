# Generated from _async/sentinel.py by scripts/unasync.py: do not edit.
"""The runner's watch on the sentinels' announcements of a Sentinel client's failovers.

The sync watch in ``_sync/sentinel.py`` is generated from this file by ``scripts/unasync.py``;
edit here.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from .._core.connection import FailoverNews, failover_news, new_master_of
from . import backend

log = logging.getLogger("delayq")

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
TICK_S = 5.0  # how often a silent watch looks whether a hold has run out


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
        self._pool = client.connection_pool if backend.is_sentinel(client) else None
        self._on_switch = on_switch  # told of a new master after the connections were dropped
        self._wires: list[backend.Wire] = []
        self._open = True  # calls may go; False: a promotion is under way
        self._news = backend.Bell()  # rung when _open turns True
        self._held_until = 0.0

    def start(self) -> None:
        if self._pool is None or self._wires:
            return
        for sentinel in self._pool.sentinel_manager.sentinels:
            wire = backend.Wire()
            self._wires.append(wire)
            wire.start(functools.partial(self._watch, sentinel, wire), "delayq-sentinel")

    def wait(self, deadline: float | None) -> bool:
        """Wait while a promotion is under way, until ``deadline`` at the most (or HOLD_S
        after the promotion began); whether calls may go now."""
        if self._open:
            return True
        until = self._held_until if deadline is None else min(self._held_until, deadline)
        self._news.wait(lambda: self._open, until - backend.monotonic())
        return self._open or backend.monotonic() >= self._held_until

    def _go(self) -> None:
        self._open = True
        self._news.ring()

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
            self._go()
            if self._on_switch is not None:
                self._on_switch(new_master_of(data))
        elif news is FailoverNews.PROMOTING:
            self._held_until = backend.monotonic() + HOLD_S
            self._open = False
        elif news is FailoverNews.ABORTED:  # the old master stays
            self._go()

    def _watch(self, sentinel: Any, wire: backend.Wire) -> None:
        pool = sentinel.connection_pool
        backoff = 0.05
        while not wire.closing:
            try:
                wire.dial(pool.connection_class(**pool.connection_kwargs))
                wire.send([("SUBSCRIBE", *SENTINEL_EVENTS)])
                backoff = 0.05
                while True:
                    message = wire.read(TICK_S)
                    if message is None:
                        if not self._open and backend.monotonic() > self._held_until:
                            self._go()  # no new master announced in time: go on
                    elif _text(message[0]) == "message":
                        self._event(sentinel, _text(message[1]), bytes(message[2]))
            except Exception as exc:  # a sentinel down: try it again after a pause
                if wire.closing:
                    return
                log.debug("delayq: watching a sentinel failed (%s); retrying", exc)
                wire.pause(backoff)
                backoff = min(backoff * 2, 2.0)
            finally:
                wire.hang_up()

    def close(self) -> None:
        wires, self._wires = self._wires, []
        for wire in wires:
            wire.retire()
        for wire in wires:
            wire.close()
        self._go()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
