"""Queues on a real Redis Cluster: every script touches one slot, wake-ups cross nodes."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster, key_slot

from delayq import AsyncDelayQueue, DelayQueue
from delayq.embedded import EmbeddedCluster

from ..conftest import BINARIES


@pytest.fixture(scope="module")
def cluster() -> Iterator[EmbeddedCluster]:
    c = EmbeddedCluster(3, BINARIES[0][1]).start()
    yield c
    c.stop()


@pytest.fixture
def cluster_client(cluster: EmbeddedCluster) -> Iterator[RedisCluster]:
    client = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    yield client
    client.close()


NAMES = ["orders", "stock", "mail", "receipts", "reminders"]


def test_queues_spread_over_nodes_and_keep_one_slot(
    cluster_client: RedisCluster, prefix: str
) -> None:
    nodes = set()
    for name in NAMES:
        q = DelayQueue(name, cluster_client, prefix=prefix)
        assert len({key_slot(k.encode()) for k in q.keys.all}) == 1
        nodes.add(cluster_client.get_node_from_key(q.keys.all[0]).name)
        q.close()
    assert len(nodes) >= 2, "test names should land on several nodes"


def test_full_lifecycle_on_every_node(cluster_client: RedisCluster, prefix: str) -> None:
    for name in NAMES:
        q = DelayQueue(name, cluster_client, prefix=prefix, visibility_timeout=5)
        first = q.offer({"queue": name}, delay=0.3, key="once")
        assert q.offer({"queue": name}, delay=0.3, key="once") == first
        doomed = q.offer("cancel me", delay=60)
        assert q.cancel(doomed)
        started = time.monotonic()
        task = q.poll(timeout=5)
        assert task is not None and task.id == first and task.payload == {"queue": name}
        assert task.delivered_ms >= task.due_ms
        assert time.monotonic() - started < 3
        task.ack()
        stats = q.stats()
        assert (stats.delayed, stats.ready, stats.inflight, stats.dead) == (0, 0, 0, 0)
        assert stats.counters["acked"] == 1 and stats.counters["cancelled"] == 1
        q.close()


async def test_async_queue_on_cluster(cluster: EmbeddedCluster, prefix: str) -> None:
    client = AsyncRedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    q = AsyncDelayQueue("orders", client, prefix=prefix)
    try:
        task_id = await q.offer({"n": 1}, delay=0.2)
        task = await q.poll(timeout=5)
        assert task is not None and task.id == task_id
        await task.ack()
        assert (await q.stats()).inflight == 0
    finally:
        await q.close()
        await client.aclose()


def test_bulk_offers_spanning_chunks_on_a_cluster(
    cluster_client: RedisCluster, cluster: EmbeddedCluster, prefix: str
) -> None:
    q = DelayQueue("bulk", cluster_client, prefix=prefix)
    n = 2_500  # three chunks: the later ones go pipelined where the client allows it
    ids = q.offer_many([(i, 60) for i in range(n)])
    assert len(set(ids)) == n and q.stats().delayed == n
    info = q.get(ids[-1])
    assert info is not None and info.payload == n - 1


async def test_async_bulk_offers_spanning_chunks_on_a_cluster(
    cluster: EmbeddedCluster, prefix: str
) -> None:
    client = AsyncRedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    q = AsyncDelayQueue("bulk-async", client, prefix=prefix)
    try:
        ids = await q.offer_many([(i, 60) for i in range(2_500)])
        assert len(set(ids)) == 2_500 and (await q.stats()).delayed == 2_500
    finally:
        await q.close()
        await client.aclose()
