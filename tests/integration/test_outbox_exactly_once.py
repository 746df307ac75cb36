"""Exactly-once application of outbox rows (issue #23): a row the relay applied to Redis but
could not delete (its DELETE failed, the relay was SIGKILLed before its commit, its session
was cut and another relay took the row) is never applied a second time, even after the task
it created was delivered, acked and its traces purged. Each scenario counts deliveries with
a real consumer that acks as it goes: 0 duplicates."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator

import psycopg
import pytest

from delayq import DelayQueue
from delayq.embedded import EmbeddedRedis
from delayq.outbox import Outbox, Relay
from tests.helpers import wait_until
from tests.outbox_support import (
    offer_committed,
    pending,
    relay_process,
    terminate_backends,
    wait_drained,
)

pytest_plugins = ["tests.outbox_support"]


@pytest.fixture
def redis_server(redis7_server: EmbeddedRedis) -> EmbeddedRedis:
    return redis7_server


class Deliveries:
    """A consumer thread that takes and acks every task of a queue, counting deliveries."""

    def __init__(self, queue: DelayQueue) -> None:
        self.counts: Counter[str] = Counter()
        self._queue = queue
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            task = self._queue.poll(0.05)
            if task is not None:
                self.counts[task.id] += 1
                task.ack()

    def __enter__(self) -> Deliveries:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def duplicates(self) -> int:
        return sum(n - 1 for n in self.counts.values() if n > 1)


def fail_deletes(dsn: str, table: str, times: int) -> None:
    """A trigger that makes the first ``times`` DELETEs on the table fail (a sequence counts
    them: it is not rolled back with the failed transaction)."""
    with psycopg.connect(dsn) as conn:
        conn.execute(f'CREATE SEQUENCE "{table}_fails"')
        conn.execute(
            f"""CREATE FUNCTION "{table}_fail"() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF nextval('"{table}_fails"') <= {int(times)} THEN
                    RAISE EXCEPTION 'injected commit failure';
                END IF;
                RETURN OLD;
            END $$"""
        )
        conn.execute(
            f'CREATE TRIGGER "{table}_fail" BEFORE DELETE ON "{table}" '
            f'FOR EACH STATEMENT EXECUTE FUNCTION "{table}_fail"()'
        )


def failures_left(dsn: str, table: str, times: int) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(f'SELECT last_value, is_called FROM "{table}_fails"').fetchone()
        assert row is not None
        return not row[1] or int(row[0]) < times


@pytest.fixture
def relay_started(pg_dsn: str, redis_url: str, table: str) -> Iterator[Relay]:
    relay = Relay(pg_dsn, redis_url, table=table, batch_size=50, max_backoff=0.2)
    yield relay
    relay.stop()


def test_a_failed_delete_never_replays_the_batch(
    outbox: Outbox, orders: DelayQueue, pg_dsn: str, table: str, relay_started: Relay
) -> None:
    fail_deletes(pg_dsn, table, 3)
    with Deliveries(orders) as seen:
        ids = offer_committed(outbox, pg_dsn, 20, delay=0)
        relay_started.start()
        wait_drained(pg_dsn, table)
        wait_until(lambda: set(seen.counts) == set(ids))
        assert not failures_left(pg_dsn, table, 3)  # the DELETE did fail three times
        # a later batch flows through the same relay, and the first is not offered again
        more = offer_committed(outbox, pg_dsn, 5, delay=0)
        wait_until(lambda: set(seen.counts) == set(ids + more))
        wait_until(lambda: orders.stats().inflight == 0)
    assert seen.duplicates() == 0
    assert relay_started.stats.database_errors >= 3
    assert relay_started.stats.offered == 25  # applied once each, re-claims refused
    assert relay_started.stats.duplicates >= 20


def test_relay_sigkilled_after_its_redis_writes_delivers_once(
    outbox: Outbox, orders: DelayQueue, pg_dsn: str, table: str, redis_url: str
) -> None:
    with Deliveries(orders) as seen:
        ids = offer_committed(outbox, pg_dsn, 60, delay=0)
        # A SHARE lock makes the relay's DELETE wait after it wrote to Redis; it is killed
        # there and its session ended: from the database's side it died before its commit.
        with psycopg.connect(pg_dsn) as blocker:
            blocker.execute(f'LOCK TABLE "{table}" IN SHARE MODE')
            with relay_process(pg_dsn, redis_url, table, "--batch-size", "60", name="k1") as p:
                wait_until(lambda: len(seen.counts) == 60)  # delivered and acked meanwhile
                wait_until(lambda: orders.stats().inflight == 0)
                orders.purge(["dead", "delayed", "ready", "inflight"])  # no trace left
                p.kill()
                p.wait(10)
                terminate_backends(pg_dsn, "k1")
            blocker.rollback()
        assert pending(pg_dsn, table) == 60
        with relay_process(pg_dsn, redis_url, table, name="k2"):
            wait_drained(pg_dsn, table)
            more = offer_committed(outbox, pg_dsn, 1, delay=0)  # flows after the 60
            wait_until(lambda: set(seen.counts) == set(ids + more))
    assert seen.duplicates() == 0


def test_two_relays_racing_on_one_row_apply_it_once(
    outbox: Outbox, orders: DelayQueue, pg_dsn: str, table: str, redis_url: str
) -> None:
    """Relay A applies the row and its session is cut before it commits (its lock goes with
    it); relay B claims the same row at once and applies it again: Redis refuses it."""
    with Deliveries(orders) as seen:
        ids = offer_committed(outbox, pg_dsn, 5, delay=0)
        with psycopg.connect(pg_dsn) as blocker:
            blocker.execute(f'LOCK TABLE "{table}" IN SHARE MODE')
            with relay_process(pg_dsn, redis_url, table, name="ra"):
                wait_until(lambda: len(seen.counts) == 5)
                terminate_backends(pg_dsn, "ra")  # A's claim and its DELETE are gone
                blocker.rollback()
                with relay_process(pg_dsn, redis_url, table, name="rb"):
                    wait_drained(pg_dsn, table)
        marker = offer_committed(outbox, pg_dsn, 1, delay=0)
        with relay_process(pg_dsn, redis_url, table, name="rc"):
            wait_until(lambda: set(seen.counts) == set(ids + marker))
    assert seen.duplicates() == 0


def test_a_cancel_and_a_reschedule_replayed_are_refused_not_missed(
    outbox: Outbox, orders: DelayQueue, pg_dsn: str, table: str, relay_started: Relay
) -> None:
    """A cancel whose DELETE failed is applied once: the re-claim is refused by its receipt,
    not counted as a cancel that found no task."""
    orders.offer({"v": 1}, 3600, id="X")
    orders.offer({"v": 2}, 3600, id="Y")
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        outbox.cancel(conn, "orders", "X")
        outbox.reschedule(conn, "orders", "Y", 60)
    fail_deletes(pg_dsn, table, 2)  # after the rows: outbox.cancel deletes too
    relay_started.start()
    wait_drained(pg_dsn, table)
    stats = relay_started.stats
    assert (stats.cancelled, stats.rescheduled, stats.missing) == (1, 1, 0)
    assert stats.duplicates >= 2
    assert orders.get("X") is None


def test_the_chaos_bench_runs_at_tiny_size(pg_dsn: str, tmp_path: object) -> None:
    """bench/outbox_chaos.py's harness, so that it cannot rot: 300 offers, a kill, 5 % of
    the DELETEs failing, every task delivered once (its exit status says so)."""
    import subprocess
    import sys

    admin = pg_dsn.rpartition("/")[0] + "/postgres"
    done = subprocess.run(
        [sys.executable, "-m", "bench.outbox_chaos", "--pg", admin, "--count", "300",
         "--rate", "300", "--kill-every", "0.5", "--fail", "0.05", "--workdir", str(tmp_path)],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "lost 0, duplicate deliveries 0, ghosts 0" in done.stdout
