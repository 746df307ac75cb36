"""delayq.connect() / delayq.aconnect(): one handle per Redis, against real servers.

A handle's queues share its runner (one pool per node) and its subscriber (one pub/sub
connection per node for every channel), across a restart of the server too; it reads the
registry and the stats of many queues in one round; the outbox relay feeds all its queues
through one; closing it closes its queues; and an outage is logged once when it starts and
once when it ends, however many calls and queues fail meanwhile.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import redis

import delayq
from delayq import (
    AsyncDelayQueue,
    ConfigError,
    DelayQueue,
    Durability,
    QueueClosed,
    RedisUnavailable,
    Worker,
)
from delayq.embedded import EmbeddedRedis
from delayq.outbox import AsyncRelay, Outbox
from tests.helpers import wait_until

pytest_plugins = ["tests.faults_support", "tests.outbox_support"]


def client_name() -> str:
    return f"delayq-handle-{uuid.uuid4().hex[:8]}"  # this test's connections, among others


def clients(admin: redis.Redis, name: str, kind: str = "normal") -> list[dict[str, Any]]:
    """The connections named ``name`` (CLIENT LIST TYPE normal / pubsub)."""
    return [c for c in admin.client_list(_type=kind) if c["name"] == name]


@pytest.fixture
def admin(redis7_server: EmbeddedRedis) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(redis7_server.url) as client:
        yield client


# -- one runner, one pool --------------------------------------------------------------------


def test_the_queues_of_a_handle_share_its_runner_and_one_connection(
    redis7_server: EmbeddedRedis, admin: redis.Redis, prefix: str
) -> None:
    name = client_name()
    with delayq.connect(redis7_server.url, prefix=prefix, client_name=name) as conn:
        plain, sharded = conn.queue("plain"), conn.queue("sharded", shards=8)
        built = DelayQueue("built", conn, prefix=prefix)  # the constructor takes a handle too
        again = conn.queue("plain")
        assert again is not plain  # not cached: each caller closes its own
        for q in (plain, sharded, built, again):
            assert q._runner is conn.runner
            q.offer_many([(n, 0) for n in range(5)])
        assert sharded.shards == 8
        for q in (plain, sharded, built):
            task = q.poll(timeout=5)
            assert task is not None
            task.ack()
        # Three queues and ten shards, one call after the other: one pool, holding the
        # connection the runner keeps for scripts and one for plain commands.
        assert len(clients(admin, name)) <= 2
        again.close()  # closing one queue leaves the handle and the others open
        assert plain.stats().total == 9  # 10 offered on the two objects of "plain", 1 acked
    wait_until(lambda: not clients(admin, name, "normal") and not clients(admin, name, "pubsub"))


async def test_the_queues_of_an_async_handle_share_its_runner(
    redis7_server: EmbeddedRedis, admin: redis.Redis, prefix: str
) -> None:
    name = client_name()
    async with delayq.aconnect(redis7_server.url, prefix=prefix, client_name=name) as conn:
        a, b = conn.queue("a"), AsyncDelayQueue("b", conn, prefix=prefix, shards=4)
        assert a._runner is b._runner is conn.runner
        await a.offer("x", delay=0)
        await b.offer_many([(n, 0) for n in range(8)])
        assert (await a.take()).payload == "x"
        assert (await b.poll(timeout=5)) is not None
        assert conn.subscriber.connections == 1  # a's and b's 5 channels on one connection
        assert len(clients(admin, name, "pubsub")) == 1
        assert [s.ready for s in await conn.stats(["a", "b"])] == [0, 7]
    wait_until(lambda: not clients(admin, name, "normal") and not clients(admin, name, "pubsub"))


# -- one pub/sub connection, across a restart ------------------------------------------------


def test_a_worker_on_three_sharded_queues_of_one_handle_holds_one_pubsub_connection(
    own_server7: EmbeddedRedis, prefix: str
) -> None:
    """24 channels (3 queues x 8 shards) over one pub/sub connection, before and after the
    server is stopped and started again on the same port."""
    name = client_name()
    admin = redis.Redis.from_url(own_server7.url)
    done: Counter[str] = Counter()
    lock = threading.Lock()

    def handle(task: Any) -> None:
        with lock:
            done.update([task.queue.name])

    def one_pubsub_connection_on_every_channel() -> bool:
        found = clients(admin, name, "pubsub")
        return len(found) == 1 and int(found[0]["sub"]) == 24

    try:
        with delayq.connect(own_server7.url, prefix=prefix, client_name=name) as conn:
            queues = [conn.queue(f"q{i}", shards=8, safety_interval=30) for i in range(3)]
            for q in queues:
                q.offer_many([(n, 0) for n in range(10)])
            with Worker(queues, handle).start_background():
                wait_until(lambda: sum(done.values()) == 30, timeout=20)
                wait_until(one_pubsub_connection_on_every_channel, timeout=10)
                assert conn.subscriber.connections == 1

                own_server7.terminate()  # stopped, then started on the same port and data
                own_server7.start()
                wait_until(one_pubsub_connection_on_every_channel, timeout=20)
                for q in queues:
                    q.offer_many([(n, 0.2) for n in range(10)])
                wait_until(lambda: sum(done.values()) == 60, timeout=30)
                assert one_pubsub_connection_on_every_channel()
                assert conn.subscriber.connections == 1
        assert done == Counter({"q0": 20, "q1": 20, "q2": 20})
        wait_until(lambda: not clients(admin, name, "pubsub"), timeout=5)
    finally:
        admin.close()


# -- the registry ----------------------------------------------------------------------------


def test_queues_and_stats_read_the_registry_in_one_round(
    redis7_server: EmbeddedRedis, admin: redis.Redis, prefix: str
) -> None:
    with delayq.connect(redis7_server.url, prefix=prefix) as conn:
        assert conn.queues() == [] and conn.stats() == []
        for i, shards in enumerate((None, 4, None, 2)):
            q = conn.queue(f"q{3 - i}", shards=shards)
            q.offer_many([(n, 60) for n in range(i + 1)])
        admin.sadd(f"{prefix}:queues", "not a name!")  # something else wrote it
        assert conn.queues() == ["q0", "q1", "q2", "q3"]
        assert conn.is_registered("q2") and not conn.is_registered("q9")
        registry = conn.registry()
        assert registry.invalid == ("not a name!",)
        assert registry.shard_counts() == {"q2": 4, "q0": 2}
        assert b"not a name!" in registry.members

        rounds: list[int] = []
        runner = conn.runner
        original = runner._many

        def counting(calls: Any) -> Any:
            rounds.append(len(calls))
            return original(calls)

        runner._many = counting  # type: ignore[method-assign]
        try:
            every = conn.stats()
            some = conn.stats(["q2", "q3"], overdue_after=5)
        finally:
            del runner._many  # type: ignore[attr-defined]
        assert rounds == [1 + 4 + 1 + 2, 4 + 1]  # every shard of every queue, in one call each
        assert [(s.queue, s.delayed) for s in every] == [("q0", 4), ("q1", 3), ("q2", 2), ("q3", 1)]
        assert [s.queue for s in some] == ["q2", "q3"]
        assert len(every[2].shards) == 4 and every[1].shards == ()
        for stats in every:
            assert stats.delayed == conn.queue(stats.queue).stats().delayed
        with pytest.raises(ConfigError):
            conn.stats(["bad name!"])
        with pytest.raises(ConfigError, match="list of queue names"):
            conn.stats("q0")


# -- the outbox relay ------------------------------------------------------------------------


async def test_the_relay_feeds_many_queues_through_one_pool(
    redis7_server: EmbeddedRedis, admin: redis.Redis, pg_dsn: str, table: str, prefix: str
) -> None:
    """Rows for six queues under two prefixes: one handle, one runner, one connection."""
    other = f"{prefix}x"
    boxes = [Outbox(pg_dsn, table=table, prefix=p) for p in (prefix, other)]
    boxes[0].install()
    with psycopg.connect(pg_dsn) as db, db.transaction():
        for box in boxes:
            for i in range(3):
                box.offer(db, f"q{i}", {"i": i}, 60)
    async with AsyncRelay(pg_dsn, redis7_server.url, table=table) as relay:
        assert await relay.relay_pending() == 6
        queues = list(relay._queues.values())
        assert len(queues) == 6
        assert len({id(q._runner) for q in queues}) == 1
        assert relay._conn is not None and queues[0]._runner is relay._conn.runner
        assert len(clients(admin, "delayq-relay")) <= 2  # one pool (was one per queue)
    assert relay._conn is None  # closed with the relay
    wait_until(lambda: not clients(admin, "delayq-relay"))
    for p in (prefix, other):
        with delayq.connect(redis7_server.url, prefix=p) as conn:
            assert [s.delayed for s in conn.stats()] == [1, 1, 1]


async def test_a_relay_given_a_handle_shares_it_and_leaves_it_open(
    redis7_server: EmbeddedRedis, pg_dsn: str, table: str, prefix: str
) -> None:
    box = Outbox(pg_dsn, table=table, prefix=prefix)
    box.install()
    with psycopg.connect(pg_dsn) as db, db.transaction():
        box.offer(db, "orders", {"n": 1}, 60)
    async with delayq.aconnect(redis7_server.url, prefix=prefix) as conn:
        with pytest.raises(ConfigError, match="reconnect_timeout"):
            AsyncRelay(pg_dsn, conn, table=table, reconnect_timeout=conn.reconnect_timeout + 1)
        async with AsyncRelay(pg_dsn, conn, table=table) as relay:
            assert await relay.relay_pending() == 1
            assert relay._queues[(prefix, "orders")]._runner is conn.runner
        assert not conn.closed
        assert [s.delayed for s in await conn.stats(["orders"])] == [1]


# -- closing ---------------------------------------------------------------------------------


def test_closing_the_handle_closes_its_queues(
    redis7_server: EmbeddedRedis, admin: redis.Redis, prefix: str
) -> None:
    name = client_name()
    conn = delayq.connect(redis7_server.url, prefix=prefix, client_name=name)
    opened, built = conn.queue("opened"), DelayQueue("built", conn, prefix=prefix)
    view = opened.with_policy(max_attempts=2)
    for q in (opened, built):
        q.offer("x", 0)
    assert opened.poll(timeout=5) is not None  # its listener subscribed
    conn.close()
    conn.close()  # twice is fine
    assert conn.closed
    for call in (opened.stats, built.stats, view.stats, lambda: opened.offer("y")):
        with pytest.raises(QueueClosed):
            call()
    with pytest.raises(QueueClosed):
        conn.queue("later")
    with pytest.raises(QueueClosed):
        conn.queues()
    wait_until(lambda: not clients(admin, name, "normal") and not clients(admin, name, "pubsub"))


async def test_closing_an_async_handle_leaves_a_client_passed_in_open(
    redis7_server: EmbeddedRedis, prefix: str
) -> None:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(redis7_server.url)
    try:
        async with delayq.aconnect(client, prefix=prefix) as conn:
            q = conn.queue("mine")
            await q.offer("x", delay=60)
        with pytest.raises(QueueClosed):
            await q.stats()
        assert await client.zcard(q.keys.key("delayed")) == 1  # the client still works
    finally:
        await client.aclose()


def channels_of(admin: redis.Redis, prefix: str) -> list[bytes]:
    return list(admin.pubsub_channels(f"{prefix}:*"))


def test_a_queue_dropped_unclosed_leaves_the_handles_pubsub_connection(
    redis7_server: EmbeddedRedis, admin: redis.Redis, prefix: str
) -> None:
    """A queue dropped without close() (one per request, say) costs nothing once collected:
    its channel is unsubscribed at the handle's next opening or closing of a queue (or the
    pub/sub connection's next PING). Before, every one stayed subscribed for the handle's
    life."""
    with delayq.connect(redis7_server.url, prefix=prefix) as conn:
        for i in range(20):
            q = conn.queue(f"q{i}")
            assert q.poll(timeout=0.01) is None  # listening
            del q
        gc.collect()
        kept = conn.queue("kept")
        assert kept.poll(timeout=0.01) is None
        wait_until(lambda: len(channels_of(admin, prefix)) == 1, timeout=5)
        assert conn.subscriber.connections == 1


async def test_an_async_queue_dropped_unclosed_leaves_the_handles_pubsub_connection(
    redis7_server: EmbeddedRedis, admin: redis.Redis, prefix: str
) -> None:
    async with delayq.aconnect(redis7_server.url, prefix=prefix) as conn:
        for i in range(20):
            q = conn.queue(f"q{i}")
            assert await q.poll(timeout=0.01) is None
            del q
        gc.collect()
        kept = conn.queue("kept")
        assert await kept.poll(timeout=0.01) is None
        for _ in range(100):
            if len(await asyncio.to_thread(channels_of, admin, prefix)) == 1:
                break
            await asyncio.sleep(0.05)
        assert len(channels_of(admin, prefix)) == 1


def test_closing_a_handle_on_a_client_passed_in_ends_its_queues_subscriptions(
    redis7_server: EmbeddedRedis, admin: redis.Redis, prefix: str
) -> None:
    """Every queue built on the handle closes with it, also ``DelayQueue(name, conn)``: the
    handle of a client passed in leaves the client open, and that queue's channel kept the
    client's pub/sub connection (and its listener thread) alive, redialling for ever."""
    name = client_name()
    client = redis.Redis.from_url(redis7_server.url, client_name=name)
    try:
        conn = delayq.connect(client, prefix=prefix)
        opened, built = conn.queue("opened"), DelayQueue("built", conn, prefix=prefix)
        assert opened.poll(timeout=0.01) is None and built.poll(timeout=0.01) is None
        assert len(clients(admin, name, "pubsub")) == 1
        conn.close()
        with pytest.raises(QueueClosed):
            built.stats()
        wait_until(lambda: not clients(admin, name, "pubsub"), timeout=5)
        assert client.ping()  # left open
    finally:
        client.close()


