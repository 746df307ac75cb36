# Generated from _async/outbox.py by scripts/unasync.py: do not edit.
"""Outbox: write offers, cancels and reschedules in the caller's transaction.

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
from .._conn import admin, check_target, execute
from .._rows import Formats, QueueFormat, cancel_row, offer_row, reschedule_row
from .._schema import Schema
from .._values import DeadRow, OutboxStatus, dead_rows, status_of


class Outbox:
    """Offers that exist if and only if the caller's transaction commits.

    Each method writes a row in the transaction of ``conn`` (a psycopg ``Connection``
    or ``Cursor``, or a SQLAlchemy ``Session`` or ``Connection``), and a relay
    (``delayq relay``, :class:`Relay` or :class:`AsyncRelay`) moves committed rows into
    Redis. Arguments are checked and payloads encoded right away, so bad input raises inside
    the transaction.

    Args:
        database: a DSN, a ``psycopg_pool.ConnectionPool`` or a SQLAlchemy
            ``Engine``, used by :meth:`install`, :meth:`status`, :meth:`dead` and
            :meth:`requeue_dead` only (None is fine when those are not called).
        table: the outbox table's name; relays must be given the same.
        schema: the table's PostgreSQL schema (default: the search path's first).
        prefix: the key prefix of the queues, as given to ``DelayQueue``.
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
        check_target(database)
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

    def install(self) -> None:
        """Create the table, its indexes and its NOTIFY trigger if missing (idempotent)."""
        with admin(self._database) as conn:
            for statement in self._schema.install():
                execute(conn, statement)

    def installed(self) -> bool:
        """True if the outbox table exists (``install`` was run)."""
        with admin(self._database) as conn:
            rows = execute(conn, self._schema.exists, {"name": self._schema.qualified})
            return bool(next(iter(rows[0].values())))

    def offer(
        self,
        conn: Any,
        queue: str,
        payload: Any,
        delay: Duration | None = None,
        **options: Unpack[OfferOptions],
    ) -> str:
        """Offer ``payload`` to ``queue`` when the transaction of ``conn`` commits; the same
        options as ``DelayQueue.offer`` (:class:`~delayq.OfferOptions`). Returns the
        task's id (delayq's, for ``get`` and ``cancel``). ``delay`` counts from now (the
        database's clock), not from the relay."""
        row = offer_row(
            self._formats, queue, payload, delay, options, f"{type(self).__name__}.offer"
        )
        execute(conn, self._schema.insert, row)
        return str(row["task_id"])

    def cancel(self, conn: Any, queue: str, task_id: str) -> None:
        """Cancel the task when the transaction commits. An offer not relayed yet is dropped
        and never reaches Redis; an offer and a later cancel end with no task, whatever the
        order in which the relays get to them."""
        execute(conn, self._schema.cancel, cancel_row(self._formats, queue, task_id))

    def reschedule(
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
        execute(conn, self._schema.insert, row)

    def status(self) -> OutboxStatus:
        """Pending and dead rows per queue, and the age of the oldest pending row."""
        with admin(self._database) as conn:
            return status_of(execute(conn, self._schema.status))

    def dead(self, limit: int = 100, *, missed: bool = False) -> list[DeadRow]:
        """Rows the relay could not apply, oldest first (with ``missed``: the cancels and
        reschedules that found no waiting task)."""
        params = {"limit": limit, "status": "missed" if missed else "dead"}
        with admin(self._database) as conn:
            return dead_rows(execute(conn, self._schema.dead, params))

    def purge_dead(self, *, missed: bool = False) -> int:
        """Delete the dead rows (with ``missed``, the cancels and reschedules that found no
        task instead), in batches of 10,000; the count. What they held is gone for good."""
        status = "missed" if missed else "dead"
        total = 0
        while True:
            with admin(self._database) as conn:
                rows = execute(
                    conn, self._schema.purge + " RETURNING seq", {"status": status, "limit": 10000}
                )
            total += len(rows)
            if len(rows) < 10000:
                return total

    def requeue_dead(self) -> int:
        """Make the dead rows pending again (after fixing what was wrong); the count. An
        offer whose task has a later cancel row stays dead: offer, then cancel, ends with no
        task."""
        with admin(self._database) as conn:
            rows = execute(conn, self._schema.requeue_dead + " RETURNING seq")
            execute(conn, f"SELECT pg_notify('{self._schema.channel}', '')")
            return len(rows)
