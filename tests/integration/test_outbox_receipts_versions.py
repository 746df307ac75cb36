"""The outbox receipts on every server version the suite runs (Redis 7, 6.2, Valkey): the
scripts' ZMSCORE and ZADD XX LT exist from 6.2 on. A batch whose DELETE fails is claimed
again and refused, and its receipts are shortened once it commits."""

from __future__ import annotations

import time

import psycopg
import redis

from delayq import DelayQueue
from delayq.outbox import Outbox, Relay
from tests.integration.test_outbox_exactly_once import fail_deletes
from tests.outbox_support import offer_committed, wait_drained

pytest_plugins = ["tests.outbox_support"]


def test_receipts_refuse_a_replayed_batch_and_settle(
    outbox: Outbox, orders: DelayQueue, pg_dsn: str, table: str, redis_url: str
) -> None:
    orders.offer({"v": 0}, 3600, id="C")
    ids = offer_committed(outbox, pg_dsn, 5)
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        outbox.cancel(conn, "orders", "C")
    fail_deletes(pg_dsn, table, 2)  # after the rows: outbox.cancel deletes too
    with Relay(pg_dsn, redis_url, table=table, max_backoff=0.2) as relay:
        wait_drained(pg_dsn, table)
    assert relay.stats.offered == 5 and relay.stats.cancelled == 1
    counters = orders.stats().counters
    assert counters["offered"] == 6  # the direct offer and the 5 rows, once each
    assert counters["applied_before"] >= 5
    assert all(orders.get(task_id) is not None for task_id in ids)
    with redis.Redis.from_url(redis_url) as client:
        receipts = client.zrange(orders.keys.key("applied"), 0, -1, withscores=True)
        now_ms = time.time() * 1000
    assert len(receipts) == 6
    # settled: kept about 2 minutes, not the 24 hours of an uncommitted batch
    assert all(score - now_ms < 10 * 60 * 1000 for _, score in receipts)
