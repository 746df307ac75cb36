"""The outbox carries a task's limit_key (issue #20): a relayed task runs under its key's
limits and goes to its key's shard, as one offered directly does."""

from __future__ import annotations

import psycopg
import pytest

from delayq import DelayQueue, Limit
from delayq.embedded import EmbeddedRedis
from delayq.outbox import Outbox, Relay

pytest_plugins = ["tests.outbox_support"]


@pytest.fixture
def redis_server(redis7_server: EmbeddedRedis) -> EmbeddedRedis:
    return redis7_server


def test_a_relayed_task_keeps_its_limit_key(
    outbox: Outbox, make_queue, pg_dsn: str, table: str, redis_url: str
) -> None:
    orders: DelayQueue = make_queue("orders")
    orders.limits.set("tenant:1", Limit(concurrency=1))
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        for i in range(3):
            outbox.offer(conn, "orders", i, 0, limit_key="tenant:1")
    assert Relay(pg_dsn, redis_url, table=table).relay_pending() == 3
    held = orders.poll_many(10, timeout=2)
    assert [t.payload for t in held] == [0], "the relayed tasks ignored their limit"
    assert orders.limits.get("tenant:1").waiting == 2
    with psycopg.connect(pg_dsn) as conn, conn.transaction(), pytest.raises(ValueError):
        outbox.offer(conn, "orders", 9, 0, limit_key="*")  # refused inside the transaction
