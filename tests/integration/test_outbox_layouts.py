"""The relay on every layout Redis records (issue #23): sharded queues, a queue mid-reshard,
a malformed layout record (an error for that queue alone); cancels and reschedules that find
no task are kept as 'missed' rows, counted and shown, never reported as applied; the backoff
grows until a batch goes through and an outage is logged once at each end."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

import psycopg
import pytest
import redis

from delayq import DelayQueue, Offer
from delayq._sync.reshard import finish_reshard, reshard
from delayq.embedded import EmbeddedRedis
from delayq.exceptions import ConfigError
from delayq.outbox import Outbox, Relay
from tests.helpers import wait_until
from tests.integration.test_outbox_exactly_once import fail_deletes
from tests.outbox_support import (
    offer_committed,
    relay_process,
    rows,
    terminate_backends,
    wait_drained,
)

pytest_plugins = ["tests.outbox_support"]


@pytest.fixture
def redis_server(redis7_server: EmbeddedRedis) -> EmbeddedRedis:
    return redis7_server


@pytest.fixture
def relay(pg_dsn: str, redis_url: str, table: str) -> Iterator[Relay]:
    made = Relay(pg_dsn, redis_url, table=table, batch_size=50, max_backoff=0.4)
    yield made
    made.stop()


def test_offers_cancels_and_reschedules_reach_a_sharded_queue(
    outbox: Outbox, make_queue: object, pg_dsn: str, table: str, relay: Relay
) -> None:
    sharded: DelayQueue = make_queue("orders", shards=4)  # type: ignore[operator]
    sharded.stats()  # records the layout
    ids = offer_committed(outbox, pg_dsn, 40)
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        outbox.cancel(conn, "orders", ids[0])
        outbox.reschedule(conn, "orders", ids[1], 60)  # from 3600
    relay.start()
    wait_drained(pg_dsn, table)
    wait_until(lambda: relay.stats.cancelled + relay.stats.rescheduled == 2)
    assert sharded.get(ids[0]) is None
    moved = sharded.get(ids[1])
    assert moved is not None and moved.due_at is not None
    assert 30 < moved.due_at.timestamp() - time.time() <= 60
    assert sharded.stats().delayed == 39
    assert len({shard.queue for shard in sharded.stats().shards if shard.delayed}) > 1
    assert relay.stats.missing == 0 and relay.stats.dead == 0


def test_a_queue_mid_reshard_is_served_in_both_layouts(
    outbox: Outbox, make_queue: object, pg_dsn: str, table: str, relay: Relay, prefix: str,
    redis_url: str,
) -> None:  # fmt: skip
    orders: DelayQueue = make_queue("orders")  # type: ignore[operator]
    before = [orders.offer({"n": i}, 3600) for i in range(10)]  # in the unsharded layout
    reshard("orders", redis_url, shards=4, prefix=prefix)
    after = offer_committed(outbox, pg_dsn, 10)
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        for task_id in before[:5]:
            outbox.cancel(conn, "orders", task_id)
    relay.start()
    wait_drained(pg_dsn, table)
    assert relay.stats.cancelled == 5 and relay.stats.missing == 0
    now: DelayQueue = make_queue("orders")  # type: ignore[operator]
    assert now.shards == 4 or now.stats().queue == "orders"
    assert all(now.get(task_id) is None for task_id in before[:5])
    assert all(now.get(task_id) is not None for task_id in before[5:] + after)
    assert {s.queue for s in now.stats().shards if s.delayed} > {"orders"}  # both layouts


def test_a_cancel_that_finds_no_task_is_missed_not_applied(
    outbox: Outbox, orders: DelayQueue, pg_dsn: str, table: str, relay: Relay
) -> None:
    delivered = orders.offer({"n": 1}, 0)
    task = orders.poll(5)
    assert task is not None and task.id == delivered
    task.ack()  # the close timer already fired
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        outbox.cancel(conn, "orders", delivered)
        outbox.reschedule(conn, "orders", "no-such-task", 60)
    relay.start()
    wait_until(lambda: relay.stats.missing == 2)
    assert (relay.stats.cancelled, relay.stats.rescheduled) == (0, 0)
    kept = [(op, status) for _, op, _, status, _ in rows(pg_dsn, table)]
    assert kept == [("cancel", "missed"), ("reschedule", "missed")]
    status = outbox.status()
    assert status.missed == 2 and status.pending == 0 and status.dead == 0
    assert status.queues[0].missed == 2


def test_a_malformed_layout_record_fails_that_queue_alone(
    outbox: Outbox, orders: DelayQueue, pg_dsn: str, table: str, relay: Relay, prefix: str,
    redis_url: str,
) -> None:  # fmt: skip
    with redis.Redis.from_url(redis_url) as client:
        client.hset(f"{prefix}:shards", "broken", "4<1000000000")
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        outbox.offer(conn, "broken", {"n": 1}, 60)
        good = outbox.offer(conn, "orders", {"n": 2}, 60)
    relay.start()
    wait_drained(pg_dsn, table, timeout=10)
    assert orders.get(good) is not None
    (dead,) = [r for r in rows(pg_dsn, table) if r[3] == "dead"]
    assert "malformed layout record" in dead[4] and "broken" in dead[4]


def test_the_backoff_grows_and_an_outage_is_logged_once(
    outbox: Outbox, orders: DelayQueue, pg_dsn: str, table: str, redis_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    fail_deletes(pg_dsn, table, 6)
    offer_committed(outbox, pg_dsn, 3)
    caplog.set_level(logging.INFO, "delayq.outbox")
    started = time.monotonic()
    with Relay(pg_dsn, redis_url, table=table, max_backoff=1.0):
        wait_drained(pg_dsn, table, timeout=30)
    took = time.monotonic() - started
    # waits 0.05, 0.1, 0.2, 0.4, 0.8, then 1.0 (max_backoff): not reset by the reconnects
    assert took >= 0.05 + 0.1 + 0.2 + 0.4 + 0.8 + 1.0
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 2, warnings
    assert "retrying with backoff" in warnings[0]
    assert "recovered after 6 failed attempt(s)" in warnings[1]


def test_a_caller_id_reoffered_during_a_reshard_matches_its_task(
    make_queue: object, redis_url: str, prefix: str
) -> None:
    orders: DelayQueue = make_queue("orders")  # type: ignore[operator]
    first = orders.offer({"n": 1}, 3600, id="order-42")
    reshard("orders", redis_url, shards=4, prefix=prefix)
    fresh: DelayQueue = make_queue("orders")  # type: ignore[operator]
    again = fresh.offer({"n": 1}, 3600, id="order-42")  # a producer's retry
    assert again == first and again.outcome == "existing"
    (many,) = fresh.offer_many([Offer({"n": 1}, 3600, id="order-42")])
    assert many.outcome == "existing"
    assert fresh.stats().delayed == 1


def test_finish_waits_out_the_queues_that_have_not_reread_the_layout(
    make_queue: object, redis_url: str, prefix: str
) -> None:
    orders: DelayQueue = make_queue("orders")  # type: ignore[operator]
    orders.stats()
    reshard("orders", redis_url, shards=2, prefix=prefix)
    with pytest.raises(ConfigError, match=r"began .* ago"):
        finish_reshard("orders", redis_url, prefix=prefix)
    assert finish_reshard("orders", redis_url, prefix=prefix, grace=0) == "2"


def relay_killed_before_its_delete(
    pg_dsn: str, redis_url: str, table: str, applied: Callable[[], bool]
) -> None:
    """A relay process applies the pending rows (until ``applied``) and is killed while its
    DELETE of them waits on a lock: the rows stay pending, applied in Redis."""
    with psycopg.connect(pg_dsn) as blocker:
        blocker.execute(f'LOCK TABLE "{table}" IN SHARE MODE')
        with relay_process(pg_dsn, redis_url, table, name="before") as proc:
            wait_until(applied)
            proc.kill()
            proc.wait(10)
            terminate_backends(pg_dsn, "before")
        blocker.rollback()


def test_a_row_applied_before_a_reshard_and_claimed_again_after_it_is_refused(
    outbox: Outbox, make_queue: object, pg_dsn: str, table: str, redis_url: str, prefix: str
) -> None:
    """The row's receipt is in the old layout's shard: the re-claim goes there."""
    orders: DelayQueue = make_queue("orders")  # type: ignore[operator]
    ids = offer_committed(outbox, pg_dsn, 20, delay=0)
    relay_killed_before_its_delete(pg_dsn, redis_url, table, lambda: orders.stats().ready == 20)
    while (task := orders.poll(0.5)) is not None:
        task.ack()  # delivered and acked
    reshard("orders", redis_url, shards=4, prefix=prefix)
    with Relay(pg_dsn, redis_url, table=table) as second:
        wait_drained(pg_dsn, table)
    assert second.stats.duplicates == 20 and second.stats.offered == 0
    fresh: DelayQueue = make_queue("orders")  # type: ignore[operator]
    assert fresh.stats().delayed + fresh.stats().ready == 0
    assert all(fresh.get(task_id) is None for task_id in ids)


def test_a_limit_keyed_row_applied_before_a_reshard_is_looked_for_on_its_keys_shard(
    outbox: Outbox, make_queue: object, pg_dsn: str, table: str, redis_url: str, prefix: str
) -> None:
    """A row with a limit_key went to its key's shard of the old layout (2 shards); claimed
    again after a reshard, it is looked for there, not on its id's shard: found, and not
    created a second time in the new layout (before: half the rows were, two tasks each)."""
    reshard("orders", redis_url, shards=2, prefix=prefix)
    finish_reshard("orders", redis_url, prefix=prefix, grace=0)
    orders: DelayQueue = make_queue("orders")  # type: ignore[operator]
    offer_committed(outbox, pg_dsn, 20, limit_key="tenant:a")
    relay_killed_before_its_delete(pg_dsn, redis_url, table, lambda: orders.stats().delayed == 20)
    reshard("orders", redis_url, shards=4, prefix=prefix)
    with Relay(pg_dsn, redis_url, table=table) as second:
        wait_drained(pg_dsn, table)
    assert (second.stats.duplicates, second.stats.offered) == (20, 0)
    assert make_queue("orders").stats().delayed == 20  # type: ignore[operator]


def test_a_producer_opened_before_a_reshard_follows_it_after_the_finish(
    make_queue: object, redis_url: str, prefix: str
) -> None:
    """A finished reshard retires the old layout: its scripts refuse new tasks, and a writer
    that had not re-read the layout (here: a safety_interval of an hour) moves to the new
    one at its next offer, instead of stranding tasks no consumer sees."""
    stale: DelayQueue = make_queue("orders", safety_interval=3600)  # type: ignore[operator]
    warm = stale.offer({"n": 0}, 60)  # reads the layout: unsharded
    assert stale.cancel(warm)
    reshard("orders", redis_url, shards=2, prefix=prefix)
    finish_reshard("orders", redis_url, prefix=prefix, grace=0)
    ids = [stale.offer({"n": 1}, 60), stale.offer({"n": 2}, 60, id="own-id", priority=3)]
    ids += stale.offer_many([({"n": 3}, 60), ({"n": 4}, 60)])
    fresh: DelayQueue = make_queue("orders")  # type: ignore[operator]
    assert fresh.shards == 2 or fresh.stats().delayed == 4
    assert fresh.stats().delayed == 4
    assert all(fresh.get(task_id) is not None for task_id in ids)


def test_the_relay_follows_a_finished_reshard_at_its_next_row(
    outbox: Outbox, make_queue: object, pg_dsn: str, table: str, redis_url: str, prefix: str,
    relay: Relay,
) -> None:  # fmt: skip
    orders: DelayQueue = make_queue("orders")  # type: ignore[operator]
    relay.start()
    (first,) = offer_committed(outbox, pg_dsn, 1)
    wait_until(lambda: orders.get(first) is not None)  # the relay read the layout
    assert orders.cancel(first)
    reshard("orders", redis_url, shards=2, prefix=prefix)
    finish_reshard("orders", redis_url, prefix=prefix, grace=0)
    ids = offer_committed(outbox, pg_dsn, 6)
    wait_drained(pg_dsn, table)
    fresh: DelayQueue = make_queue("orders")  # type: ignore[operator]
    assert fresh.stats().delayed == 6 and relay.stats.dead == 0
    assert all(fresh.get(task_id) is not None for task_id in ids)


@pytest.mark.parametrize("record", ["4<1000000000", "\xff", "2<1500", "x"])
def test_delayq_stats_survives_a_malformed_layout_record(
    make_queue: object, redis_url: str, prefix: str, record: str
) -> None:
    import subprocess
    import sys

    good: DelayQueue = make_queue("good")  # type: ignore[operator]
    good.offer({"n": 1}, 60)
    with redis.Redis.from_url(redis_url) as client:
        client.sadd(f"{prefix}:queues", "broken")
        client.hset(f"{prefix}:shards", "broken", record.encode("latin-1"))
    shown = subprocess.run(
        [sys.executable, "-m", "delayq.cli", "stats", "--redis", redis_url, "--prefix", prefix],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert shown.returncode == 0 and "Traceback" not in shown.stderr
    assert "good" in shown.stdout, shown.stdout + shown.stderr
    assert "skipping a queue: queue 'broken' has a malformed layout record" in shown.stderr
    assert "broken" not in shown.stdout  # not shown as an empty unsharded queue
    with pytest.raises(ConfigError, match="'broken' has a malformed layout record"):
        make_queue("broken").stats()  # type: ignore[operator]
