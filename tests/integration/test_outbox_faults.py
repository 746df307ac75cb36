"""The relay under faults: killed mid-batch, several at once, Redis frozen or crashed, the
database cut or away, notifications lost, rows nobody can apply. Every scenario ends with
0 lost, 0 duplicated and 0 ghost tasks: the queue holds exactly the committed ids, and its
``offered`` counter (tasks created, not resends matched) equals their number."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
import redis

from delayq import DelayQueue, TaskState
from delayq.embedded import EmbeddedRedis
from delayq.outbox import Outbox, Relay
from tests.helpers import busy_script, wait_until
from tests.outbox_support import (
    TcpProxy,
    backend_pids,
    db_now,
    live_ids,
    offer_committed,
    offered_count,
    pending,
    relay_process,
    resume_redis,
    rows,
    stop_redis,
    terminate_backends,
    wait_drained,
)

pytest_plugins = ["tests.outbox_support"]


@pytest.fixture
def redis_server(redis7_server: EmbeddedRedis) -> EmbeddedRedis:
    return redis7_server


@pytest.fixture
def own_redis() -> Iterator[EmbeddedRedis]:
    """A server of this test alone: the test stops or kills it."""
    with EmbeddedRedis(aof=True) as server:
        yield server


def started(relay: Relay) -> Relay:
    relay.start()
    assert relay.wait_connected(10)
    return relay


def waiting_on_lock(dsn: str, application_name: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
            "AND wait_event_type = 'Lock'",
            (application_name,),
        ).fetchone()
        return bool(row and row[0])


def exact(queue: DelayQueue, url: str, ids: list[str], already: int = 0) -> None:
    """The queue holds exactly ``ids``, each created once."""
    assert len(set(ids)) == len(ids)
    assert live_ids(queue, url) == set(ids)
    assert offered_count(queue) == already + len(ids)


def test_relay_sigkilled_mid_batch_then_restarted(
    outbox: Outbox, orders: DelayQueue, pg_dsn: str, table: str, redis_url: str
) -> None:
    ids = offer_committed(outbox, pg_dsn, 300)
    # A SHARE lock lets the relay claim rows and offer them, and makes its DELETE wait. The
    # relay is then killed and its session ended before the DELETE and COMMIT it sent could
    # run: from the database's side, it died between Redis's reply and its commit.
    with psycopg.connect(pg_dsn) as blocker:
        blocker.execute(f'LOCK TABLE "{table}" IN SHARE MODE')
        with relay_process(pg_dsn, redis_url, table, "--batch-size", "100", name="kill-me") as proc:
            wait_until(lambda: len(live_ids(orders, redis_url)) == 100)
            wait_until(lambda: waiting_on_lock(pg_dsn, "kill-me"))
            proc.kill()
            proc.wait(10)
            assert terminate_backends(pg_dsn, "kill-me") >= 1  # the one waiting on the lock
        blocker.rollback()
    assert pending(pg_dsn, table) == 300  # the killed batch committed nothing
    with relay_process(pg_dsn, redis_url, table, "--batch-size", "100"):
        wait_drained(pg_dsn, table)
    exact(orders, redis_url, ids)  # the 100 offered again matched the tasks already there


def test_relay_killed_repeatedly_under_load(
    outbox: Outbox, orders: DelayQueue, pg_dsn: str, table: str, redis_url: str
) -> None:
    ids: list[str] = []
    done = threading.Event()

    def produce() -> None:
        for _ in range(100):
            ids.extend(offer_committed(outbox, pg_dsn, 20))
        done.set()

    producer = threading.Thread(target=produce)
    producer.start()
    rng = random.Random(7)
    kills = 0
    while not done.is_set() and kills < 6:
        with relay_process(pg_dsn, redis_url, table, "--batch-size", "50") as proc:
            time.sleep(rng.uniform(0.05, 0.4))  # a random point of its work: not a wait
            proc.kill()
            kills += 1
    producer.join()
    with relay_process(pg_dsn, redis_url, table):
        wait_drained(pg_dsn, table)
    assert kills >= 1
    exact(orders, redis_url, ids)


@pytest.mark.parametrize("relays", [2, 3])
def test_relays_at_once_handle_each_row_once(
    outbox: Outbox, orders: DelayQueue, pg_dsn: str, table: str, redis_url: str, relays: int
) -> None:
    running = [
        started(Relay(pg_dsn, redis_url, table=table, batch_size=25, name=f"r{i}"))
        for i in range(relays)
    ]
    try:
        ids: list[str] = []
        lock = threading.Lock()

        def produce() -> None:
            for _ in range(60):
                made = offer_committed(outbox, pg_dsn, 10)
                with lock:
                    ids.extend(made)

        producers = [threading.Thread(target=produce) for _ in range(3)]
        for p in producers:
            p.start()
        for p in producers:
            p.join()
        wait_drained(pg_dsn, table)
    finally:
        for relay in running:
            relay.stop()
    assert sum(r.stats.offered for r in running) == len(ids) == 1800  # no row applied twice
    assert sum(1 for r in running if r.stats.offered) >= 2  # they shared the work
    exact(orders, redis_url, ids)


def test_redis_frozen_rows_wait_then_flow(
    outbox: Outbox, own_redis: EmbeddedRedis, pg_dsn: str, table: str
) -> None:
    queue = DelayQueue("orders", own_redis.url, prefix=outbox.prefix)
    relay = started(
        Relay(pg_dsn, own_redis.url, table=table, reconnect_timeout=0.5, max_backoff=0.5)
    )
    try:
        before = offer_committed(outbox, pg_dsn, 5)
        wait_drained(pg_dsn, table)
        stop_redis(own_redis)
        try:
            during = offer_committed(outbox, pg_dsn, 50)
            wait_until(lambda: relay.stats.redis_errors >= 2, 20)
            assert pending(pg_dsn, table) == 50  # nothing deleted while Redis is away
        finally:
            resume_redis(own_redis)
        wait_drained(pg_dsn, table)
        exact(queue, own_redis.url, before + during)
    finally:
        relay.stop()
        queue.close()


@pytest.mark.parametrize("refusal", ["maxmemory", "busy-script"])
def test_redis_refusing_writes_rows_wait_then_flow(
    outbox: Outbox, own_redis: EmbeddedRedis, pg_dsn: str, table: str, refusal: str
) -> None:
    """Before: at ``maxmemory`` (writes refused with OOM, reads answered) the relay's probe
    of the queue went through, so it blamed each row and buried it. The 2-hour Sentinel soak
    lost 27 committed rows so: a relay restarted in a ``maxmemory`` window could not register
    the queue. A refusal that speaks of the server (OOM, BUSY) keeps the rows for later."""
    client = redis.Redis.from_url(own_redis.url)
    relay = started(
        Relay(pg_dsn, own_redis.url, table=table, reconnect_timeout=0.5, max_backoff=0.5)
    )
    try:
        if refusal == "maxmemory":
            client.config_set("maxmemory", 1)
            refused: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        else:
            refused = busy_script(own_redis)
        try:
            with refused:
                ids = offer_committed(outbox, pg_dsn, 20)
                wait_until(lambda: relay.stats.redis_errors >= 2, 20)
                assert pending(pg_dsn, table) == 20  # kept, not buried
                assert relay.stats.dead == 0
        finally:
            client.config_set("maxmemory", 0)
        wait_drained(pg_dsn, table)
        assert outbox.dead() == []
        with DelayQueue("orders", own_redis.url, prefix=outbox.prefix) as queue:
            exact(queue, own_redis.url, ids)
    finally:
        relay.stop()
        client.close()


def test_redis_killed_with_aof_and_restarted(
    outbox: Outbox, own_redis: EmbeddedRedis, pg_dsn: str, table: str
) -> None:
    relay = started(
        Relay(pg_dsn, own_redis.url, table=table, reconnect_timeout=0.5, max_backoff=0.5)
    )
    try:
        before = offer_committed(outbox, pg_dsn, 20)
        wait_drained(pg_dsn, table)
        own_redis.kill()
        during = offer_committed(outbox, pg_dsn, 30)
        wait_until(lambda: relay.stats.redis_errors >= 1, 20)
        assert pending(pg_dsn, table) == 30
        own_redis.start()
        wait_drained(pg_dsn, table)
    finally:
        relay.stop()
    with DelayQueue("orders", own_redis.url, prefix=outbox.prefix) as queue:
        exact(queue, own_redis.url, before + during)  # the AOF kept the first 20


def test_database_sessions_cut(
    outbox: Outbox, orders: DelayQueue, pg_dsn: str, table: str, redis_url: str
) -> None:
    # A sweep an hour away: only LISTEN (re-established after the cut) can wake this relay.
    relay = started(Relay(pg_dsn, redis_url, table=table, sweep_interval=3600, name="cut-me"))
    try:
        first = offer_committed(outbox, pg_dsn, 5)
        wait_drained(pg_dsn, table)
        assert terminate_backends(pg_dsn, "cut-me") == 2
        wait_until(lambda: relay.stats.reconnects >= 1 and len(backend_pids(pg_dsn, "cut-me")) == 2)
        second = offer_committed(outbox, pg_dsn, 5)
        wait_drained(pg_dsn, table, timeout=5)
        exact(orders, redis_url, first + second)
    finally:
        relay.stop()


def test_database_away_then_back(
    outbox: Outbox, orders: DelayQueue, pg_dsn: str, table: str, redis_url: str
) -> None:
    proxy = TcpProxy().up()
    relay = started(Relay(proxy.dsn(pg_dsn), redis_url, table=table, max_backoff=0.3))
    try:
        first = offer_committed(outbox, pg_dsn, 5)
        wait_drained(pg_dsn, table)
        proxy.down()
        errors = relay.stats.database_errors
        second = offer_committed(outbox, pg_dsn, 5)
        wait_until(lambda: relay.stats.database_errors >= errors + 3)  # retried, refused
        assert pending(pg_dsn, table) == 5
        proxy.up()
        wait_drained(pg_dsn, table)
        exact(orders, redis_url, first + second)
    finally:
        relay.stop()
        proxy.down()


def test_rows_committed_before_the_relay_started(
    outbox: Outbox, orders: DelayQueue, pg_dsn: str, table: str, redis_url: str
) -> None:
    ids = offer_committed(outbox, pg_dsn, 7)  # their NOTIFY went to nobody
    relay = started(Relay(pg_dsn, redis_url, table=table, sweep_interval=3600))
    try:
        wait_drained(pg_dsn, table, timeout=5)
        exact(orders, redis_url, ids)
    finally:
        relay.stop()


def test_lost_notification_caught_by_the_sweep(
    outbox: Outbox, orders: DelayQueue, pg_dsn: str, table: str, redis_url: str
) -> None:
    relay = started(Relay(pg_dsn, redis_url, table=table, sweep_interval=0.3))
    try:
        with psycopg.connect(pg_dsn) as conn, conn.transaction():
            # Triggers off for this session: the commit sends no NOTIFY at all.
            conn.execute("SET LOCAL session_replication_role = replica")
            ids = [outbox.offer(conn, "orders", n, 3600) for n in range(3)]
        wait_drained(pg_dsn, table, timeout=5)
        exact(orders, redis_url, ids)
    finally:
        relay.stop()


def test_listen_connection_cut(
    outbox: Outbox, orders: DelayQueue, pg_dsn: str, table: str, redis_url: str
) -> None:
    relay = started(Relay(pg_dsn, redis_url, table=table, sweep_interval=3600, name="lsn"))
    try:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            [listener] = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = 'lsn' "
                "AND query LIKE 'LISTEN%%'"
            ).fetchall()
            conn.execute("SELECT pg_terminate_backend(%s)", (listener[0],))
        ids = offer_committed(outbox, pg_dsn, 4)  # its NOTIFY may reach no listener
        wait_drained(pg_dsn, table, timeout=10)
        exact(orders, redis_url, ids)
        assert relay.stats.reconnects >= 1
    finally:
        relay.stop()


POISON = [
    ("envelope", "'{not json'"),
    ("envelope", "NULL"),
    ("due_kind", "'x'"),
    ("due_ms", "-5"),
    ("options", "'garbage'"),
    ("dedup", "'sometimes'"),
    ("queue", "'bad name!'"),
    ("task_id", "''"),
]


def test_poison_rows_go_dead_and_block_nothing(
    outbox: Outbox, orders: DelayQueue, pg_dsn: str, table: str, redis_url: str
) -> None:
    good = offer_committed(outbox, pg_dsn, 3)
    planted = []
    for column, value in POISON:
        [task_id] = offer_committed(outbox, pg_dsn, 1)
        with psycopg.connect(pg_dsn) as conn:
            conn.execute(f'UPDATE "{table}" SET {column} = {value} WHERE task_id = %s', (task_id,))
        planted.append(task_id)
    good += offer_committed(outbox, pg_dsn, 3)
    relay = started(Relay(pg_dsn, redis_url, table=table, batch_size=4))
    try:
        wait_drained(pg_dsn, table)
        later = offer_committed(outbox, pg_dsn, 2)  # the relay still works
        wait_drained(pg_dsn, table)
    finally:
        relay.stop()
    exact(orders, redis_url, good + later)
    dead = outbox.dead()
    assert len(dead) == len(POISON) == relay.stats.dead
    assert all(row.error for row in dead)
    assert {r[3] for r in rows(pg_dsn, table)} == {"dead"}


def test_due_time_counts_from_the_offer_not_the_relay(
    outbox: Outbox, orders: DelayQueue, pg_dsn: str, table: str, redis_url: str
) -> None:
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        late = outbox.offer(conn, "orders", "late", 0.5)
        later = outbox.offer(conn, "orders", "later", 3.0)
        row = conn.execute(
            f'SELECT extract(epoch FROM created) FROM "{table}" WHERE task_id = %s', (later,)
        ).fetchone()
    assert row is not None
    created = float(row[0])
    wait_until(lambda: db_now(pg_dsn) > created + 1.0)  # the relay runs a second late
    assert Relay(pg_dsn, redis_url, table=table).relay_pending() == 2
    info = orders.get(later)
    assert info is not None
    # The same host's clocks here, so the two servers' times compare directly.
    assert abs(info.due_at.timestamp() - (created + 3.0)) < 0.05
    late_info = orders.get(late)
    assert late_info is not None and late_info.state == TaskState.READY  # overdue: at once


def test_relay_refuses_bad_options(pg_dsn: str) -> None:
    from delayq.exceptions import ConfigError

    for options in (
        {"batch_size": 0},
        {"sweep_interval": 0},
        {"reconnect_timeout": -1},
        {"name": ""},
        {"table": "no spaces"},
    ):
        with pytest.raises(ConfigError):
            Relay(pg_dsn, **options)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="DSN"):
        Relay("")


def test_an_id_held_by_other_content_goes_dead(
    outbox: Outbox, orders: DelayQueue, pg_dsn: str, table: str, redis_url: str
) -> None:
    orders.offer("the original", 3600, id="order-43")
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        outbox.offer(conn, "orders", "another payload", 3600, id="order-43")
        fine = outbox.offer(conn, "orders", "fine", 3600)
    assert Relay(pg_dsn, redis_url, table=table).relay_pending() == 2
    info = orders.get("order-43")
    assert info is not None and info.payload == "the original"  # kept unchanged
    assert orders.get(fine) is not None
    [dead] = outbox.dead()
    assert dead.task_id == "order-43" and dead.error and "TaskIdConflict" in dead.error


def test_three_relay_processes_one_killed_under_load(
    outbox: Outbox, orders: DelayQueue, pg_dsn: str, table: str, redis_url: str
) -> None:
    with contextlib.ExitStack() as stack:
        procs = [
            stack.enter_context(
                relay_process(pg_dsn, redis_url, table, "--batch-size", "20", name=f"p{i}")
            )
            for i in range(3)
        ]
        ids: list[str] = []
        for round_ in range(40):
            ids += offer_committed(outbox, pg_dsn, 25)
            if round_ == 15:
                procs[0].kill()  # wherever it is in its batch
        wait_drained(pg_dsn, table)
    exact(orders, redis_url, ids)
