"""Outbox and AsyncOutbox: write offers, cancels and reschedules in the caller's transaction.

Both classes share every rule (rows are built in ``_rows``, statements in ``_schema``); each
method body is the one line that differs, a blocking or an awaited ``execute``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .._core.timing import Duration
from ._conn import aadmin, admin, aexecute, check_target, execute
from ._rows import Formats, QueueFormat, cancel_row, offer_row, reschedule_row
from ._schema import Schema


@dataclass(frozen=True, slots=True)
class QueueBacklog:
    """Rows of one queue in the outbox."""

    prefix: str
    queue: str
    pending: int
    dead: int
    oldest_pending_age: float | None  # seconds, on the database's clock


@dataclass(frozen=True, slots=True)
class OutboxStatus:
    """What the outbox holds: rows not relayed yet, and rows no relay could apply."""

    pending: int
    dead: int
    oldest_pending_age: float | None  # the relay lag: seconds the oldest pending row waited
    queues: tuple[QueueBacklog, ...]


@dataclass(frozen=True, slots=True)
class DeadRow:
    """A row the relay could not apply, with the reason."""

    seq: int
    prefix: str
    queue: str
    task_id: str
    op: str
    created: datetime
    error: str | None


def _status(rows: Sequence[Mapping[str, Any]]) -> OutboxStatus:
    per: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        entry = per.setdefault((row["prefix"], row["queue"]), {"pending": 0, "dead": 0})
        entry[row["status"]] = int(row["n"])
        if row["status"] == "pending":
            entry["oldest"] = float(row["oldest_s"])
    queues = tuple(
        QueueBacklog(prefix, queue, e["pending"], e["dead"], e.get("oldest"))
        for (prefix, queue), e in per.items()
    )
    ages = [q.oldest_pending_age for q in queues if q.oldest_pending_age is not None]
    return OutboxStatus(
        pending=sum(q.pending for q in queues),
        dead=sum(q.dead for q in queues),
        oldest_pending_age=max(ages) if ages else None,
        queues=queues,
    )


def _dead_rows(rows: Sequence[Mapping[str, Any]]) -> list[DeadRow]:
    return [
        DeadRow(r["seq"], r["prefix"], r["queue"], r["task_id"], r["op"], r["created"], r["error"])
        for r in rows
    ]


class _Base:
    def __init__(
        self,
        database: Any = None,
        *,
        table: str = "delayq_outbox",
        schema: str | None = None,
        prefix: str = "dq",
        queues: Mapping[str, QueueFormat] | None = None,
    ) -> None:
        check_target(database, is_async=isinstance(self, AsyncOutbox))
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


class Outbox(_Base):
    """Offers that exist if and only if the caller's transaction commits.

    Each method writes a row in the transaction of ``conn`` (a psycopg ``Connection`` or
    ``Cursor``, or a SQLAlchemy ``Session`` or ``Connection``), and a :class:`Relay` moves
    committed rows into Redis. Arguments are checked and payloads encoded right away, so bad
    input raises inside the transaction.

    Args:
        database: a DSN, a ``psycopg_pool.ConnectionPool`` or a SQLAlchemy ``Engine``, used
            by :meth:`install`, :meth:`status`, :meth:`dead` and :meth:`requeue_dead` only
            (None is fine when those are not called).
        table: the outbox table's name; relays must be given the same.
        schema: the table's PostgreSQL schema (default: the search path's first).
        prefix: the key prefix of the queues, as given to ``DelayQueue``.
        queues: the codec options of queues that do not use the default JSON codec.
    """

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
        *,
        at: datetime | float | None = None,
        key: str | None = None,
        id: str | None = None,
        priority: int = 0,
        headers: dict[str, str] | None = None,
        ttl: Duration | None = None,
        key_ttl: Duration | None = None,
        dedup: str | None = None,
    ) -> str:
        """Offer ``payload`` to ``queue`` when the transaction of ``conn`` commits; the same
        options as ``DelayQueue.offer``. Returns the task's id (delayq's, for ``get`` and
        ``cancel``). ``delay`` counts from now (the database's clock), not from the relay."""
        row = offer_row(
            self._formats, queue, payload, delay, at=at, key=key, id=id, priority=priority,
            headers=headers, ttl=ttl, key_ttl=key_ttl, dedup=dedup,
        )  # fmt: skip
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
            return _status(execute(conn, self._schema.status))

    def dead(self, limit: int = 100) -> list[DeadRow]:
        """Rows the relay could not apply, oldest first."""
        with admin(self._database) as conn:
            return _dead_rows(execute(conn, self._schema.dead, {"limit": limit}))

    def requeue_dead(self) -> int:
        """Make every dead row pending again (after fixing what was wrong); the count."""
        with admin(self._database) as conn:
            rows = execute(conn, self._schema.requeue_dead + " RETURNING seq")
            execute(conn, f"SELECT pg_notify('{self._schema.channel}', '')")
            return len(rows)


class AsyncOutbox(_Base):
    """:class:`Outbox` for asyncio: ``conn`` is a psycopg ``AsyncConnection`` or
    ``AsyncCursor``, or a SQLAlchemy ``AsyncSession`` or ``AsyncConnection``; ``database``
    a DSN, a ``psycopg_pool.AsyncConnectionPool`` or a SQLAlchemy ``AsyncEngine``."""

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
        *,
        at: datetime | float | None = None,
        key: str | None = None,
        id: str | None = None,
        priority: int = 0,
        headers: dict[str, str] | None = None,
        ttl: Duration | None = None,
        key_ttl: Duration | None = None,
        dedup: str | None = None,
    ) -> str:
        """Offer ``payload`` to ``queue`` when the transaction of ``conn`` commits; the same
        options as ``DelayQueue.offer``. Returns the task's id (delayq's, for ``get`` and
        ``cancel``). ``delay`` counts from now (the database's clock), not from the relay."""
        row = offer_row(
            self._formats, queue, payload, delay, at=at, key=key, id=id, priority=priority,
            headers=headers, ttl=ttl, key_ttl=key_ttl, dedup=dedup,
        )  # fmt: skip
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
            return _status(await aexecute(conn, self._schema.status))

    async def dead(self, limit: int = 100) -> list[DeadRow]:
        """Rows the relay could not apply, oldest first."""
        async with aadmin(self._database) as conn:
            return _dead_rows(await aexecute(conn, self._schema.dead, {"limit": limit}))

    async def requeue_dead(self) -> int:
        """Make every dead row pending again (after fixing what was wrong); the count."""
        async with aadmin(self._database) as conn:
            rows = await aexecute(conn, self._schema.requeue_dead + " RETURNING seq")
            await aexecute(conn, f"SELECT pg_notify('{self._schema.channel}', '')")
            return len(rows)
