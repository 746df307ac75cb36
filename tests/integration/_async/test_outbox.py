"""The outbox's contract with the caller's transaction, for every kind of connection of each
front end: a task reaches its queue if and only if the transaction (or savepoint) that
offered it committed. (tests/integration/test_outbox.py has the rest.)"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from delayq import AsyncDelayQueue
from delayq.embedded import EmbeddedRedis
from delayq.outbox import AsyncOutbox
from tests.outbox_support import live_ids, pending, rows

from .flavor import Session, relay_pending, sqlalchemy_engine

pytest_plugins = ["tests.outbox_support"]


@pytest.fixture
def redis_server(redis7_server: EmbeddedRedis) -> EmbeddedRedis:
    """One Redis version: the outbox's contract is with PostgreSQL, not the Redis version."""
    return redis7_server


@pytest.fixture
async def outbox(pg_dsn: str, table: str, prefix: str) -> AsyncOutbox:
    """An installed outbox with its own table, offering under the test's key prefix."""
    box = AsyncOutbox(pg_dsn, table=table, prefix=prefix)
    await box.install()
    return box


@pytest.fixture
def orders(make_async_queue: Any) -> AsyncDelayQueue:
    return make_async_queue("orders")  # type: ignore[no-any-return]


class Boom(Exception):
    """Raised inside a transaction block by the tests."""


def sqlalchemy_url(dsn: str) -> str:
    return dsn.replace("postgresql://", "postgresql+psycopg://", 1)


async def offered_count(queue: AsyncDelayQueue) -> int:
    """Tasks the queue's scripts created (a resend that matched a live task is not counted)."""
    return int((await queue.stats()).counters.get("offered", 0))


@dataclass
class Path:
    """How one kind of connection opens a transaction, a savepoint and rolls back."""

    transaction: Callable[[], Any]
    savepoint: Callable[[Any], Any]
    rolled_back: Callable[[Callable[[Any], Any]], Any]


async def run_cases(outbox: AsyncOutbox, path: Path) -> dict[str, str]:
    """Offer under commit, rollback, savepoint rollback and an exception; the ids by case."""
    ids: dict[str, str] = {}

    async def offer(conn: Any, case: str) -> None:
        ids[case] = await outbox.offer(conn, "orders", {"case": case}, 3600)

    async with path.transaction() as conn:
        await offer(conn, "commit")
    with pytest.raises(Boom):
        async with path.transaction() as conn:
            await offer(conn, "exception")
            raise Boom
    async with path.transaction() as conn:
        await offer(conn, "outer")
        with pytest.raises(Boom):
            async with path.savepoint(conn):
                await offer(conn, "savepoint")
                raise Boom
        await offer(conn, "after-savepoint")
    await path.rolled_back(lambda conn: offer(conn, "rollback"))
    return ids


async def check_cases(
    ids: dict[str, str], orders: AsyncDelayQueue, url: str, dsn: str, table: str
) -> None:
    """Only the committed offers became tasks, and their rows are gone."""
    before = await offered_count(orders)
    assert await relay_pending(dsn, url, table) == 3
    committed = {ids["commit"], ids["outer"], ids["after-savepoint"]}
    assert committed <= live_ids(orders, url)
    for case in ("commit", "outer", "after-savepoint"):
        info = await orders.get(ids[case])
        assert info is not None and info.payload == {"case": case}
    for case in ("exception", "savepoint", "rollback"):  # no ghost of a rolled-back offer
        assert await orders.get(ids[case]) is None
    assert await offered_count(orders) == before + 3
    assert rows(dsn, table) == []  # relayed rows are deleted


async def test_psycopg_connection(
    outbox: AsyncOutbox, orders: AsyncDelayQueue, pg_dsn: str, table: str, redis_url: str
) -> None:
    @asynccontextmanager
    async def transaction() -> AsyncIterator[Any]:
        async with await psycopg.AsyncConnection.connect(pg_dsn) as conn, conn.transaction():
            yield conn

    async def rolled_back(offer: Callable[[Any], Any]) -> None:
        async with await psycopg.AsyncConnection.connect(pg_dsn) as conn, conn.transaction():
            await offer(conn)
            raise psycopg.Rollback

    path = Path(transaction, lambda conn: conn.transaction(), rolled_back)
    await check_cases(await run_cases(outbox, path), orders, redis_url, pg_dsn, table)


