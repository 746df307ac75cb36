"""The outbox carries a task's limit_key (issue #20): a relayed task runs under its key's
limits and goes to its key's shard, as one offered directly does."""

from __future__ import annotations

import psycopg
import pytest

from delayq import DelayQueue, InvalidTaskError, Limit
from delayq._core.sharding import shard_of
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


def test_a_row_whose_key_and_limit_key_route_apart_goes_dead_as_an_offer_is_refused(
    outbox: Outbox, make_queue, pg_dsn: str, table: str, redis_url: str
) -> None:
    """On a sharded queue DelayQueue.offer refuses a key and a limit_key that route to two
    shards (the key's dedup would be looked for on the wrong one): the relay sends such a row
    dead with that reason, and the rows beside it through (before: offered on the limit
    key's shard, where a later offer of the same key did not find it: two live tasks)."""
    orders: DelayQueue = make_queue("orders", shards=4)
    key = next(f"k{i}" for i in range(100) if shard_of(f"k{i}", 4) != shard_of("tenant:a", 4))
    with pytest.raises(InvalidTaskError, match="must route to one shard"):
        orders.offer("direct", 60, key=key, limit_key="tenant:a")
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        outbox.offer(conn, "orders", "apart", 60, key=key, limit_key="tenant:a")
        fine = outbox.offer(conn, "orders", "fine", 60, limit_key="tenant:a")
    relay = Relay(pg_dsn, redis_url, table=table)
    assert relay.relay_pending() == 2
    assert (relay.stats.offered, relay.stats.dead) == (1, 1)
    (dead,) = outbox.dead()
    assert dead.error is not None and "must route to one shard" in dead.error, dead
    assert orders.get(fine) is not None
    assert orders.offer("same key", 60, key=key).outcome == "created"  # none holds the key
