"""The wake-up layer while a handle's pub/sub connection cannot get through: a start that
gives up waiting for its channel, the starts after it, and a queue closed meanwhile.

Each test runs on a private server whose ``maxclients`` it lowers so that the pub/sub
connection, once killed, stays out (the runner's connections, already open, stay in).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator

import redis

import delayq
from delayq import AsyncDelayQueue, DelayQueue, QueueClosed
from delayq.embedded import EmbeddedRedis

from ._async.flavor import eventually

pytest_plugins = ["tests.faults_support"]  # own_server7: a private server


@contextlib.contextmanager
def pubsub_shut_out(admin: redis.Redis) -> Iterator[None]:
    """Kill every pub/sub connection and let no new connection in, until the block ends."""
    maxclients = admin.config_get("maxclients")["maxclients"]
    admin.config_set("maxclients", len(admin.client_list()) - pubsub_connections(admin))
    admin.client_kill_filter(_type="pubsub")
    try:
        yield
    finally:
        admin.config_set("maxclients", maxclients)


def pubsub_connections(admin: redis.Redis) -> int:
    return len(admin.client_list(_type="pubsub"))


def script_calls(admin: redis.Redis) -> int:
    return int(admin.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


async def test_a_channel_first_live_after_its_start_gave_up_wakes_its_consumer(
    own_server7: EmbeddedRedis, prefix: str
) -> None:
    """b's first start gives up waiting (its channel cannot go live), b looks at Redis and
    sleeps for its safety interval; an offer is then announced on a channel nobody carries.
    When the channel goes live at last, b must look again, not sleep on."""
    url = own_server7.url
    admin = redis.Redis.from_url(url)
    async with (
        delayq.aconnect(url, prefix=prefix) as conn,
        AsyncDelayQueue("b", url, prefix=prefix) as producer,
    ):
        listening = conn.queue("a")
        b = conn.queue("b", safety_interval=60)
        await producer.offer("later", delay=3600)  # the producer's connection is open
        await listening.poll(timeout=0.1)  # the handle's pub/sub connection, on a's channel
        await b.stats()  # the runner's connections are open, b's layout read
        consumer = None
        try:
            with pubsub_shut_out(admin):
                looks = script_calls(admin)
                consumer = asyncio.ensure_future(b.poll(timeout=40))
                # b's first script call is its fetch, after its start gave up: nothing due.
                await eventually(lambda: script_calls(admin) > looks, 15)
                assert pubsub_connections(admin) == 0, "the pub/sub connection got back in"
                offered_at = time.monotonic()
                await producer.offer("now", delay=0)
            done, _ = await asyncio.wait([consumer], timeout=20)
            waited = time.monotonic() - offered_at
            assert done, f"no task {waited:.0f} s after the offer (safety interval 60 s)"
            task = consumer.result()
            assert task is not None and task.payload == "now"
        finally:
            if consumer is not None:
                consumer.cancel()
                await asyncio.gather(consumer, return_exceptions=True)
    admin.close()


async def test_starts_wait_once_while_the_pubsub_connection_is_away(
    own_server7: EmbeddedRedis, prefix: str
) -> None:
    """poll(timeout=0.5) of an 8-shard queue with tasks due: its shards' starts share one
    wait (START_WAIT_S, 1 s), and a later poll does not wait again (was 8 s, every poll)."""
    url = own_server7.url
    admin = redis.Redis.from_url(url)
    async with (
        AsyncDelayQueue("s", url, prefix=prefix, shards=8) as producer,
        delayq.aconnect(url, prefix=prefix) as conn,
    ):
        await producer.offer_many([(n, 0) for n in range(20)])
        await conn.queue("other").poll(timeout=0.1)  # the handle's pub/sub connection
        s = conn.queue("s")
        await s.stats()  # the runner's connections are open
        took = []
        with pubsub_shut_out(admin):
            for _ in range(2):
                started = time.monotonic()
                assert await s.poll(timeout=0.5) is not None
                took.append(time.monotonic() - started)
            assert pubsub_connections(admin) == 0, "the pub/sub connection got back in"
    admin.close()
    assert max(took) < 4, f"poll(timeout=0.5) with tasks due took {took} s"


def test_sync_starts_wait_once_while_the_pubsub_connection_is_away(
    own_server7: EmbeddedRedis, prefix: str
) -> None:
    """The thread front end's starts share one wait too."""
    url = own_server7.url
    admin = redis.Redis.from_url(url)
    with (
        DelayQueue("s", url, prefix=prefix, shards=8) as producer,
        delayq.connect(url, prefix=prefix) as conn,
    ):
        producer.offer_many([(n, 0) for n in range(20)])
        conn.queue("other").poll(timeout=0.1)  # the handle's pub/sub connection
        s = conn.queue("s")
        s.stats()  # the runner's connections are open
        took = []
        with pubsub_shut_out(admin):
            for _ in range(2):
                started = time.monotonic()
                assert s.poll(timeout=0.5) is not None
                took.append(time.monotonic() - started)
            assert pubsub_connections(admin) == 0, "the pub/sub connection got back in"
    admin.close()
    assert max(took) < 4, f"poll(timeout=0.5) with tasks due took {took} s"


