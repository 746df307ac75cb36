"""The outbox's contract with the caller's transaction, for every kind of connection: a task
reaches its queue if and only if the transaction (or savepoint) that offered it committed."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    contextmanager,
)
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
import sqlalchemy
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from delayq import DelayQueue
from delayq.embedded import EmbeddedRedis
from delayq.exceptions import ConfigError, EncodeError, InvalidDelay, InvalidTaskError
from delayq.outbox import AsyncOutbox, Outbox, QueueFormat, Relay
from tests.outbox_support import live_ids, offered_count, pending, rows

pytest_plugins = ["tests.outbox_support"]


@pytest.fixture
def redis_server(redis7_server: EmbeddedRedis) -> EmbeddedRedis:
    """One Redis version: the outbox's contract is with PostgreSQL, not the Redis version."""
    return redis7_server


class Boom(Exception):
    """Raised inside a transaction block by the tests."""


def relay_now(dsn: str, url: str, table: str) -> int:
    return Relay(dsn, url, table=table).relay_pending()


def sqlalchemy_url(dsn: str) -> str:
    return dsn.replace("postgresql://", "postgresql+psycopg://", 1)


@dataclass
class SyncPath:
    """How one kind of sync connection opens a transaction, a savepoint and rolls back."""

    transaction: Callable[[], AbstractContextManager[Any]]
    savepoint: Callable[[Any], AbstractContextManager[Any]]
    rolled_back: Callable[[Callable[[Any], None]], None]


def run_sync_cases(outbox: Outbox, path: SyncPath) -> dict[str, str]:
    """Offer under commit, rollback, savepoint rollback and an exception; the ids by case."""
    ids: dict[str, str] = {}

    def offer(conn: Any, case: str) -> None:
        ids[case] = outbox.offer(conn, "orders", {"case": case}, 3600)

    with path.transaction() as conn:
        offer(conn, "commit")
    with pytest.raises(Boom), path.transaction() as conn:
        offer(conn, "exception")
        raise Boom
    with path.transaction() as conn:
        offer(conn, "outer")
        with pytest.raises(Boom), path.savepoint(conn):
            offer(conn, "savepoint")
            raise Boom
        offer(conn, "after-savepoint")
    path.rolled_back(lambda conn: offer(conn, "rollback"))
    return ids


def check_cases(ids: dict[str, str], orders: DelayQueue, url: str, dsn: str, table: str) -> None:
    assert relay_now(dsn, url, table) == 3
    committed = {ids["commit"], ids["outer"], ids["after-savepoint"]}
    assert live_ids(orders, url) == committed  # no ghost from a rolled-back transaction
    for case in ("commit", "outer", "after-savepoint"):
        info = orders.get(ids[case])
        assert info is not None and info.payload == {"case": case}
    assert offered_count(orders) == 3
    assert rows(dsn, table) == []  # relayed rows are deleted


def test_psycopg_connection(
    outbox: Outbox, orders: DelayQueue, pg_dsn: str, table: str, redis_url: str
) -> None:
    @contextmanager
    def transaction() -> Iterator[psycopg.Connection[Any]]:
        with psycopg.connect(pg_dsn) as conn, conn.transaction():
            yield conn

    def rolled_back(offer: Callable[[Any], None]) -> None:
        with psycopg.connect(pg_dsn) as conn, conn.transaction():
            offer(conn)
            raise psycopg.Rollback

    path = SyncPath(transaction, lambda conn: conn.transaction(), rolled_back)
    check_cases(run_sync_cases(outbox, path), orders, redis_url, pg_dsn, table)


def test_psycopg_cursor_and_pool(
    pg_dsn: str, table: str, prefix: str, orders: DelayQueue, redis_url: str
) -> None:
    from psycopg_pool import ConnectionPool

    with ConnectionPool(pg_dsn, min_size=1, max_size=2, open=True) as pool:
        outbox = Outbox(pool, table=table, prefix=prefix)
        outbox.install()
        with pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
            task_id = outbox.offer(cur, "orders", {"via": "cursor"})
        assert outbox.status().pending == 1
    assert relay_now(pg_dsn, redis_url, table) == 1
    info = orders.get(task_id)
    assert info is not None and info.payload == {"via": "cursor"}


