"""A 3-master Redis Cluster shared by the cluster tests of a session
(``pytest_plugins = ["tests.cluster_support"]``), and ways to look at it. Each test works
under its own key prefix, so they do not see each other's queues.

The test modules import the helpers below before pytest registers this module as a plugin,
so pytest cannot rewrite its asserts (there are none): PYTEST_DONT_REWRITE.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from delayq.embedded import EmbeddedCluster
from tests.conftest import BINARIES

NAMES = ["orders", "stock", "mail", "receipts", "reminders"]  # spread over several nodes


@pytest.fixture(scope="session")
def cluster() -> Iterator[EmbeddedCluster]:
    c = EmbeddedCluster(3, BINARIES[0][1]).start()
    yield c
    c.stop()


def cluster_url(cluster: EmbeddedCluster) -> str:
    return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in cluster.nodes[:2])


def shard_subscribers(cluster: EmbeddedCluster, channel: str) -> int:
    """Subscribers of a shard channel (SSUBSCRIBE), over every node."""
    total = 0
    for node in cluster.nodes:
        reply = redis.Redis(port=node.port).execute_command("PUBSUB", "SHARDNUMSUB", channel)
        total += int(reply[1])
    return total


def classic_subscribers(cluster: EmbeddedCluster, channel: str) -> int:
    """Subscribers of a classic channel (SUBSCRIBE), over every node."""
    return sum(
        int(redis.Redis(port=n.port).execute_command("PUBSUB", "NUMSUB", channel)[1])
        for n in cluster.nodes
    )
