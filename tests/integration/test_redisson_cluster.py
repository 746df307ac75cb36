"""The Redisson migration on a real Redis Cluster: a delayq queue named like the Redisson
queue shares its slot and batches move atomically; named otherwise it sits in another slot
(on another node, for the names here) and batches move by claims and receipts."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from redis.cluster import RedisCluster, key_slot

from delayq import ConfigError, DelayQueue
from delayq._core.redisson import RedissonKeys
from delayq.embedded import EmbeddedCluster
from delayq.redisson import Migration, RedissonDelayedQueue
from tests.cluster_support import cluster_url
from tests.redisson_emulation import RedissonClient

pytest_plugins = ["tests.cluster_support"]


@pytest.fixture
def cluster_client(cluster: EmbeddedCluster) -> Iterator[RedisCluster]:
    client = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    yield client
    client.close()


def offered(cluster_client: RedisCluster, name: str, count: int) -> RedissonClient:
    java = RedissonClient(cluster_client, name)
    for i in range(count):
        java.offer(b"order-%d" % i, 60_000 + i)
    java.offer(b"due-now", 0)
    java.transfer()  # one value in the ready list too
    return java


def payloads(queue: DelayQueue) -> list[str]:
    """Every task waiting in the queue (the value that was due at once is ready)."""
    states = ("delayed", "ready")
    return sorted(info.payload for state in states for info in queue.tasks(state, limit=1000))


def test_same_name_moves_atomically_in_redissons_slot(
    cluster: EmbeddedCluster, cluster_client: RedisCluster, prefix: str
) -> None:
    name = f"orders-{prefix}"
    offered(cluster_client, name, 150)
    url = cluster_url(cluster)
    with Migration(name, name, url, prefix=prefix, path="atomic") as migration:
        summary = migration.run()
    assert summary.path.startswith("atomic") and summary.counts.moved == 151
    assert summary.after.empty
    with DelayQueue(name, url, prefix=prefix) as queue:
        stats = queue.stats()
        assert stats.delayed + stats.ready == 151
        assert payloads(queue) == sorted([f"order-{i}" for i in range(150)] + ["due-now"])


def test_another_name_moves_by_claims_across_nodes(
    cluster: EmbeddedCluster, cluster_client: RedisCluster, prefix: str
) -> None:
    name, target = f"orders-{prefix}", f"shop-{prefix}"
    for i in range(50):  # a target name on another node than Redisson's keys
        if cluster_client.get_node_from_key(f"{{{target}}}").name != (
            cluster_client.get_node_from_key(RedissonKeys(name).timeouts).name
        ):
            break
        target = f"shop{i}-{prefix}"
    assert key_slot(f"{prefix}:{{{target}}}:delayed".encode()) != key_slot(
        RedissonKeys(name).timeouts.encode()
    )
    offered(cluster_client, name, 150)
    url = cluster_url(cluster)
    with pytest.raises(ConfigError, match="atomic move needs"):
        Migration(name, target, url, prefix=prefix, path="atomic").path()
    with Migration(name, target, url, prefix=prefix) as migration:
        summary = migration.run()
    assert summary.path.startswith("claims") and summary.counts.moved == 151
    assert summary.after.empty and cluster_client.hlen(RedissonKeys(name).claims) == 0
    with DelayQueue(target, url, prefix=prefix) as queue:
        assert payloads(queue) == sorted([f"order-{i}" for i in range(150)] + ["due-now"])


def test_python_offers_on_a_cluster_reach_java(
    cluster: EmbeddedCluster, cluster_client: RedisCluster, prefix: str
) -> None:
    name = f"orders-{prefix}"
    java = RedissonClient(cluster_client, name)
    with RedissonDelayedQueue(name, cluster_url(cluster)) as py:
        py.offer("from-python", 0)
    java.transfer()
    assert java.take(timeout_s=2) == b"from-python"


def test_follow_on_a_cluster_is_woken_by_redissons_channel(
    cluster: EmbeddedCluster, cluster_client: RedisCluster, prefix: str
) -> None:
    name = f"orders-{prefix}"
    java = RedissonClient(cluster_client, name)
    url = cluster_url(cluster)
    done = threading.Event()
    with Migration(name, name, url, prefix=prefix, safety_interval=60) as migration:

        def produce() -> None:
            for i in range(40):
                java.offer(b"live-%d" % i, 60_000)
                time.sleep(0.02)
            done.set()

        producer = threading.Thread(target=produce)
        started = time.monotonic()
        producer.start()
        summary = migration.run(
            follow=True, stop=lambda: done.is_set() and migration.counts.moved == 40
        )
        producer.join()
    # woken by each offer's message: far sooner than the 60 s safety interval
    assert summary.counts.moved == 40 and time.monotonic() - started < 30


def test_a_consumer_on_the_cluster_is_woken_by_the_move(
    cluster: EmbeddedCluster, cluster_client: RedisCluster, prefix: str
) -> None:
    """The migration announces on the queue's shard channel, as delayq's own offers do: a
    consumer asleep on the queue gets a moved task at once, not at its safety interval."""
    name = f"orders-{prefix}"
    url = cluster_url(cluster)
    got: list[object] = []
    with DelayQueue(name, url, prefix=prefix, safety_interval=60, create=True) as queue:
        queue.poll(timeout=0)  # subscribed
        consumer = threading.Thread(target=lambda: got.append(queue.poll(timeout=20)))
        consumer.start()
        time.sleep(0.5)  # the consumer is asleep in its wait, not in a look
        java = RedissonClient(cluster_client, name)
        java.offer(b"wake-up", 200)
        started = time.monotonic()
        with Migration(name, name, url, prefix=prefix) as migration:
            migration.run()
        consumer.join(30)
        took = time.monotonic() - started
    (task,) = got
    assert task is not None and task.payload == "wake-up"
    assert took < 5  # woken by the announcement (the safety interval is 60 s)
