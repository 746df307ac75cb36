# Generated from _async/test_outbox.py by scripts/unasync.py: do not edit.
"""The outbox's contract with the caller's transaction, for every kind of connection of each
front end: a task reaches its queue if and only if the transaction (or savepoint) that
offered it committed. (tests/integration/test_outbox.py has the rest.)"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from delayq import DelayQueue
from delayq.embedded import EmbeddedRedis
from delayq.outbox import Outbox
from tests.outbox_support import live_ids, pending, rows

from .flavor import Session, relay_pending, sqlalchemy_engine

pytest_plugins = ["tests.outbox_support"]


@pytest.fixture
def redis_server(redis7_server: EmbeddedRedis) -> EmbeddedRedis:
    """One Redis version: the outbox's contract is with PostgreSQL, not the Redis version."""
    return redis7_server


@pytest.fixture
def outbox(pg_dsn: str, table: str, prefix: str) -> Outbox:
    """An installed outbox with its own table, offering under the test's key prefix."""
    box = Outbox(pg_dsn, table=table, prefix=prefix)
    box.install()
    return box


@pytest.fixture
def orders(make_queue: Any) -> DelayQueue:
    return make_queue("orders")  # type: ignore[no-any-return]


class Boom(Exception):
    """Raised inside a transaction block by the tests."""


def sqlalchemy_url(dsn: str) -> str:
    return dsn.replace("postgresql://", "postgresql+psycopg://", 1)


def offered_count(queue: DelayQueue) -> int:
    """Tasks the queue's scripts created (a resend that matched a live task is not counted)."""
    return int((queue.stats()).counters.get("offered", 0))


@dataclass
class Path:
    """How one kind of connection opens a transaction, a savepoint and rolls back."""

    transaction: Callable[[], Any]
    savepoint: Callable[[Any], Any]
    rolled_back: Callable[[Callable[[Any], Any]], Any]


def run_cases(outbox: Outbox, path: Path) -> dict[str, str]:
    """Offer under commit, rollback, savepoint rollback and an exception; the ids by case."""
    ids: dict[str, str] = {}

    def offer(conn: Any, case: str) -> None:
        ids[case] = outbox.offer(conn, "orders", {"case": case}, 3600)

    with path.transaction() as conn:
        offer(conn, "commit")
    with pytest.raises(Boom):
        with path.transaction() as conn:
            offer(conn, "exception")
            raise Boom
    with path.transaction() as conn:
        offer(conn, "outer")
        with pytest.raises(Boom):
            with path.savepoint(conn):
                offer(conn, "savepoint")
                raise Boom
        offer(conn, "after-savepoint")
    path.rolled_back(lambda conn: offer(conn, "rollback"))
    return ids


def check_cases(ids: dict[str, str], orders: DelayQueue, url: str, dsn: str, table: str) -> None:
    """Only the committed offers became tasks, and their rows are gone."""
    before = offered_count(orders)
    assert relay_pending(dsn, url, table) == 3
    committed = {ids["commit"], ids["outer"], ids["after-savepoint"]}
    assert committed <= live_ids(orders, url)
    for case in ("commit", "outer", "after-savepoint"):
        info = orders.get(ids[case])
        assert info is not None and info.payload == {"case": case}
    for case in ("exception", "savepoint", "rollback"):  # no ghost of a rolled-back offer
        assert orders.get(ids[case]) is None
    assert offered_count(orders) == before + 3
    assert rows(dsn, table) == []  # relayed rows are deleted


def test_psycopg_connection(
    outbox: Outbox, orders: DelayQueue, pg_dsn: str, table: str, redis_url: str
) -> None:
    @contextmanager
    def transaction() -> Iterator[Any]:
        with psycopg.Connection.connect(pg_dsn) as conn, conn.transaction():
            yield conn

    def rolled_back(offer: Callable[[Any], Any]) -> None:
        with psycopg.Connection.connect(pg_dsn) as conn, conn.transaction():
            offer(conn)
            raise psycopg.Rollback

    path = Path(transaction, lambda conn: conn.transaction(), rolled_back)
    check_cases(run_cases(outbox, path), orders, redis_url, pg_dsn, table)