def test_sqlalchemy_session_and_connection(
    outbox: Outbox, orders: DelayQueue, pg_dsn: str, table: str, redis_url: str
) -> None:
    engine = sqlalchemy.create_engine(sqlalchemy_url(pg_dsn))
    try:

        @contextmanager
        def session() -> Iterator[Session]:
            with Session(engine) as s, s.begin():
                yield s

        def session_rolled_back(offer: Callable[[Any], None]) -> None:
            with Session(engine) as s:
                offer(s)
                s.rollback()

        path = SyncPath(session, lambda s: s.begin_nested(), session_rolled_back)
        check_cases(run_sync_cases(outbox, path), orders, redis_url, pg_dsn, table)

        def connection_rolled_back(offer: Callable[[Any], None]) -> None:
            with engine.connect() as c:
                offer(c)
                c.rollback()

        before = offered_count(orders)
        path = SyncPath(engine.begin, lambda c: c.begin_nested(), connection_rolled_back)
        ids = run_sync_cases(outbox, path)
        assert relay_now(pg_dsn, redis_url, table) == 3
        for case in ("commit", "outer", "after-savepoint"):
            assert orders.get(ids[case]) is not None
        for case in ("exception", "savepoint", "rollback"):
            assert orders.get(ids[case]) is None
        assert offered_count(orders) == before + 3
    finally:
        engine.dispose()


@dataclass
class AsyncPath:
    transaction: Callable[[], AbstractAsyncContextManager[Any]]
    savepoint: Callable[[Any], AbstractAsyncContextManager[Any]]
    rolled_back: Callable[[Callable[[Any], Any]], Any]


async def run_async_cases(outbox: AsyncOutbox, path: AsyncPath) -> dict[str, str]:
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


async def test_psycopg_async_connection(
    pg_dsn: str, table: str, prefix: str, orders: DelayQueue, redis_url: str
) -> None:
    outbox = AsyncOutbox(pg_dsn, table=table, prefix=prefix)
    await outbox.install()

    @asynccontextmanager
    async def transaction() -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        async with await psycopg.AsyncConnection.connect(pg_dsn) as conn, conn.transaction():
            yield conn

    async def rolled_back(offer: Callable[[Any], Any]) -> None:
        async with await psycopg.AsyncConnection.connect(pg_dsn) as conn, conn.transaction():
            await offer(conn)
            raise psycopg.Rollback

    ids = await run_async_cases(
        outbox, AsyncPath(transaction, lambda c: c.transaction(), rolled_back)
    )
    await asyncio.to_thread(check_cases, ids, orders, redis_url, pg_dsn, table)


async def test_sqlalchemy_async_session_and_connection(
    pg_dsn: str, table: str, prefix: str, orders: DelayQueue, redis_url: str
) -> None:
    engine = create_async_engine(sqlalchemy_url(pg_dsn))
    try:
        outbox = AsyncOutbox(engine, table=table, prefix=prefix)
        await outbox.install()

        @asynccontextmanager
        async def session() -> AsyncIterator[AsyncSession]:
            async with AsyncSession(engine) as s, s.begin():
                yield s

        async def session_rolled_back(offer: Callable[[Any], Any]) -> None:
            async with AsyncSession(engine) as s:
                await offer(s)
                await s.rollback()

        path = AsyncPath(session, lambda s: s.begin_nested(), session_rolled_back)
        ids = await run_async_cases(outbox, path)
        await asyncio.to_thread(check_cases, ids, orders, redis_url, pg_dsn, table)

        async def connection_rolled_back(offer: Callable[[Any], Any]) -> None:
            async with engine.connect() as c:
                await offer(c)
                await c.rollback()

        path = AsyncPath(engine.begin, lambda c: c.begin_nested(), connection_rolled_back)
        ids = await run_async_cases(outbox, path)
        assert await asyncio.to_thread(relay_now, pg_dsn, redis_url, table) == 3
        assert {ids["commit"], ids["outer"], ids["after-savepoint"]} <= live_ids(orders, redis_url)
        assert not {ids["exception"], ids["savepoint"], ids["rollback"]} & live_ids(
            orders, redis_url
        )
    finally:
        await engine.dispose()


