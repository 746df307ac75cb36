"""Relay liveness: each running relay records a heartbeat in Redis, so that an operator can
alert on "no relay alive while rows are pending" even after the last relay is gone (a
relay's own ``--metrics-port`` dies with it, and an empty table gives no samples).

The heartbeats of one outbox table are a sorted set, ``delayq:outbox:{<channel>}:relays``
(``<channel>`` is ``schema.table`` or ``table``), member ``name@host:pid``, score the time
(Redis's clock, ms) until which the beat vouches for the relay: its sweep interval twice
over. A relay beats from its loop, which turns at least once per sweep interval, at most
once a second; a relay that stops beating (killed, hung, cut off from Redis) drops out of
:func:`live_relays` within two sweep intervals of its last beat. Beats older than a day are
trimmed by the beats themselves.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import TYPE_CHECKING, Any, Final

from .._async.connection import shared_or_new
from ._schema import Schema

if TYPE_CHECKING:
    from ._relay import AsyncRelay

log = logging.getLogger("delayq.outbox")

MIN_BEAT_S: Final = 1.0  # a busy relay's loop turns far more often: one beat a second is plenty
KEEP_MS: Final = 86_400_000  # beats older than this are trimmed


def relays_key(schema: Schema) -> str:
    """The sorted set of the heartbeats of the relays of one outbox table (one key: a
    cluster serves it from one slot, whatever its name)."""
    return f"delayq:outbox:{{{schema.channel}}}:relays"


def member() -> str:
    """This process, as its heartbeat names it."""
    return f"{socket.gethostname()}:{os.getpid()}"


async def beat(relay: AsyncRelay) -> None:
    """Record that ``relay`` is alive (at most once a second; never raises: a relay that
    cannot reach Redis cannot relay either, and its missing beats say so)."""
    now = time.monotonic()
    if now - relay.__dict__.get("_beat_at", -MIN_BEAT_S) < MIN_BEAT_S:
        return
    relay.__dict__["_beat_at"] = now
    try:
        if relay._conn is None:  # made on first use, as the relay's queues make it
            relay._conn, relay._owns_conn = shared_or_new(
                relay._redis, reconnect_timeout=relay._reconnect_timeout
            )
        runner: Any = relay._conn.runner
        deadline = now + MIN_BEAT_S  # a beat never holds the relay's loop up for long
        now_ms = _ms(await runner.command("TIME", deadline=deadline))
        key = relays_key(relay._schema)
        valid_until = now_ms + int(2000 * relay._sweep_s)
        this = f"{relay.name}@{member()}"
        await runner.command("ZADD", key, valid_until, this, deadline=deadline)
        await runner.command("ZREMRANGEBYSCORE", key, "-inf", now_ms - KEEP_MS, deadline=deadline)
    except Exception as exc:  # the relay's own work reports Redis outages
        log.debug("outbox relay %s: heartbeat not recorded: %s", relay.name, exc)


def live_relays(runner: Any, schema: Schema) -> list[str]:
    """The relays of the table whose last heartbeat still vouches for them (a sync runner;
    Redis's clock)."""
    now_ms = _ms(runner.command("TIME"))
    return _names(runner.command("ZRANGEBYSCORE", relays_key(schema), now_ms, "+inf"))


async def alive_relays(runner: Any, schema: Schema) -> list[str]:
    """:func:`live_relays` on an asyncio runner."""
    now_ms = _ms(await runner.command("TIME"))
    return _names(await runner.command("ZRANGEBYSCORE", relays_key(schema), now_ms, "+inf"))


def _ms(time_reply: Any) -> int:
    seconds, micros = time_reply
    return int(seconds) * 1000 + int(micros) // 1000


def _names(members: Any) -> list[str]:
    return sorted(m.decode() if isinstance(m, bytes) else str(m) for m in members)
