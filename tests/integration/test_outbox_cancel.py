"""Offer then cancel ends with no task, whatever the interleaving of producers and relays."""

from __future__ import annotations

import random
import threading

import psycopg
import pytest

from delayq import DelayQueue
from delayq.embedded import EmbeddedRedis
from delayq.outbox import Outbox, Relay
from tests.helpers import wait_until
from tests.outbox_support import live_ids, offered_count, pending, rows, wait_drained

pytest_plugins = ["tests.outbox_support"]


@pytest.fixture
def redis_server(redis7_server: EmbeddedRedis) -> EmbeddedRedis:
    return redis7_server


def cancelled_count(queue: DelayQueue) -> int:
    return int(queue.stats().counters.get("cancelled", 0))


def relay_now(pg_dsn: str, redis_url: str, table: str) -> int:
    return Relay(pg_dsn, redis_url, table=table).relay_pending()


def test_offer_and_cancel_in_one_transaction_touch_nothing(
    outbox: Outbox, orders: DelayQueue, pg_dsn: str, table: str, redis_url: str
) -> None:
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        task_id = outbox.offer(conn, "orders", "x", 60)
        outbox.cancel(conn, "orders", task_id)
    assert [r[1] for r in rows(pg_dsn, table)] == ["cancel"]  # the offer row is gone
    relay_now(pg_dsn, redis_url, table)
    assert offered_count(orders) == 0 and live_ids(orders, redis_url) == set()


def test_cancel_committed_before_any_relay(
    outbox: Outbox, orders: DelayQueue, pg_dsn: str, table: str, redis_url: str
) -> None:
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        task_id = outbox.offer(conn, "orders", "x", 60)
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        outbox.reschedule(conn, "orders", task_id, 5)
        outbox.cancel(conn, "orders", task_id)
    relay_now(pg_dsn, redis_url, table)
    assert offered_count(orders) == 0 and live_ids(orders, redis_url) == set()
    assert pending(pg_dsn, table) == 0


def test_a_cancel_that_drops_only_a_reschedule_and_finds_no_task_stays_missed(
    outbox: Outbox, orders: DelayQueue, pg_dsn: str, table: str, redis_url: str
) -> None:
    """The task ran and was acked; a reschedule, then a cancel, commit before any relay. The
    cancel drops the pending reschedule (no offer) and finds no task: a missed cancel, never
    reported as applied (it was: any dropped row made finding no task look expected)."""
    delivered = orders.offer({"n": 1}, 0)
    task = orders.poll(5)
    assert task is not None and task.id == delivered
    task.ack()
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        outbox.reschedule(conn, "orders", delivered, 60)
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        outbox.cancel(conn, "orders", delivered)
    relay = Relay(pg_dsn, redis_url, table=table)
    relay.relay_pending()
    assert (relay.stats.cancelled, relay.stats.missing) == (0, 1)
    assert [(r[1], r[3]) for r in rows(pg_dsn, table)] == [("cancel", "missed")]
    # a cancel after one that dropped the offer still knows the offer never went out
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        unsent = outbox.offer(conn, "orders", "x", 60)
        outbox.cancel(conn, "orders", unsent)
        outbox.cancel(conn, "orders", unsent)
    relay = Relay(pg_dsn, redis_url, table=table)
    relay.relay_pending()
    assert (relay.stats.cancelled, relay.stats.missing) == (1, 0)


def test_a_dead_offer_stays_dead_on_requeue_when_a_later_cancel_stands_against_it(
    outbox: Outbox, orders: DelayQueue, pg_dsn: str, table: str, redis_url: str
) -> None:
    """Offer, then cancel: no task, also when the offer's row went dead (an unreadable
    envelope), the cancel found nothing, and an operator requeues the fixed row (it made the
    cancelled task)."""
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        task_id = outbox.offer(conn, "orders", {"n": 1}, 60)
        other = outbox.offer(conn, "orders", {"n": 2}, 60)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        good = conn.execute(f'SELECT envelope FROM "{table}" LIMIT 1').fetchone()[0]
        conn.execute(f"UPDATE \"{table}\" SET envelope = '\\x7b7b'")  # '{{': unreadable
    relay_now(pg_dsn, redis_url, table)
    assert {(r[1], r[3]) for r in rows(pg_dsn, table)} == {("offer", "dead")}
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        outbox.cancel(conn, "orders", task_id)
    relay_now(pg_dsn, redis_url, table)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE \"{table}\" SET envelope = %s WHERE op = 'offer'", (good,))
    assert outbox.requeue_dead() == 1  # the other offer only
    relay_now(pg_dsn, redis_url, table)
    assert orders.get(task_id) is None
    assert orders.get(other) is not None


