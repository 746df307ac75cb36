"""The connection layer of each front end against real servers: the default URL, and a
cluster URL (every node, wake-ups by sharded pub/sub). (tests/integration/
test_connection_layer.py has the rest.)"""

from __future__ import annotations

import time

import pytest

from delayq import AsyncDelayQueue
from delayq.embedded import EmbeddedCluster, EmbeddedRedis
from tests.cluster_support import NAMES, classic_subscribers, cluster_url, shard_subscribers

from .flavor import eventually

pytest_plugins = ["tests.cluster_support"]


async def test_library_default_url_is_redis_url(
    monkeypatch: pytest.MonkeyPatch, redis_server: EmbeddedRedis, prefix: str
) -> None:
    monkeypatch.setenv("REDIS_URL", redis_server.url)
    async with AsyncDelayQueue("env", prefix=prefix) as q:
        task_id = await q.offer("from the environment", delay=0)
        task = await q.poll(timeout=5)
        assert task is not None and task.id == task_id
        await task.ack()


async def test_cluster_url_full_lifecycle_on_every_node(
    cluster: EmbeddedCluster, prefix: str
) -> None:
    url = cluster_url(cluster)
    for name in NAMES:
        async with AsyncDelayQueue(name, url, prefix=prefix, visibility_timeout=5) as q:
            first = await q.offer({"queue": name}, delay=0.2, key="once")
            assert await q.offer({"queue": name}, delay=0.2, key="once") == first
            ids = await q.offer_many([(n, 60) for n in range(2500)])  # several chunks, one node
            assert len(set(ids)) == 2500
            task = await q.poll(timeout=5)
            assert task is not None and task.id == first
            await task.ack()
            stats = await q.stats()
            assert (stats.delayed, stats.inflight, stats.counters["acked"]) == (2500, 0, 1)


async def test_cluster_wakeups_use_sharded_pubsub(cluster: EmbeddedCluster, prefix: str) -> None:
    """A consumer waiting on a cluster queue is woken by a shard channel on one node (a
    PUBLISH would cost every node), long before its safety interval."""
    url = cluster_url(cluster)
    async with (
        AsyncDelayQueue("mail", url, prefix=prefix, safety_interval=30) as consumer,
        AsyncDelayQueue("mail", url, prefix=prefix) as producer,
    ):
        assert consumer.keys.channel.endswith(":sevents")
        assert await consumer.poll(timeout=0) is None
        await eventually(lambda: shard_subscribers(cluster, consumer.keys.channel) == 1)
        assert classic_subscribers(cluster, consumer.keys.channel) == 0
        started = time.monotonic()
        await producer.offer("soon", delay=0.3)
        task = await consumer.poll(timeout=20)
        assert task is not None and task.payload == "soon"
        assert time.monotonic() - started < 5  # woken by the message, not the 30 s interval
        await task.ack()
