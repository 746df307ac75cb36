"""Queues on a real Redis Cluster: every script touches one slot. (_async/test_cluster.py has
the tests of both front ends on every node.)"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from redis.cluster import RedisCluster, key_slot

from delayq import DelayQueue
from delayq.embedded import EmbeddedCluster
from tests.cluster_support import NAMES

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
