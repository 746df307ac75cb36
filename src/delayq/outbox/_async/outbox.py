"""AsyncOutbox: write offers, cancels and reschedules in the caller's transaction.

``outbox/_sync/outbox.py`` (the sync ``Outbox``) is generated from ``outbox/_async/outbox.py``
by ``scripts/unasync.py``: edit the asyncio source and regenerate. Every rule is shared: rows
are built in ``_rows``, statements in ``_schema``, what is returned in ``_values``; each method
here is the I/O around them.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Unpack

from ..._core.offers import OfferOptions
from ..._core.timing import Duration
from .._conn import aadmin, acheck_target, aexecute
from .._rows import Formats, QueueFormat, cancel_row, offer_row, reschedule_row
from .._schema import Schema
from .._values import DeadRow, OutboxStatus, dead_rows, status_of


class AsyncOutbox:
    """Offers that exist if and only if the caller's transaction commits.

    Each method writes a row in the transaction of ``conn`` (a psycopg ``AsyncConnection``
    or ``AsyncCursor``, or a SQLAlchemy ``AsyncSession`` or ``AsyncConnection``), and a relay
    (``delayq relay``, :class:`Relay` or :class:`AsyncRelay`) moves committed rows into
    Redis. Arguments are checked and payloads encoded right away, so bad input raises inside
    the transaction.

    Args:
        database: a DSN, a ``psycopg_pool.AsyncConnectionPool`` or a SQLAlchemy
            ``AsyncEngine``, used by :meth:`install`, :meth:`status`, :meth:`dead` and
            :meth:`requeue_dead` only (None is fine when those are not called).
        table: the outbox table's name; relays must be given the same.
        schema: the table's PostgreSQL schema (default: the search path's first).
        prefix: the key prefix of the queues, as given to ``AsyncDelayQueue``.
        queues: the codec options of queues that do not use the default JSON codec.
    """

    def __init__(
        self,
        database: Any = None,
        *,
        table: str = "delayq_outbox",
        schema: str | None = None,
        prefix: str = "dq",
        queues: Mapping[str, QueueFormat] | None = None,
    ) -> None:
        acheck_target(database)
        self._database = database
        self._schema = Schema(table, schema)
        self._formats = Formats(prefix, queues)

    @property
    def table(self) -> str:
        """The outbox table's name."""
        return self._schema.table

    @property
    def schema(self) -> str | None:
        """The PostgreSQL schema of the table (None: the search path's first)."""
        return self._schema.schema

    @property
    def prefix(self) -> str:
        """The key prefix of the queues this outbox offers to."""
        return self._formats.prefix

    async def install(self) -> None:
        """Create the table, its indexes and its NOTIFY trigger if missing (idempotent)."""
        async with aadmin(self._database) as conn:
            for statement in self._schema.install():
                await aexecute(conn, statement)

    async def installed(self) -> bool:
        """True if the outbox table exists (``install`` was run)."""
        async with aadmin(self._database) as conn:
            rows = await aexecute(conn, self._schema.exists, {"name": self._schema.qualified})
            return bool(next(iter(rows[0].values())))

    async def offer(
        self,
        conn: Any,
        queue: str,
        payload: Any,
        delay: Duration | None = None,
        **options: Unpack[OfferOptions],
    ) -> str:
        """Offer ``payload`` to ``queue`` when the transaction of ``conn`` commits; the same
        options as ``AsyncDelayQueue.offer`` (:class:`~delayq.OfferOptions`). Returns the
        task's id (delayq's, for ``get`` and ``cancel``). ``delay`` counts from now (the
        database's clock), not from the relay."""
        row = offer_row(
            self._formats, queue, payload, delay, options, f"{type(self).__name__}.offer"
        )
        await aexecute(conn, self._schema.insert, row)
        return str(row["task_id"])

    async def cancel(self, conn: Any, queue: str, task_id: str) -> None:
        """Cancel the task when the transaction commits. An offer not relayed yet is dropped
        and never reaches Redis; an offer and a later cancel end with no task, whatever the
        order in which the relays get to them."""
        await aexecute(conn, self._schema.cancel, cancel_row(self._formats, queue, task_id))

    async def reschedule(
        self,
        conn: Any,
        queue: str,
        task_id: str,
        delay: Duration | None = None,
        *,
        at: datetime | float | None = None,
    ) -> None:
        """Move a waiting task's due time to ``delay`` from now (or ``at``) on commit."""
        row = reschedule_row(self._formats, queue, task_id, delay, at)
        await aexecute(conn, self._schema.insert, row)

    async def status(self) -> OutboxStatus:
        """Pending and dead rows per queue, and the age of the oldest pending row."""
        async with aadmin(self._database) as conn:
            return status_of(await aexecute(conn, self._schema.status))

    async def dead(self, limit: int = 100, *, missed: bool = False) -> list[DeadRow]:
        """Rows the relay could not apply, oldest first (with ``missed``: the cancels and
        reschedules that found no waiting task)."""
        params = {"limit": limit, "status": "missed" if missed else "dead"}
        async with aadmin(self._database) as conn:
            return dead_rows(await aexecute(conn, self._schema.dead, params))

    async def purge_dead(self, *, missed: bool = False) -> int:
        """Delete the dead rows (with ``missed``, the cancels and reschedules that found no
        task instead), in batches of 10,000; the count. What they held is gone for good."""
        status = "missed" if missed else "dead"
        total = 0
        while True:
            async with aadmin(self._database) as conn:
                rows = await aexecute(
                    conn, self._schema.purge + " RETURNING seq", {"status": status, "limit": 10000}
                )
            total += len(rows)
            if len(rows) < 10000:
                return total

    async def requeue_dead(self) -> int:
        """Make the dead rows pending again (after fixing what was wrong); the count. An
        offer whose task has a later cancel row stays dead: offer, then cancel, ends with no
        task."""
        async with aadmin(self._database) as conn:
            rows = await aexecute(conn, self._schema.requeue_dead + " RETURNING seq")
            await aexecute(conn, f"SELECT pg_notify('{self._schema.channel}', '')")
            return len(rows)
