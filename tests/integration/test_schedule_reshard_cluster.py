"""A reshard on a Redis Cluster carries schedules between shards on different nodes (each
side's step runs on its own slot); the series go on, no time twice."""

from __future__ import annotations

from collections import Counter

import redis
from redis.cluster import key_slot

from delayq import DelayQueue
from delayq._core import sharding
from delayq._sync.reshard import reshard
from delayq.embedded import EmbeddedCluster
from tests.cluster_support import cluster_url

from .test_schedule_reshard import finish_when_drained
from .test_schedules import fire_ms, take_fires

pytest_plugins = ["tests.cluster_support"]


def node_of(cluster: EmbeddedCluster, sub: str) -> int:
    """The port of the node that owns sub-queue ``sub``'s slot."""
    slot = key_slot(sub.encode())
    for node in cluster.nodes:
        for first, last, *_ in redis.Redis(port=node.port).execute_command("CLUSTER", "SLOTS"):
            if first <= slot <= last:
                return int(_[0][1])
    raise AssertionError(f"no node owns slot {slot}")


def test_schedules_move_between_nodes(cluster: EmbeddedCluster, prefix: str) -> None:
    url = cluster_url(cluster)
    names = [f"s{i}" for i in range(6)]
    with DelayQueue("beat", url, prefix=prefix, shards=2, visibility_timeout=5) as q:
        for name in names:
            q.schedules.upsert(name, name, every=1, overlap="allow_all")
        fires = take_fires(q, 12)
        assert reshard("beat", url, shards=3, prefix=prefix) == "3<2"
        before = sharding.shard_names("beat", 2)
        after = sharding.shard_names("beat", 3)
        crossed = [
            n for n in names
            if node_of(cluster, before[sharding.shard_of(n, 2)])
            != node_of(cluster, after[sharding.shard_of(n, 3)])
        ]  # fmt: skip
        assert crossed, "some schedule must change nodes for this test to mean anything"
        assert sorted(i.name for i in q.schedules.list()) == names
        fires += take_fires(q, 18)
        fires += finish_when_drained("beat", url, prefix, q)
        fires += take_fires(q, 12)
        for name in names:
            times = Counter(fire_ms(t) for t in fires if t.schedule == name)
            assert max(times.values()) == 1, f"{name} fired a time twice"
            info = q.schedules.get(name)
            assert info is not None and info.version == 1
            span = (max(times) - min(times)) // 1000 + 1
            assert len(times) + info.missed >= span, f"{name} lost a time"
