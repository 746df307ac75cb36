"""The outbox's health on the main page (``delayq dashboard --dsn``): rows pending and dead,
the oldest pending row's age and the relays alive (their heartbeats, outbox/_heartbeat.py),
read when the page is built. Unreadable parts show as such, never as zero."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from .._core.text import printable
from .._core.urls import mask_secrets

log = logging.getLogger("delayq.dashboard")


@dataclass(frozen=True, slots=True)
class OutboxHealth:
    table: str
    pending: int | None  # None: the database did not answer (see error)
    dead: int | None
    oldest_pending_age: float | None
    relays: list[str] | None  # None: Redis did not answer
    error: str | None = None

    @property
    def orphaned(self) -> bool:
        """Rows wait and no relay is alive to move them."""
        return bool(self.pending) and self.relays == []


async def read_outbox(settings: Any, runner: Any) -> OutboxHealth | None:
    """The health of the outbox the dashboard was given (None without one)."""
    if not settings.outbox_dsn:
        return None
    from ..outbox._async.outbox import AsyncOutbox
    from ..outbox._heartbeat import alive_relays
    from ..outbox._schema import Schema

    schema = Schema(settings.outbox_table, settings.outbox_schema)
    box = AsyncOutbox(settings.outbox_dsn, table=schema.table, schema=schema.schema)
    pending = dead = age = relays = error = None
    try:
        status = await box.status()
        pending, dead, age = status.pending, status.dead, status.oldest_pending_age
    except Exception as exc:  # the database away: the page says so
        error = printable(mask_secrets(" ".join(str(exc).split())))
        log.debug("dashboard: cannot read the outbox: %s", error)
    try:
        relays = await alive_relays(runner, schema)
    except Exception as exc:  # Redis away: every figure of the page says so already
        log.debug("dashboard: cannot read the relays' heartbeats: %s", exc)
    return OutboxHealth(schema.channel, pending, dead, age, relays, error)