async def test_a_queue_closed_while_its_shards_start_stays_unsubscribed(
    own_server7: EmbeddedRedis, prefix: str
) -> None:
    """A 2-shard queue closed while its take() waits for its first shard's channel: the
    second shard's start, which comes after close(), must not subscribe it again."""
    url = own_server7.url
    admin = redis.Redis.from_url(url)
    async with delayq.aconnect(url, prefix=prefix) as conn:
        s = conn.queue("s", shards=2, create=True)
        await s.stats()  # the runner's connections are open, the layout read
        with pubsub_shut_out(admin):
            taking = asyncio.ensure_future(s.take())
            # The first shard's start subscribes (a pub/sub connection that cannot dial)
            # and waits for its channel to go live.
            await eventually(lambda: conn.subscriber.connections == 1, 10)
            await s.close()
            with contextlib.suppress(QueueClosed):
                await asyncio.wait_for(taking, 15)
            assert conn.subscriber.connections == 0, "a channel of the closed queue is kept"
    admin.close()


async def test_a_closed_notifier_does_not_start_again(
    own_server7: EmbeddedRedis, prefix: str
) -> None:
    url = own_server7.url
    admin = redis.Redis.from_url(url)
    async with delayq.aconnect(url, prefix=prefix) as conn:
        notifier = conn.subscriber.notifier(f"{prefix}:{{q}}:events")
        await notifier.start()
        assert pubsub_connections(admin) == 1
        await notifier.close()
        await notifier.start()
        assert conn.subscriber.connections == 0
        await eventually(lambda: pubsub_connections(admin) == 0)
    admin.close()


async def test_a_queue_closed_while_its_layout_is_read_stays_unsubscribed(
    own_server7: EmbeddedRedis, prefix: str
) -> None:
    """close() while a take() still reads the queue's layout (no shard made yet): the take
    raises QueueClosed, and makes no shard whose channel would stay on the handle."""
    url = own_server7.url
    admin = redis.Redis.from_url(url)
    async with delayq.aconnect(url, prefix=prefix) as conn:
        b = conn.queue("b", create=True)
        await b.poll(timeout=0.1)  # b listens on the handle
        a = conn.queue("a")
        taking = asyncio.ensure_future(a.take())
        await asyncio.sleep(0)  # one turn of the loop: the take has sent its layout read
        await a.close()
        with contextlib.suppress(QueueClosed):
            await asyncio.wait_for(taking, 5)
        await b.close()  # every queue of the handle closed, the handle still open
        await eventually(lambda: conn.subscriber.connections == 0, 10)
        await eventually(lambda: not admin.pubsub_channels(f"{prefix}*"), 10)
    admin.close()