def test_psycopg_cursor_and_pool(
    pg_dsn: str, table: str, prefix: str, orders: DelayQueue, redis_url: str
) -> None:
    with ConnectionPool(pg_dsn, min_size=1, max_size=2, open=False) as pool:
        outbox = Outbox(pool, table=table, prefix=prefix)
        outbox.install()
        with pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
            task_id = outbox.offer(cur, "orders", {"via": "cursor"})
        assert (outbox.status()).pending == 1
    assert relay_pending(pg_dsn, redis_url, table) == 1
    info = orders.get(task_id)
    assert info is not None and info.payload == {"via": "cursor"}


def test_sqlalchemy_session_and_connection(
    outbox: Outbox, orders: DelayQueue, pg_dsn: str, table: str, redis_url: str
) -> None:
    engine = sqlalchemy_engine(sqlalchemy_url(pg_dsn))
    try:

        @contextmanager
        def session() -> Iterator[Any]:
            with Session(engine) as s, s.begin():
                yield s

        def session_rolled_back(offer: Callable[[Any], Any]) -> None:
            with Session(engine) as s:
                offer(s)
                s.rollback()

        path = Path(session, lambda s: s.begin_nested(), session_rolled_back)
        check_cases(run_cases(outbox, path), orders, redis_url, pg_dsn, table)

        def connection_rolled_back(offer: Callable[[Any], Any]) -> None:
            with engine.connect() as c:
                offer(c)
                c.rollback()

        path = Path(engine.begin, lambda c: c.begin_nested(), connection_rolled_back)
        check_cases(run_cases(outbox, path), orders, redis_url, pg_dsn, table)
    finally:
        engine.dispose()


def test_sqlalchemy_engine_as_the_database(pg_dsn: str, table: str, prefix: str) -> None:
    engine = sqlalchemy_engine(sqlalchemy_url(pg_dsn))
    try:
        outbox = Outbox(engine, table=table, prefix=prefix)
        outbox.install()
        assert outbox.installed()
        with engine.begin() as conn:
            outbox.offer(conn, "orders", 1)
        assert (outbox.status()).pending == 1
        assert outbox.dead() == [] and outbox.requeue_dead() == 0
    finally:
        engine.dispose()


def test_cancel_and_reschedule_are_transactional(
    outbox: Outbox, orders: DelayQueue, pg_dsn: str, table: str, redis_url: str
) -> None:
    with psycopg.Connection.connect(pg_dsn) as conn, conn.transaction():
        kept = outbox.offer(conn, "orders", 1, 3600)
        moved = outbox.offer(conn, "orders", 2, 3600)
    relay_pending(pg_dsn, redis_url, table)
    with psycopg.Connection.connect(pg_dsn) as conn, conn.transaction():
        outbox.cancel(conn, "orders", kept)
        outbox.reschedule(conn, "orders", moved, 60)
        raise psycopg.Rollback
    relay_pending(pg_dsn, redis_url, table)
    assert orders.get(kept) is not None  # the cancel rolled back with its transaction
    with psycopg.Connection.connect(pg_dsn) as conn, conn.transaction():
        outbox.cancel(conn, "orders", kept)
        outbox.reschedule(conn, "orders", moved, 60)
    assert relay_pending(pg_dsn, redis_url, table) == 2
    assert orders.get(kept) is None
    info = orders.get(moved)
    assert info is not None
    assert 55 < (info.due_at - datetime.now(UTC)).total_seconds() <= 60
    assert pending(pg_dsn, table) == 0


def test_status_dead_and_requeue(outbox: Outbox, pg_dsn: str, table: str, redis_url: str) -> None:
    with psycopg.Connection.connect(pg_dsn) as conn, conn.transaction():
        for n in range(3):
            outbox.offer(conn, "orders", n)
        outbox.offer(conn, "other", "x")
    status = outbox.status()
    assert (status.pending, status.dead) == (4, 0)
    assert {(q.queue, q.pending) for q in status.queues} == {("orders", 3), ("other", 1)}
    assert status.oldest_pending_age is not None and status.oldest_pending_age >= 0
    with psycopg.connect(pg_dsn) as plain:
        plain.execute(f"UPDATE \"{table}\" SET envelope = 'not an envelope' WHERE queue = 'other'")
    assert relay_pending(pg_dsn, redis_url, table) == 4
    status = outbox.status()
    assert (status.pending, status.dead) == (0, 1)
    [dead] = outbox.dead()
    assert dead.queue == "other" and dead.error and "envelope" in dead.error
    assert outbox.requeue_dead() == 1
    assert (outbox.status()).pending == 1