async def test_psycopg_cursor_and_pool(
    pg_dsn: str, table: str, prefix: str, orders: AsyncDelayQueue, redis_url: str
) -> None:
    async with AsyncConnectionPool(pg_dsn, min_size=1, max_size=2, open=False) as pool:
        outbox = AsyncOutbox(pool, table=table, prefix=prefix)
        await outbox.install()
        async with pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
            task_id = await outbox.offer(cur, "orders", {"via": "cursor"})
        assert (await outbox.status()).pending == 1
    assert await relay_pending(pg_dsn, redis_url, table) == 1
    info = await orders.get(task_id)
    assert info is not None and info.payload == {"via": "cursor"}


async def test_sqlalchemy_session_and_connection(
    outbox: AsyncOutbox, orders: AsyncDelayQueue, pg_dsn: str, table: str, redis_url: str
) -> None:
    engine = sqlalchemy_engine(sqlalchemy_url(pg_dsn))
    try:

        @asynccontextmanager
        async def session() -> AsyncIterator[Any]:
            async with Session(engine) as s, s.begin():
                yield s

        async def session_rolled_back(offer: Callable[[Any], Any]) -> None:
            async with Session(engine) as s:
                await offer(s)
                await s.rollback()

        path = Path(session, lambda s: s.begin_nested(), session_rolled_back)
        await check_cases(await run_cases(outbox, path), orders, redis_url, pg_dsn, table)

        async def connection_rolled_back(offer: Callable[[Any], Any]) -> None:
            async with engine.connect() as c:
                await offer(c)
                await c.rollback()

        path = Path(engine.begin, lambda c: c.begin_nested(), connection_rolled_back)
        await check_cases(await run_cases(outbox, path), orders, redis_url, pg_dsn, table)
    finally:
        await engine.dispose()


async def test_sqlalchemy_engine_as_the_database(pg_dsn: str, table: str, prefix: str) -> None:
    engine = sqlalchemy_engine(sqlalchemy_url(pg_dsn))
    try:
        outbox = AsyncOutbox(engine, table=table, prefix=prefix)
        await outbox.install()
        assert await outbox.installed()
        async with engine.begin() as conn:
            await outbox.offer(conn, "orders", 1)
        assert (await outbox.status()).pending == 1
        assert await outbox.dead() == [] and await outbox.requeue_dead() == 0
    finally:
        await engine.dispose()


async def test_cancel_and_reschedule_are_transactional(
    outbox: AsyncOutbox, orders: AsyncDelayQueue, pg_dsn: str, table: str, redis_url: str
) -> None:
    async with await psycopg.AsyncConnection.connect(pg_dsn) as conn, conn.transaction():
        kept = await outbox.offer(conn, "orders", 1, 3600)
        moved = await outbox.offer(conn, "orders", 2, 3600)
    await relay_pending(pg_dsn, redis_url, table)
    async with await psycopg.AsyncConnection.connect(pg_dsn) as conn, conn.transaction():
        await outbox.cancel(conn, "orders", kept)
        await outbox.reschedule(conn, "orders", moved, 60)
        raise psycopg.Rollback
    await relay_pending(pg_dsn, redis_url, table)
    assert await orders.get(kept) is not None  # the cancel rolled back with its transaction
    async with await psycopg.AsyncConnection.connect(pg_dsn) as conn, conn.transaction():
        await outbox.cancel(conn, "orders", kept)
        await outbox.reschedule(conn, "orders", moved, 60)
    assert await relay_pending(pg_dsn, redis_url, table) == 2
    assert await orders.get(kept) is None
    info = await orders.get(moved)
    assert info is not None
    assert 55 < (info.due_at - datetime.now(UTC)).total_seconds() <= 60
    assert pending(pg_dsn, table) == 0


async def test_status_dead_and_requeue(
    outbox: AsyncOutbox, pg_dsn: str, table: str, redis_url: str
) -> None:
    async with await psycopg.AsyncConnection.connect(pg_dsn) as conn, conn.transaction():
        for n in range(3):
            await outbox.offer(conn, "orders", n)
        await outbox.offer(conn, "other", "x")
    status = await outbox.status()
    assert (status.pending, status.dead) == (4, 0)
    assert {(q.queue, q.pending) for q in status.queues} == {("orders", 3), ("other", 1)}
    assert status.oldest_pending_age is not None and status.oldest_pending_age >= 0
    with psycopg.connect(pg_dsn) as plain:
        plain.execute(f"UPDATE \"{table}\" SET envelope = 'not an envelope' WHERE queue = 'other'")
    assert await relay_pending(pg_dsn, redis_url, table) == 4
    status = await outbox.status()
    assert (status.pending, status.dead) == (0, 1)
    [dead] = await outbox.dead()
    assert dead.queue == "other" and dead.error and "envelope" in dead.error
    assert await outbox.requeue_dead() == 1
    assert (await outbox.status()).pending == 1