def test_what_a_handle_refuses() -> None:
    url = "redis://127.0.0.1:1/0"  # nothing is sent: these fail before any call
    with delayq.connect(url, reconnect_timeout=2) as conn:
        with pytest.raises(ConfigError, match="differs from the connection handle"):
            conn.queue("q", reconnect_timeout=5)
        assert conn.queue("q", reconnect_timeout=2)._runner is conn.runner  # the same: fine
        with pytest.raises(ConfigError, match="outlasts the socket timeout"):
            conn.queue("q", durability=Durability(replicas=1, timeout=30))
        assert conn.queue("q", durability=Durability(replicas=1, timeout=0.5))
        with pytest.raises(ConfigError, match="already a connection handle"):
            delayq.connect(conn)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="prefix"):
        delayq.connect(url, prefix="bad prefix")
    with pytest.raises(ConfigError, match="reconnect_timeout"):
        delayq.connect(url, reconnect_timeout=-1)


# -- the log policy --------------------------------------------------------------------------


def outage_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    """The connection layer's lines about Redis (the ``delayq`` logger's own)."""
    return [
        (r.levelno, r.getMessage())
        for r in caplog.records
        if r.name == "delayq" and "Redis" in r.getMessage()
    ]


def test_an_outage_logs_one_warning_when_it_starts_and_one_line_when_it_ends(
    own_server7: EmbeddedRedis, caplog: pytest.LogCaptureFixture, prefix: str
) -> None:
    caplog.set_level(logging.INFO, logger="delayq")
    assert logging.getLogger("delayq").filters == []  # nothing installed at import
    with delayq.connect(own_server7.url, prefix=prefix, reconnect_timeout=0.5) as conn:
        queues = [conn.queue(f"q{i}") for i in range(3)]
        for q in queues:
            q.offer("before", 60)
        assert outage_lines(caplog) == []

        own_server7.terminate()
        failed: list[BaseException] = []

        def call(q: DelayQueue) -> None:
            for _ in range(3):
                try:
                    q.offer("during", 60)
                except RedisUnavailable as exc:
                    failed.append(exc)

        threads = [threading.Thread(target=call, args=(q,)) for q in queues]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert len(failed) == 9  # every call of every queue failed, in three threads
        lines = outage_lines(caplog)
        assert [level for level, _ in lines] == [logging.WARNING], lines
        assert f"Redis at {own_server7.url} unavailable" in lines[0][1]

        own_server7.start()
        for q in queues:
            assert q.stats().delayed == 1  # the AOF kept them
        lines = outage_lines(caplog)
        assert [level for level, _ in lines] == [logging.WARNING, logging.INFO], lines
        assert "available again after" in lines[1][1] and "failed tries" in lines[1][1]

        own_server7.terminate()  # a second outage is a new one: logged again, once
        with pytest.raises(RedisUnavailable):
            queues[0].stats()
        with pytest.raises(RedisUnavailable):
            queues[1].stats()
        own_server7.start()
        queues[2].stats()
        levels = [level for level, _ in outage_lines(caplog)]
        assert levels == [logging.WARNING, logging.INFO] * 2
