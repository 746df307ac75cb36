"""A schedule's chain through failovers (issue #19): a Sentinel failover and a Redis Cluster
failover mid-chain. Graceful failovers (the replica is in sync), so nothing acknowledged is
lost: no time may fire twice, and every time from the first fire to the last is either fired
or, if it fell in the switchover, counted missed by the catch-up policy."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator

import pytest
from redis.cluster import key_slot

from delayq import DelayQueue

from ..conftest import BINARIES
from ..topology import ReplicatedCluster, SentinelGroup, running

pytestmark = [pytest.mark.topology, pytest.mark.timeout(180)]


def take(q: DelayQueue, seen: list[tuple[int, int]], count: int) -> None:
    goal, deadline = len(seen) + count, time.monotonic() + 60
    while len(seen) < goal:
        assert time.monotonic() < deadline, f"{len(seen)} fires of {goal} in 60 s"
        task = q.poll(timeout=1)
        if task is not None:
            assert task.fire_time is not None
            seen.append((round(task.fire_time.timestamp() * 1000), task.attempts))
            task.ack()


def check(q: DelayQueue, seen: list[tuple[int, int]]) -> None:
    first = Counter(ms for ms, attempts in seen if attempts == 1)
    assert all(n == 1 for n in first.values()), f"a time fired twice: {first}"
    info = q.schedules.get("beat")
    assert info is not None and info.last_fire is not None
    span = (round(info.last_fire.timestamp() * 1000) - min(first)) // 1000 + 1
    assert len(first) + info.missed >= span, "every time fired or was counted missed"


def chain_through(q: DelayQueue, failover: object) -> None:
    q.schedules.upsert("beat", "b", every=1, overlap="allow_all")
    seen: list[tuple[int, int]] = []
    take(q, seen, 3)
    failover()  # type: ignore[operator]
    take(q, seen, 4)
    check(q, seen)


@pytest.fixture(scope="module")
def group() -> Iterator[SentinelGroup]:
    with running(SentinelGroup(BINARIES[0][1])) as g:
        yield g


@pytest.fixture(scope="module")
def cluster() -> Iterator[ReplicatedCluster]:
    with running(ReplicatedCluster(BINARIES[0][1])) as c:
        yield c


def test_chain_goes_on_through_a_sentinel_failover(group: SentinelGroup, prefix: str) -> None:
    group.wait_replicas_synced(group.wait_settled())
    with DelayQueue("beat", group.url, prefix=prefix, reconnect_timeout=40) as q:
        chain_through(q, group.failover)


def test_chain_goes_on_through_a_cluster_failover(cluster: ReplicatedCluster, prefix: str) -> None:
    cluster.wait_healthy()
    name = "beat"
    master = cluster.master_of(key_slot(name.encode()))
    (replica,) = cluster.replicas_of(master)[:1]
    with DelayQueue(name, cluster.url, prefix=prefix, reconnect_timeout=25) as q:
        chain_through(q, lambda: cluster.failover(replica))