def test_cancel_after_the_offer_was_relayed(
    outbox: Outbox, orders: DelayQueue, pg_dsn: str, table: str, redis_url: str
) -> None:
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        task_id = outbox.offer(conn, "orders", "x", 60)
    relay_now(pg_dsn, redis_url, table)
    assert orders.get(task_id) is not None
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        outbox.cancel(conn, "orders", task_id)
    relay_now(pg_dsn, redis_url, table)
    assert orders.get(task_id) is None and cancelled_count(orders) == 1


@pytest.mark.parametrize("relay_a", ["finishes", "dies"])
def test_cancel_never_overtakes_an_offer_another_relay_holds(
    outbox: Outbox, orders: DelayQueue, pg_dsn: str, table: str, redis_url: str, relay_a: str
) -> None:
    """Relay A holds the offer row (its claim's lock) while the cancel commits and relay B
    runs: B must leave the cancel until A is done, or it would cancel nothing and A's offer
    would then create the task."""
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        task_id = outbox.offer(conn, "orders", "x", 60)
    with psycopg.connect(pg_dsn) as relay_a_conn:
        # What relay A's claim does: lock the row, then offer it to Redis.
        relay_a_conn.execute(
            f'SELECT seq FROM "{table}" WHERE task_id = %s FOR UPDATE', (task_id,)
        ).fetchall()
        with psycopg.connect(pg_dsn) as conn, conn.transaction():
            outbox.cancel(conn, "orders", task_id)  # cannot drop the row A holds
        assert relay_now(pg_dsn, redis_url, table) == 0  # relay B: nothing it may apply yet
        assert cancelled_count(orders) == 0
        if relay_a == "finishes":
            orders.offer("x", 60, id=task_id)  # A's offer reaches Redis...
            relay_a_conn.execute(f'DELETE FROM "{table}" WHERE task_id = %s AND op = %s',
                                 (task_id, "offer"))  # fmt: skip
            relay_a_conn.commit()  # ...and A commits
        else:
            relay_a_conn.rollback()  # A died: its row is pending again
    assert relay_now(pg_dsn, redis_url, table) >= 1
    relay_now(pg_dsn, redis_url, table)
    assert orders.get(task_id) is None
    assert pending(pg_dsn, table) == 0


def test_offer_then_cancel_with_three_relays(
    outbox: Outbox, orders: DelayQueue, pg_dsn: str, table: str, redis_url: str
) -> None:
    relays = [
        Relay(pg_dsn, redis_url, table=table, batch_size=8, name=f"c{i}").start() for i in range(3)
    ]
    for relay in relays:
        assert relay.wait_connected(10)
    try:
        kept: list[str] = []
        cancelled: list[str] = []
        lock = threading.Lock()

        def produce(seed: int) -> None:
            rng = random.Random(seed)
            for _ in range(60):
                with psycopg.connect(pg_dsn) as conn:
                    with conn.transaction():
                        task_id = outbox.offer(conn, "orders", "x", 3600)
                        same_transaction = rng.random() < 0.2
                        if same_transaction:
                            outbox.cancel(conn, "orders", task_id)
                    if not same_transaction and rng.random() < 0.6:
                        # A later transaction: the relays may or may not have offered it yet.
                        if rng.random() < 0.5:
                            wait_until(lambda tid=task_id: orders.get(tid) is not None)
                        with conn.transaction():
                            outbox.cancel(conn, "orders", task_id)
                        same_transaction = True
                with lock:
                    (cancelled if same_transaction else kept).append(task_id)

        threads = [threading.Thread(target=produce, args=(seed,)) for seed in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wait_drained(pg_dsn, table)
    finally:
        for relay in relays:
            relay.stop()
    assert len(kept) + len(cancelled) == 180 and cancelled and kept
    assert live_ids(orders, redis_url) == set(kept)  # no cancelled task survives
