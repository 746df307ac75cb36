"""Durability on the outbox path and bounded rows (issue #23): a relay with a Durability
waits for the replica before it deletes the rows, and a shortfall keeps them (retried, not
duplicated); rows over the queue's max_payload_bytes or with out-of-range options go dead
without being read whole; settings that would never wake are refused."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import psycopg
import pytest
import redis

from delayq import DelayQueue, Durability
from delayq.embedded import EmbeddedRedis
from delayq.exceptions import ConfigError
from delayq.outbox import Outbox, QueueFormat, Relay
from tests.conftest import BINARIES
from tests.helpers import wait_until
from tests.integration.test_outbox_cli import delayq
from tests.outbox_support import live_ids, offer_committed, pending, rows, wait_drained

pytest_plugins = ["tests.outbox_support"]


@pytest.fixture
def redis_server(redis7_server: EmbeddedRedis) -> EmbeddedRedis:
    return redis7_server


@pytest.fixture
def pair() -> Iterator[tuple[EmbeddedRedis, EmbeddedRedis]]:
    binary = BINARIES[0][1]
    master = EmbeddedRedis(binary).start()
    replica = EmbeddedRedis(binary, extra_args=["--replicaof", "127.0.0.1", str(master.port)])
    replica.start()
    with redis.Redis(port=replica.port) as client:
        wait_until(lambda: client.info("replication").get("master_link_status") == "up", 15)
    yield master, replica
    if replica._proc is not None:
        os.kill(replica._proc.pid, signal.SIGCONT)
    replica.stop()
    master.stop()


@pytest.mark.parametrize("per_queue", [False, True])
def test_a_shortfall_keeps_the_rows_until_the_replica_confirms(
    outbox: Outbox,
    pg_dsn: str,
    table: str,
    prefix: str,
    pair: tuple[EmbeddedRedis, EmbeddedRedis],
    per_queue: bool,
) -> None:
    master, replica = pair
    durable = Durability(replicas=1, timeout=0.3)
    options: dict[str, object] = (
        {"queues": {"orders": QueueFormat(durability=durable)}}
        if per_queue
        else {"durability": durable}
    )
    assert replica._proc is not None
    os.kill(replica._proc.pid, signal.SIGSTOP)  # the master's writes reach no replica
    ids = offer_committed(outbox, pg_dsn, 5)
    relay = Relay(pg_dsn, master.url, table=table, max_backoff=0.2, **options)  # type: ignore[arg-type]
    with relay:
        wait_until(lambda: relay.stats.redis_errors >= 2, 20)
        assert pending(pg_dsn, table) == 5  # written to the master, not confirmed: kept
        os.kill(replica._proc.pid, signal.SIGCONT)
        wait_drained(pg_dsn, table, 20)
    orders = DelayQueue("orders", master.url, prefix=prefix)
    try:
        assert live_ids(orders, master.url) == set(ids)
        counters = orders.stats().counters
        assert counters["offered"] == 5  # each created once: the retries were refused
        assert counters["applied_before"] >= 5
    finally:
        orders.close()


def test_the_relay_command_waits_for_replicas_and_keeps_the_rows_on_a_shortfall(
    outbox: Outbox, pg_dsn: str, table: str, prefix: str, pair: tuple[EmbeddedRedis, EmbeddedRedis]
) -> None:
    """Before: `delayq relay` had no durability option, so relayed tasks only the master had
    were lost in a failover (the soak's outbox anomalies)."""
    master, replica = pair
    assert replica._proc is not None
    os.kill(replica._proc.pid, signal.SIGSTOP)
    ids = offer_committed(outbox, pg_dsn, 3)
    args = ["relay", "--once", "--dsn", pg_dsn, "--redis", master.url, "--table", table]
    waiting = [*args, "--wait-replicas", "1", "--wait-timeout", "0.3"]
    short = delayq(*waiting)
    assert short.returncode != 0
    assert "written but not confirmed within 0.3 s: 0 of 1 replicas" in short.stderr
    assert pending(pg_dsn, table) == 3  # written to the master, not confirmed: kept
    os.kill(replica._proc.pid, signal.SIGCONT)
    with redis.Redis(port=replica.port) as client:
        wait_until(lambda: client.info("replication").get("master_link_status") == "up", 15)
    done = delayq(*waiting)
    assert done.returncode == 0, done.stderr
    assert "relayed 3 rows" in done.stdout
    assert pending(pg_dsn, table) == 0
    orders = DelayQueue("orders", master.url, prefix=prefix)
    try:
        assert live_ids(orders, master.url) == set(ids)
        assert orders.stats().counters["offered"] == 3  # created once: the retry was refused
    finally:
        orders.close()
    bad = delayq(*args, "--wait-replicas", "-1")
    assert bad.returncode == 2 and "--wait-replicas" in bad.stderr


def test_a_relay_without_durability_does_not_wait(
    outbox: Outbox, pg_dsn: str, table: str, pair: tuple[EmbeddedRedis, EmbeddedRedis]
) -> None:
    master, replica = pair
    assert replica._proc is not None
    os.kill(replica._proc.pid, signal.SIGSTOP)
    offer_committed(outbox, pg_dsn, 2)
    with Relay(pg_dsn, master.url, table=table):
        wait_drained(pg_dsn, table)


def test_rows_over_max_payload_bytes_go_dead_unread(
    pg_dsn: str, table: str, prefix: str, orders: DelayQueue, redis_url: str
) -> None:
    big = Outbox(
        pg_dsn,
        table=table,
        prefix=prefix,
        queues={"orders": QueueFormat(max_payload_bytes=4 << 20)},
    )
    big.install()
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        big.offer(conn, "orders", "x" * (2 << 20), 60)  # fits the producer's cap, not the relay's
        small = big.offer(conn, "orders", "y" * 300, 60)
        fine = big.offer(conn, "orders", "z", 60)
    relay = Relay(
        pg_dsn, redis_url, table=table, queues={"orders": QueueFormat(max_payload_bytes=200)}
    )
    with relay:
        wait_drained(pg_dsn, table)
    dead = [r for r in rows(pg_dsn, table) if r[3] == "dead"]
    assert len(dead) == 2
    assert all("over max_payload_bytes (200)" in r[4] for r in dead)
    assert live_ids(orders, redis_url) == {fine}
    assert small not in live_ids(orders, redis_url)


def test_rows_with_out_of_range_options_go_dead(
    outbox: Outbox, orders: DelayQueue, pg_dsn: str, table: str, redis_url: str
) -> None:
    ids = offer_committed(outbox, pg_dsn, 2, ttl=60)
    with psycopg.connect(pg_dsn) as conn:  # a row edited by hand: a ttl of 400 nines
        conn.execute(
            f"UPDATE \"{table}\" SET options = '0|0|' || repeat('9', 400) || '|' "
            "WHERE task_id = %s",
            (ids[0],),
        )
    with Relay(pg_dsn, redis_url, table=table):
        wait_drained(pg_dsn, table)
    (dead,) = [r for r in rows(pg_dsn, table) if r[3] == "dead"]
    assert dead[2] == ids[0] and "out of range" in dead[4]
    assert live_ids(orders, redis_url) == {ids[1]}
    info = orders.get(ids[1])
    assert info is not None and info.expires_at is not None


@pytest.mark.parametrize(
    "bad",
    [
        {"sweep_interval": float("inf")},
        {"sweep_interval": float("nan")},
        {"max_backoff": float("inf")},
        {"receipt_retention": 1},
        {"durability": {"replicas": 1}},
        {"queues": {"orders": "json"}},
    ],
)
def test_relay_settings_that_cannot_work_are_refused(pg_dsn: str, bad: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        Relay(pg_dsn, "redis://127.0.0.1:1/0", **bad)  # type: ignore[arg-type]


def test_readers_show_a_stored_time_out_of_range_instead_of_crashing(
    orders: DelayQueue, redis_url: str, prefix: str
) -> None:
    task_id = orders.offer({"n": 1}, 60, ttl=60)
    with redis.Redis.from_url(redis_url) as client:  # as a ttl of 400 nines once stored
        client.zadd(orders.keys.key("expiry"), {task_id: float("9" * 300)})
    info = orders.get(task_id)
    assert info is not None and info.expires_at is not None and info.expires_at.year == 9999
    assert [t.id for t in orders.tasks("delayed")] == [task_id]
    shown = delayq("get", "orders", task_id, "--redis", redis_url, "--prefix", prefix)
    assert shown.returncode == 0, shown.stderr
    assert "Traceback" not in shown.stderr
