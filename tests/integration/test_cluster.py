"""Queues on a real Redis Cluster: every script touches one slot. (_async/test_cluster.py has
the tests of both front ends on every node.)"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from redis.cluster import RedisCluster, key_slot

from delayq import DelayQueue
from delayq.embedded import EmbeddedCluster
from tests.cluster_support import NAMES, cluster_url

pytest_plugins = ["tests.cluster_support"]


@pytest.fixture
def cluster_client(cluster: EmbeddedCluster) -> Iterator[RedisCluster]:
    client = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    yield client
    client.close()


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


def test_task_histories_on_every_node_and_on_a_sharded_queue(
    cluster: EmbeddedCluster, cluster_client: RedisCluster, prefix: str
) -> None:
    """[H] A task's history lives in its (sub-)queue's slot, so its scripts write it there."""
    for name in NAMES:
        with DelayQueue(name, cluster_url(cluster), prefix=prefix, history=60) as q:
            task_id = q.offer({"queue": name}, 0)
            task = q.poll(timeout=5)
            assert task is not None and task.id == task_id
            task.retry(0, error="ValueError: not yet")
            task = q.poll(timeout=5)
            assert task is not None
            task.ack()
            kinds = [e.kind for e in q.history(task_id)]
            assert kinds == ["offered", "delivered", "retried", "delivered", "acked"]
            slot = key_slot(q.keys.all[0].encode())
            assert key_slot(q.keys.history(task_id).encode()) == slot
            info = q.get(task_id)
            assert info is not None and info.state == "done"
    with DelayQueue("spread", cluster_url(cluster), prefix=prefix, shards=6, history=60) as q:
        ids = q.offer_many([(i, 0) for i in range(30)])
        handled = 0
        while handled < 30:
            batch = q.poll_many(30, timeout=5)
            assert batch, f"only {handled} came"
            for task in batch:
                task.ack()
            handled += len(batch)
        nodes = set()
        for task_id in ids:
            assert [e.kind for e in q.history(task_id)] == ["offered", "delivered", "acked"]
            keys = [s.keys.history(task_id) for s in q._routes().current]
            held = [k for k in keys if cluster_client.exists(k)]
            assert len(held) == 1
            nodes.add(cluster_client.get_node_from_key(held[0]).name)
        assert len(nodes) >= 2
        waiting = q.offer("left waiting", 600)
        assert q.disable_history()
        assert q.history(waiting) == [] and q.history_settings() is None