def test_install_is_idempotent_and_concurrent(pg_dsn: str, table: str) -> None:
    outbox = Outbox(pg_dsn, table=table)
    assert not outbox.installed()
    errors: list[BaseException] = []

    def install() -> None:
        try:
            outbox.install()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=install) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    outbox.install()
    assert outbox.installed()
    assert outbox.status().pending == 0


def test_schema_option(pg_dsn: str, prefix: str, redis_url: str, make_queue: Any) -> None:
    outbox = Outbox(pg_dsn, table="jobs", schema=f"s_{prefix}", prefix=prefix)
    outbox.install()
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        task_id = outbox.offer(conn, "orders", "hello")
    relay = Relay(pg_dsn, redis_url, table="jobs", schema=f"s_{prefix}")
    assert relay.relay_pending() == 1
    assert make_queue("orders").get(task_id) is not None
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "s_{prefix}" CASCADE')


def test_bad_input_raises_inside_the_transaction(outbox: Outbox, pg_dsn: str, table: str) -> None:
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        with pytest.raises(EncodeError):
            outbox.offer(conn, "orders", {"not json": object()})
        with pytest.raises(InvalidDelay):
            outbox.offer(conn, "orders", 1, delay=-1)
        with pytest.raises(InvalidDelay):
            outbox.offer(conn, "orders", 1, delay=5, at=datetime.now(UTC))
        with pytest.raises(InvalidTaskError):
            outbox.offer(conn, "orders", 1, priority=12)
        with pytest.raises(ConfigError):
            outbox.offer(conn, "bad name!", 1)
        with pytest.raises(ConfigError, match="dedup"):
            outbox.offer(conn, "orders", 1, dedup="sometimes")
        with pytest.raises(InvalidTaskError):
            outbox.cancel(conn, "orders", "")
        with pytest.raises(InvalidDelay):
            outbox.reschedule(conn, "orders", "abc", delay=float("nan"))
    assert rows(pg_dsn, table) == []


async def test_wrong_kind_of_connection_is_refused(pg_dsn: str, table: str) -> None:
    sync_box, async_box = Outbox(pg_dsn, table=table), AsyncOutbox(pg_dsn, table=table)
    async with await psycopg.AsyncConnection.connect(pg_dsn) as aconn:
        with pytest.raises(ConfigError, match="use AsyncOutbox"):
            sync_box.offer(aconn, "orders", 1)
    with psycopg.connect(pg_dsn) as conn, pytest.raises(ConfigError, match="use Outbox"):
        await async_box.offer(conn, "orders", 1)
    with pytest.raises(ConfigError, match="conn must be"):
        sync_box.offer(object(), "orders", 1)
    with pytest.raises(ConfigError, match="database must be"):
        Outbox(12345)
    with pytest.raises(ConfigError, match="table"):
        Outbox(pg_dsn, table='x"; DROP TABLE y; --')
    with pytest.raises(ConfigError, match="without a database"):
        Outbox().install()


def test_options_reach_the_task(
    outbox: Outbox, orders: DelayQueue, pg_dsn: str, table: str, redis_url: str
) -> None:
    at = datetime.now(UTC) + timedelta(hours=2)
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        keyed = outbox.offer(
            conn, "orders", {"order": 42}, 1800, key="close:42", priority=7,
            headers={"trace": "abc"}, ttl=60, key_ttl=120,
        )  # fmt: skip
        absolute = outbox.offer(conn, "orders", "at", at=at)
        chosen = outbox.offer(conn, "orders", "mine", id="order-43")
        duplicate = outbox.offer(conn, "orders", {"order": 42, "again": True}, 5, key="close:42")
    assert chosen == "order-43"
    assert relay_now(pg_dsn, redis_url, table) == 4
    info = orders.get(keyed)
    assert info is not None
    assert (info.key, info.priority, info.headers) == ("close:42", 7, {"trace": "abc"})
    assert info.expires_at is not None
    assert orders.get(duplicate) is None  # the key was taken: the first task stays
    abs_info = orders.get(absolute)
    assert abs_info is not None
    assert abs(abs_info.due_at.timestamp() - at.timestamp()) < 0.002  # absolute stays absolute
    assert orders.get("order-43") is not None


