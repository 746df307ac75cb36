"""The soak's failover-observed window lasts until the Sentinel group is whole again (issue
#21). Before, it ended when the old master answered again, still a master in its own eyes:
Sentinel makes it a replica some 8-10 s later, and until then a ``Durability`` asking for
every replica cannot be met. The 2-hour run counted that wait as lateness outside any fault."""

from __future__ import annotations

from types import SimpleNamespace

from bench.soak.run import Harness, replication_whole

from ..conftest import BINARIES
from ..topology import SentinelGroup, running, wait_for


def test_a_group_is_whole_only_with_one_master_and_every_replica_online() -> None:
    with running(SentinelGroup(BINARIES[0][1])) as group:
        harness = SimpleNamespace(group=group)
        wait_for(lambda: Harness._group_whole(harness), 20, "the group to be whole")

        replica = group.replicas()[0]
        replica.command("REPLICAOF", "NO", "ONE")  # a second master, as a returning old one
        assert not Harness._group_whole(harness)

        replica.command("REPLICAOF", "127.0.0.1", str(group.master().port))
        wait_for(lambda: Harness._group_whole(harness), 20, "the replica to sync again")

        replica.pause()  # no answer: not whole
        try:
            assert not Harness._group_whole(harness)
        finally:
            replica.resume()
        wait_for(lambda: Harness._group_whole(harness), 20, "the paused replica to answer")


def test_a_master_must_count_every_replica_online() -> None:
    master = {"role": "master", "slave0": {"state": "online"}, "slave1": {"state": "wait_bgsave"}}
    replica = {"role": "slave", "master_link_status": "up"}
    assert not replication_whole([master, replica, replica])
    master["slave1"] = {"state": "online"}
    assert replication_whole([master, replica, replica])
    assert not replication_whole([master, replica, {**replica, "master_link_status": "down"}])
    assert not replication_whole([master, replica, None])
    assert not replication_whole([master, replica, {**master}])
