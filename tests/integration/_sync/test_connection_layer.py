# Generated from _async/test_connection_layer.py by scripts/unasync.py: do not edit.
"""The connection layer of each front end against real servers: the default URL, and a
cluster URL (every node, wake-ups by sharded pub/sub). (tests/integration/
test_connection_layer.py has the rest.)"""

from __future__ import annotations

import time

import pytest

from delayq import DelayQueue
from delayq.embedded import EmbeddedCluster, EmbeddedRedis
from tests.cluster_support import NAMES, classic_subscribers, cluster_url, shard_subscribers

from .flavor import eventually

pytest_plugins = ["tests.cluster_support"]


def test_library_default_url_is_redis_url(
    monkeypatch: pytest.MonkeyPatch, redis_server: EmbeddedRedis, prefix: str
) -> None:
    monkeypatch.setenv("REDIS_URL", redis_server.url)
    with DelayQueue("env", prefix=prefix) as q:
        task_id = q.offer("from the environment", delay=0)
        task = q.poll(timeout=5)
        assert task is not None and task.id == task_id
        task.ack()


def test_cluster_url_full_lifecycle_on_every_node(cluster: EmbeddedCluster, prefix: str) -> None:
    url = cluster_url(cluster)
    for name in NAMES:
        with DelayQueue(name, url, prefix=prefix, visibility_timeout=5) as q:
            first = q.offer({"queue": name}, delay=0.2, key="once")
            assert q.offer({"queue": name}, delay=0.2, key="once") == first
            ids = q.offer_many([(n, 60) for n in range(2500)])  # several chunks, one node
            assert len(set(ids)) == 2500
            task = q.poll(timeout=5)
            assert task is not None and task.id == first
            task.ack()
            stats = q.stats()
            assert (stats.delayed, stats.inflight, stats.counters["acked"]) == (2500, 0, 1)


def test_cluster_wakeups_use_sharded_pubsub(cluster: EmbeddedCluster, prefix: str) -> None:
    """A consumer waiting on a cluster queue is woken by a shard channel on one node (a
    PUBLISH would cost every node), long before its safety interval."""
    url = cluster_url(cluster)
    with (
        DelayQueue("mail", url, prefix=prefix, safety_interval=30) as consumer,
        DelayQueue("mail", url, prefix=prefix) as producer,
    ):
        assert consumer.keys.channel.endswith(":sevents")
        assert consumer.poll(timeout=0) is None
        eventually(lambda: shard_subscribers(cluster, consumer.keys.channel) == 1)
        assert classic_subscribers(cluster, consumer.keys.channel) == 0
        started = time.monotonic()
        producer.offer("soon", delay=0.3)
        task = consumer.poll(timeout=20)
        assert task is not None and task.payload == "soon"
        assert time.monotonic() - started < 5  # woken by the message, not the 30 s interval
        task.ack()