def test_queue_formats(
    pg_dsn: str, table: str, prefix: str, make_queue: Any, redis_url: str
) -> None:
    @dataclass
    class Order:
        id: int
        total: float

    outbox = Outbox(
        pg_dsn,
        table=table,
        prefix=prefix,
        queues={
            "packed": QueueFormat(codec="msgpack"),
            "typed": QueueFormat(payload_type=Order),
            "small": QueueFormat(max_payload_bytes=64),
        },
    )
    outbox.install()
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        packed = outbox.offer(conn, "packed", {"b": b"\x00\x01"})
        typed = outbox.offer(conn, "typed", Order(7, 9.5))
        with pytest.raises(EncodeError):
            outbox.offer(conn, "typed", {"id": 7})
        with pytest.raises(InvalidTaskError, match="over the limit"):
            outbox.offer(conn, "small", "x" * 100)
    assert relay_now(pg_dsn, redis_url, table) == 2
    got = make_queue("packed", codec="msgpack").take()
    assert (got.id, got.payload) == (packed, {"b": b"\x00\x01"})
    got = make_queue("typed", payload_type=Order).take()
    assert (got.id, got.payload) == (typed, Order(7, 9.5))


def test_cancel_and_reschedule_are_transactional(
    outbox: Outbox, orders: DelayQueue, pg_dsn: str, table: str, redis_url: str
) -> None:
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        kept, moved = (outbox.offer(conn, "orders", n, 3600) for n in (1, 2))
    relay_now(pg_dsn, redis_url, table)
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        outbox.cancel(conn, "orders", kept)
        outbox.reschedule(conn, "orders", moved, 60)
        raise psycopg.Rollback
    relay_now(pg_dsn, redis_url, table)
    assert orders.get(kept) is not None  # the cancel rolled back with its transaction
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        outbox.cancel(conn, "orders", kept)
        outbox.reschedule(conn, "orders", moved, 60)
    assert relay_now(pg_dsn, redis_url, table) == 2
    assert orders.get(kept) is None
    info = orders.get(moved)
    assert info is not None
    assert 55 < (info.due_at - datetime.now(UTC)).total_seconds() <= 60
    assert pending(pg_dsn, table) == 0


def test_status_dead_and_requeue(
    outbox: Outbox, pg_dsn: str, table: str, redis_url: str, prefix: str
) -> None:
    offer_ids = []
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        offer_ids = [outbox.offer(conn, "orders", n) for n in range(3)]
        outbox.offer(conn, "other", "x")
    status = outbox.status()
    assert (status.pending, status.dead) == (4, 0)
    assert {(q.queue, q.pending) for q in status.queues} == {("orders", 3), ("other", 1)}
    assert status.oldest_pending_age is not None and status.oldest_pending_age >= 0
    with psycopg.connect(pg_dsn) as conn:
        conn.execute(f"UPDATE \"{table}\" SET envelope = 'not an envelope' WHERE queue = 'other'")
    assert relay_now(pg_dsn, redis_url, table) == 4
    status = outbox.status()
    assert (status.pending, status.dead) == (0, 1)
    [dead] = outbox.dead()
    assert dead.queue == "other" and dead.error and "envelope" in dead.error
    assert outbox.requeue_dead() == 1
    assert outbox.status().pending == 1
    assert len(offer_ids) == 3


def test_sqlalchemy_engine_as_the_database(pg_dsn: str, table: str, prefix: str) -> None:
    engine = sqlalchemy.create_engine(sqlalchemy_url(pg_dsn))
    try:
        outbox = Outbox(engine, table=table, prefix=prefix)
        outbox.install()
        with engine.begin() as conn:
            outbox.offer(conn, "orders", 1)
        assert outbox.status().pending == 1
        assert outbox.dead() == [] and outbox.requeue_dead() == 0
    finally:
        engine.dispose()


def test_sync_and_async_outboxes_have_the_same_face() -> None:
    import inspect

    def face(cls: type) -> dict[str, inspect.Signature]:
        return {
            name: inspect.signature(member)
            for name, member in inspect.getmembers(cls, inspect.isfunction)
            if not name.startswith("_")
        }

    assert face(Outbox) == face(AsyncOutbox)
    assert {"install", "offer", "cancel", "reschedule", "status", "dead"} <= set(face(Outbox))
