# Generated from _async/test_cluster.py by scripts/unasync.py: do not edit.
"""Queues of each front end on a real Redis Cluster, given a cluster client: every node,
and bulk offers spanning chunks. (tests/integration/test_cluster.py has the rest.)"""

from __future__ import annotations

import time

from redis.cluster import RedisCluster

from delayq import DelayQueue
from delayq.embedded import EmbeddedCluster
from tests.cluster_support import NAMES

pytest_plugins = ["tests.cluster_support"]


def test_full_lifecycle_on_every_node(cluster: EmbeddedCluster, prefix: str) -> None:
    client = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    try:
        for name in NAMES:
            q = DelayQueue(name, client, prefix=prefix, visibility_timeout=5)
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
    finally:
        client.close()


def test_bulk_offers_spanning_chunks_on_a_cluster(cluster: EmbeddedCluster, prefix: str) -> None:
    client = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    q = DelayQueue("bulk", client, prefix=prefix)
    try:
        n = 2_500  # three chunks: the later ones go pipelined where the client allows it
        ids = q.offer_many([(i, 60) for i in range(n)])
        assert len(set(ids)) == n and (q.stats()).delayed == n
        info = q.get(ids[-1])
        assert info is not None and info.payload == n - 1
    finally:
        q.close()
        client.close()
