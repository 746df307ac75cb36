"""The outbox's checks, options and installation. Its contract with the caller's transaction,
for every kind of connection of both front ends, is in _async/test_outbox.py (and the
_sync/test_outbox.py generated from it)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from delayq import DelayQueue
from delayq.embedded import EmbeddedRedis
from delayq.exceptions import ConfigError, EncodeError, InvalidDelay, InvalidTaskError
from delayq.outbox import AsyncOutbox, Outbox, QueueFormat, Relay
from tests.outbox_support import rows

pytest_plugins = ["tests.outbox_support"]


@pytest.fixture
def redis_server(redis7_server: EmbeddedRedis) -> EmbeddedRedis:
    """One Redis version: the outbox's contract is with PostgreSQL, not the Redis version."""
    return redis7_server


def relay_now(dsn: str, url: str, table: str) -> int:
    return Relay(dsn, url, table=table).relay_pending()


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
